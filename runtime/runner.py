"""The model runner: the only part of the runtime that touches arrays.

It owns the decode batch (one layer cache per layer, rows left-padded) and the
chain: while step N runs on the device, step N+1 is already built on N's lazy
tokens and queued, so host bookkeeping hides behind device work. Rows that
finish or join between steps do not break the chain: the next step's input is
a lazy gather of the previous step's tokens (plus host-known first tokens of
joined rows).
"""

from __future__ import annotations

import time

import mlx.core as mx

from graphc.compiler.compile import CompiledGraph
from graphc.compiler.lower import StepInputs
from graphc.compiler.ops import HOST_EDITS

from . import chunk_pad, kv_usage
from . import host_read as host_reads
from .batch_rows import BatchRows, may_vacate
from .batch_sampling import SamplerCache
from .batched_prefill import BatchedPrefill
from .decode_input import Launch, next_input
from .mixed_step import MixedSteps
from .prompt_chunk import ChunkPrep, PrefillDone, PromptChunks
from .prefill_rate import attention_pairs
from .request import Request, Status
from .scheduler import Scheduler


class ModelRunner:
    def __init__(self, compiled: CompiledGraph, *, chain: bool = True, host_edits=None, prefix_io=None,
                 views=None, speculator=None, prefill_rate=None,
                 vocab_size: int | None = None, eos_token_ids=(), sampling_kernel: bool = False,
                 host_read: str = "tokens"):
        if host_read not in host_reads.STRATEGIES:
            raise ValueError(f"host_read must be one of {host_reads.STRATEGIES}, got {host_read!r}")
        self.compiled = compiled
        # What runs is read from the lowered plans: which edits the sampler tensors carry,
        # whether host edits are computed, whether decode steps may chain.
        plan = compiled.decode.plan
        self.sampler = SamplerCache(vocab_size or int(compiled.binding.config["vocab_size"]), eos_token_ids,
                                    edits=plan.edits, kernel=sampling_kernel)
        self.host_edit_kinds = tuple(e for e in (plan.edits or ()) if e in HOST_EDITS)
        # The prefix cache's array side (runtime/prefix_io.py), or None: restores admitted
        # hits, captures state at prefix boundaries, writes KV into the pools.
        self.prefix_io = prefix_io
        # host_edits(rows, logits) -> additive [B, V] row or None: grammar masks and Python
        # logits processors, for rows that are not chain-safe (runtime/host_edits.py: HostEdits).
        self.host_edits = host_edits
        self.policies = compiled.binding.policies
        # A graph whose plan is not chain-safe (a policy with chain_safe=False) never chains.
        self.chain = chain and plan.chain_safe
        self.host_read = host_read  # how the host reads a decode step's tokens
        # The decode batch: its rows (requests, some left vacant by ones that ended) and their layer
        # caches (runtime/batch_rows.py).
        vacant = plan.choice("vacant rows")
        self.batch = BatchRows(vacant.choice if vacant is not None else "quarter")
        self.pending: Launch | None = None
        # Prompts prefilled but not in the decode batch yet: (requests, their caches as rows). They
        # join at the next run_decode, after the engine's postprocess saw their first tokens (a
        # grammar row's next mask needs its first token consumed; rows that ended stay out).
        self.joining: list[tuple[list[Request], list]] = []
        self.steps = 0
        # Speculative decoding (runtime/speculative/): the Engine's Speculator, or None; it runs
        # verify steps instead of plain decode steps for batches it takes.
        self.speculator = speculator
        # KernelViews (runtime/kernel_views.py), or None: eager decode steps over left-padded rows
        # take the ragged attention kernel where the plan chose it.
        self.views = views
        # How a prompt's last chunk runs (whole or split) and whether it is padded to a multiple of
        # the chunk alignment: the prefill plan's choices, obeyed (runtime/chunk_pad.py).
        self.final_chunk = chunk_pad.FinalChunk.of(compiled.prefill.plan, Scheduler.CHUNK_ALIGN)
        # Whole prompts in left-padded forwards, several at once in the prefill plan's lanes
        # (runtime/batched_prefill.py).
        lanes = int(compiled.prefill.plan.choice("prefill lanes").choice)
        self.batched = BatchedPrefill(compiled.prefill, self.sampler, self.final_chunk, prefix_io, self.policies,
                                      self._edits, lanes)
        # One request's chunk as a forward of its own (runtime/prompt_chunk.py).
        self.chunks = PromptChunks(compiled.prefill, self.sampler, self.final_chunk, prefix_io, self._edits)
        # The engine's PrefillRate (runtime/prefill_rate.py), or None: every prefill forward below
        # ends in an mx.eval, so its wall time is what computing those prompt tokens costs here.
        self.prefill_rate = prefill_rate
        # Mixed steps (runtime/mixed_step.py), or None: a step's prompt chunk rides its decode launch
        # where the decode plan chose it. What such a chunk did is reported after the decode
        # (`take_late`): its tokens computed once launched, a final chunk's first token once read
        # with its launch's tokens (with the chain on, in the next step).
        self.mixed = MixedSteps.of(compiled, self.sampler, self.final_chunk, prefix_io)
        self.late: list[PrefillDone] = []

    # -- one step's work, as the scheduler decided it (runtime/scheduler.py) ----------------------
    def run_prefill(self, groups: list) -> list[PrefillDone]:
        """Run the step's prefill groups (Schedule.groups: (request, n_tokens) chunks; a group of
        several is whole prompts in one left-padded forward). One PrefillDone per chunk, in order."""
        out = []
        if groups:
            self._busy()
        todo = list(groups)
        while todo:
            group = todo.pop(0)
            t0 = time.perf_counter()
            if len(group) > 1 or self.batched.in_lane(group):
                # Groups of whole prompts, side by side in the prefill lanes while they may be.
                wave = [group]
                while todo and len(wave) < self.batched.lanes and self.batched.in_lane(group) and \
                        self.batched.in_lane(todo[0]):
                    wave.append(todo.pop(0))
                done = self.prefill_batches([[r for r, _ in g] for g in wave])
                chunks = [c for g in wave for c in g]
                self.timed(sum(n for _, n in chunks), t0, sum(attention_pairs(n, r.prefilled) for r, n in chunks))
                for g, (firsts, caches) in zip(wave, done):
                    out += [PrefillDone(r, n, len(r.context_ids), tok, lp) for (r, n), (tok, lp) in zip(g, firsts)]
                    self.joining.append(([r for r, _ in g], caches))
                continue
            [(req, n)] = group
            prep = self.prepare_chunk(req, n)
            if self.mixed is not None and self.mixed.takes(prep, self.rows, self.caches):
                self.mixed.waiting = prep  # it rides this step's decode launch (run_decode)
                continue
            tok = self.run_chunk(prep)
            self.timed(prep.end - req.prefilled, t0, attention_pairs(prep.end - req.prefilled, req.prefilled))
            out.append(self._chunk_done(prep, tok, req.pending_logprobs if tok is not None else None))
        return out

    def _chunk_done(self, prep: ChunkPrep, tok: int | None, logprobs, n: int | None = None) -> PrefillDone:
        req = prep.req
        if tok is not None:
            self.joining.append(([req], req.caches))
            req.caches = None
        return PrefillDone(req, prep.n if n is None else n, prep.end, tok, logprobs)

    def _read_rider(self, rider) -> None:
        """A launched final chunk's first token (its tokens were reported at launch: n=0 here)."""
        got = self.mixed.read(rider)
        if got is not None:  # None: its request left meanwhile
            self.late.append(self._chunk_done(rider.prep, *got, n=0))

    def take_late(self) -> list[PrefillDone]:
        """What prompt chunks riding decode launches did this step (runtime/mixed_step.py): those
        launched, and final chunks whose first token was read (PrefillDone says how each counts)."""
        late, self.late = self.late, []
        return late

    def timed(self, tokens: int, t0: float, pairs: float) -> None:
        if self.prefill_rate is not None:
            self.prefill_rate.observe(tokens, time.perf_counter() - t0, pairs)

    def run_decode(self, batch) -> list[tuple[Request, int, dict | None]]:
        """The step's decode half (scheduler.DecodeBatch): prefilled rows that did not end on their
        first token join, preempted rows leave (their KV to the prefix cache), then one decode
        step if the batch says so. Returns (request, token, logprobs) per row of the step that
        completed."""
        # The prefilled groups join the batch together, every layer's parts in one extend_all (one
        # copy of the running rows' KV and of each new row, not one per group). A step that does
        # not decode (a burst still admitting) keeps them waiting: the burst's rows join once, at
        # its last step, instead of the batch being copied at every step of it.
        live = [[i for i, r in enumerate(reqs) if r.status is Status.RUNNING]  # not ended, not preempted
                for reqs, _ in self.joining]
        if batch.decode or not any(live):
            new_reqs, parts = [], []
            for (reqs, caches), rows in zip(self.joining, live):
                if rows and len(rows) < len(reqs):
                    for c in caches:
                        c.filter(rows)
                if rows:
                    parts.append(caches)
                    new_reqs += [reqs[i] for i in rows]
            if new_reqs:
                self._join_rows(new_reqs, parts)
            self.joining = []
        if batch.preempt:
            self.leave(batch.preempt)
        out = self.decode() if batch.decode else []
        if self.mixed is not None and self.mixed.waiting is not None:
            # No plain decode launch took the step's prompt chunk (a burst still admitting, a
            # speculative verify step): it runs as its own forward now.
            prep, self.mixed.waiting = self.mixed.waiting, None
            tok = self.run_chunk(prep)
            self.late.append(self._chunk_done(prep, tok, prep.req.pending_logprobs if tok is not None else None))
        if self.mixed is not None:  # riders whose launch no decode step will read
            for rider in self.mixed.stranded(self.pending):
                self._read_rider(rider)
        return out

    @property
    def rows(self) -> list[Request]:
        """The decode batch's requests in row order, rows left vacant included (runtime/batch_rows.py)."""
        return self.batch.rows

    @property
    def caches(self) -> list | None:
        return self.batch.caches

    def reset(self) -> None:
        """Drop the whole decode batch, the chain and the prompts waiting to join, without storing
        anything (fault recovery: none of it can be trusted)."""
        self.batch.clear()
        self.pending, self.joining, self.late = None, [], []
        if self.mixed is not None:
            self.mixed.drop()
        if self.speculator is not None:
            self.speculator.drop()

    def forget(self, req: Request) -> None:
        """Drop `req`'s working KV without storing it; a request recomputed from the start (no
        output yet) recomputes its prompt logprobs too."""
        req.caches = None
        if not req.output_ids:
            req.prompt_logprobs = None

    # -- prefill ----------------------------------------------------------------
    def new_caches(self) -> list:
        return [p.new_cache() for p in self.policies]

    def prefill_chunk(self, req: Request, max_tokens: int) -> int | None:
        """Run up to `max_tokens` more prompt tokens of `req` (a batch of one); its first generated
        token once the whole prompt is in the cache (runtime/prompt_chunk.py)."""
        return self.run_chunk(self.prepare_chunk(req, max_tokens))

    def prepare_chunk(self, req: Request, max_tokens: int) -> ChunkPrep:
        """The request's caches (its admitted prefix restored) and its next chunk, ready to run."""
        if req.caches is None:
            req.caches = self.new_caches()
            if self.prefix_io is not None:
                self.prefix_io.restore(req)  # the cached prefix the scheduler admitted
        return self.chunks.prepare(req, max_tokens)

    def run_chunk(self, prep: ChunkPrep) -> int | None:
        """A prepared chunk as a forward of its own (tests count these); its first token, if it ends
        the prompt."""
        req, res = prep.req, self.chunks.run(prep)
        if res.prompt_logprobs is not None:
            if req.prompt_logprobs is None:
                req.prompt_logprobs = [None] * (prep.start + 1)  # the first token has no logprob
            req.prompt_logprobs.extend(res.prompt_logprobs)
        if res.first_logprobs is not None:
            req.pending_logprobs = res.first_logprobs
        return res.token

    def _edits(self, rows, ctx, step):
        """Host edit rows for `rows`, filled while the device runs the forward already queued."""
        if self.host_edits is None or not self.host_edit_kinds or all(r.params.chain_safe for r in rows):
            return None
        logits = ctx.values[step.logits_node]
        mx.async_eval(logits)
        return self.host_edits(rows, logits)

    # -- decode batch membership ------------------------------------------------------
    def _join_rows(self, reqs: list[Request], parts: list[list]) -> None:
        """Append `reqs` to the batch; `parts` are their layer caches, one list per prefilled group."""
        self._busy()
        if self.speculator is not None:
            self.speculator.settle(self.caches)  # a pipelined verify assumed the old rows
        self.batch.join(reqs, parts)

    # -- batched prefill ------------------------------------------------------------------
    @property
    def can_batch_prefill(self) -> bool:
        """Several whole prompts in one left-padded forward: for graphs whose every layer keeps
        FullKV rows (full / pool_backed) and whose prefix cache needs no boundary captures."""
        return self.batched.possible

    def prefill_batches(self, groups: list[list[Request]]) -> list[tuple[list, list]]:
        """Prefill each group's whole contexts (none with cached tokens) in one forward, rows
        left-padded, and sample each one's first token; the groups side by side in the plan's
        prefill lanes (runtime/batched_prefill.py). Per group: ((token, logprobs) per request,
        its layer caches as rows), the caches that join the decode batch in run_decode."""
        return self.batched.run(groups)

    @property
    def padded_tokens(self) -> int:
        """Pad positions computed (for stats and tests)."""
        return self.chunks.padded + self.batched.padded_tokens

    def leave(self, reqs: list[Request]) -> None:
        """Drop finished, aborted or preempted requests: their working KV (mid-prefill), and their
        rows of the decode batch, whose KV goes to the prefix cache first. Prompts waiting to join
        that ended are left out when the rest join (run_decode)."""
        for r in reqs:
            r.caches = None
        if self.mixed is not None:
            self.mixed.leave(reqs)
        gone = {id(r) for r in reqs} - self.batch.vacant
        left = [i for i, r in enumerate(self.rows) if id(r) in gone]
        if not left:
            return
        self._busy()
        if self.speculator is not None:
            self.speculator.settle(self.caches)  # before the rows' KV is stored or filtered
        if self.prefix_io is not None:  # their prompt + output KV into the prefix cache first
            self.prefix_io.store_rows([self.rows[i] for i in left], left, self.caches)
        speculates = self.speculator.config_for if self.speculator is not None else (lambda params: False)
        self.batch.leave(left, vacate=all(may_vacate(self.rows[i], speculates) for i in left))
        if not self.rows:
            self.pending = None  # a final chunk riding it is read at the step's end (run_decode)

    # -- decode -------------------------------------------------------------------
    def _launch(self) -> Launch:
        if self.batch.drops_at_growth() and self.batch.grows_next():
            # This step's write widens the buffers (a copy of every row): the vacant rows go in
            # that copy (runtime/batch_rows.py).
            self._busy()
            if self.speculator is not None:
                self.speculator.settle(self.caches)
            self.batch.drop_vacant()
        step = self.compiled.decode
        toks, sampling = next_input(self.sampler, self.rows, self.pending)
        inputs = StepInputs(toks, self.caches, sampling=sampling)
        if self.views is not None:  # left-padded rows on an eager step: attention in the kernel
            inputs.caches = self.views.for_decode(step, inputs)
        rider = None
        if self.mixed is not None and self.mixed.waiting is not None:  # this step's prompt chunk rides
            self._busy()
            self.chunks.padded += self.mixed.waiting.pad
            ctx, rider = self.mixed.forward(step, inputs)
            # Its tokens are computed once launched: the scheduler records that now, so it never
            # schedules the request again while a final chunk's first token is unread.
            self.late.append(PrefillDone(rider.prep.req, rider.prep.n, rider.prep.end))
        else:
            ctx = step.forward(inputs)
        out = step.head(ctx, self._edits(self.rows, ctx, step))
        nxt = sampling.advanced(out.next_tokens) if sampling is not None else None
        host = host_reads.for_host(out.next_tokens, self.host_read)
        launch = Launch(list(self.rows), out.next_tokens, out.logprobs, sampling, nxt, host,
                        rider if rider is not None and rider.out is not None else None)
        mx.async_eval(launch.tokens, *host, *([out.logprobs.chosen] if out.logprobs is not None else []),
                      *(self.mixed.targets(rider) if rider is not None else []))
        self.steps += 1
        return launch

    def decode(self) -> list[tuple[Request, int, dict | None]]:
        """One decode step for the batch; returns (request, token, logprobs) for the step that completed.

        With chaining on, the step after it is queued before this returns.
        """
        if not self.rows:
            return []
        # Measured gates time decode cycles (call to call): the speculator's (plain / verify /
        # pipelined) and compile="measured"'s (compiled / eager); runtime/measured_gate.py.
        spec, cg = self.speculator, getattr(self.compiled.decode, "gate", None)
        if spec is not None:
            spec.begin_cycle()
        if cg is not None:
            cg.begin()
        out, verified = self._decode(spec)
        if spec is not None:
            spec.end_cycle(out, verified)
        if cg is not None:
            cg.tokens(len(out))
            if verified:  # a verify step says nothing about the plain step's compile
                cg.dirty()
        return out

    def _busy(self) -> None:
        """This decode cycle also prefilled or changed the batch: no gate times it."""
        if self.speculator is not None:
            self.speculator.busy()
        cg = getattr(self.compiled.decode, "gate", None)
        if cg is not None:
            cg.dirty()

    def _decode(self, spec) -> tuple[list[tuple[Request, int, dict | None]], bool]:
        """The step's (request, token, logprobs) list, and whether a verify step made it."""
        if spec is not None and self.pending is None:
            verified = spec.step_batch(self.rows, self.caches)  # several tokens per row, or None
            if verified is not None:
                if any(verified.trims):  # the rollback: each row's caches keep the accepted sequence
                    for c in self.caches:
                        c.trim_rows(verified.trims)
                self.steps += 1
                live = {id(r) for r in self.batch.live()}
                return [e for e in verified.emitted if id(e[0]) in live], True
        cur = self.pending if self.pending is not None else self._launch()
        # Speculative rows need the host between steps (variable acceptance): no chain into them.
        chain = (self.chain and all(r.params.chain_safe for r in self.rows)
                 and not (spec is not None and spec.wants(self.rows)))
        self.pending = cur
        self.pending = self._launch() if chain else None
        toks = host_reads.read(cur.host)
        if cur.rider is not None:  # computed with cur's tokens; the next launch is queued already
            self._read_rider(cur.rider)
        lps = cur.logprobs.to_lists(cur.sampling.st) if cur.logprobs is not None else [None] * len(toks)
        live = {id(r) for r in self.batch.live()}
        return [(r, t, lp) for r, t, lp in zip(cur.rows, toks, lps) if id(r) in live], False

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches) if self.caches else 0

    @property
    def kv_live_bytes(self) -> int:
        """Of kv_bytes, the bytes holding the rows' own tokens (runtime/kv_usage.py)."""
        return kv_usage.usage(self.caches)["live"]
