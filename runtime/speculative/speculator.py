"""The runner's speculative side: who drafts this step, the verify forward, rollback, stats.

One verify step, for a batch whose rows are all plain greedy (no sampler, no host edits) and
fewer than `max_batch`:

1. each opted-in row drafts up to k tokens on the host (prompt lookup over its prompt + output);
2. the batch runs ONE forward over [last token, drafts..., padding] per row through the decode
   plan's `verify` node (compiler/ops/speculative.py), which returns the target's greedy token
   at every position and the accepted draft prefix per row;
3. each row emits its accepted drafts plus the target's next token (>= 1 token per step) and
   its cache drops the rest (`FullKV.trim_rows`), so the caches — and what the prefix cache
   stores when the row leaves — hold exactly the accepted sequence.

The runner hands a verify step its batch as values (`step_batch(rows, caches)`) and gets
values back (verify.Verified: the emitted tokens, and per row how many positions its caches
drop); it applies the rollback and counts the step itself. The speculator never holds the
runner. The caches it is handed are the ones the verify forward writes, so positions of a
pipelined guess it throws away before its next forward it trims there itself (`settle`).

Pipelined verify (`pipeline`, opt-in: `spec_pipeline=True`): a verify step needs the host between
steps (how many drafts were accepted decides the next input), so unchained it costs the host's
graph build *and* the device's run. Right after queuing verify N, the runner builds verify
N + 1 on N's lazy outputs, assuming every row accepts all its drafts: its first input is N's
lazy bonus token (the target after the last draft), its drafts are the continuation the
drafter proposes after N's drafts (proposed k + 1 long: the first stands for the bonus, which is
not known yet, the rest are N + 1's drafts), and its cache writes follow N's untrimmed
positions — exactly the caches a full acceptance leaves. If N did accept everything, N + 1 is
already on the device and becomes the next step; otherwise it is discarded (its positions
trimmed with N's rejected ones) and the next step drafts afresh. Rows joining or leaving
discard it first (`settle`). Either way the caches hold exactly the accepted sequence.

Greedy output is therefore the target's own argmax sequence, identical to decoding without
speculation. Rows with sampling / penalties / logprobs / grammar are not speculated on: a batch
holding one decodes normally that step (see docs/speculative.md).

Off automatically: batches of `max_batch` rows or more, and batches whose rows x (k + 1)
would pass `max_tokens` verify positions (each row's k shrinks to fit first): past that the
forward is compute-bound and verifying extra positions costs more than it saves; steps where no row found a
draft (a row that finds none 4 times in a row stops looking for 16 tokens, so its plain steps
chain again), and rows whose drafts keep being rejected (acceptance under `min_acceptance` over the
last few steps pauses that row's drafting for `cooldown` tokens). A row's k adapts: it grows
back toward num_draft_tokens while whole drafts are accepted and halves when none is — where a
longer draft costs more (`shrink_k`: on the CPU, whose verify is compute-bound, and for a draft
model, whose every draft token is a step); prompt lookup on a GPU keeps k at its most.
"""

from __future__ import annotations

import logging
import time
import weakref

import mlx.core as mx

from graphc.compiler.lower import StepInputs

from ..batch_sampling import needs_sampler
from ..measured_gate import ArmGate
from .config import OFF, SpecConfig, parse_speculative
from .defaults import default_adaptive, default_max_tokens, default_pipeline
from .prompt_lookup import NgramIndex
from .rows import RowState
from .verify import AssumedRow, QueuedVerify, Verified

log = logging.getLogger("graphc.speculative")

_UNSEEN = object()
_RowState = RowState  # the name tests build row states by
STAT_KEYS = ("spec_steps", "spec_drafted_tokens", "spec_accepted_tokens", "spec_emitted_tokens",
             "spec_pipelined_steps", "spec_pipeline_discards")


class Speculator:
    WINDOW = 8  # verify steps per acceptance check
    MAX_MISSES, MISS_PAUSE = 4, 16  # prompt lookup: 4 steps without a match pause drafting for 16 tokens

    def __init__(self, step, *, default: SpecConfig | None = None, max_batch: int = 16,
                 max_tokens: int | None = None, problem: str | None = None, stats: dict | None = None,
                 min_acceptance: float = 0.15, cooldown: int = 32, pipeline: bool | None = None,
                 shrink_k: bool | None = None,
                 adaptive: bool | None = None, views=None, eos_token_ids=(), draft_model=None):
        # `step`: the decode LoweredStep whose plan holds the verify node (the eager one, not
        # the compiled-decode wrapper: a verify batch has k + 1 positions per row).
        self.step = getattr(step, "step", step)
        # The compiled decode path (runtime/compiled_decode.py), when the engine compiles decode:
        # verify forwards then run traced too (padded to a few lengths, see _launch).
        self.compiled = step if step is not self.step and getattr(step, "verify_node", None) is not None else None
        # Pad a verify's positions up to 2, 3, 5, 9 or 17 (within the budget): a traced verify
        # retraces per L otherwise; see _launch.
        self.pad_positions = self.compiled is not None
        self.node = self.step.outputs.get("verify")
        # Eager verify forwards: layers the ragged attention kernel serves run through it (CUDA
        # only, once it matched MLX here; runtime/kernel_views.py, the Engine's); None: MLX's attention.
        self.views = views
        self.problem = problem
        if self.node is None and problem is None:
            self.problem = (f"graph '{self.step.plan.graph}' declares no verify node (add `op: verify` reading the "
                            "decoder and tokens, and a `verify` output: docs/speculative.md)")
        self.default = default if self.problem is None else None
        self.max_batch = max_batch
        # Positions one verify forward may hold (rows x (k + 1)): a row's k shrinks to fit, and a
        # batch where no row fits 2 positions decodes plainly.
        self.max_tokens = max_tokens if max_tokens is not None else default_max_tokens()
        self.min_acceptance = min_acceptance
        # Halve a prompt-lookup row's k after a draft the target rejected outright? Only where a
        # longer draft costs more. On a GPU a verify over 17 positions costs about what one over
        # 9 does (host-bound), and a k halved after one bad match keeps the next copied stretch's
        # drafts short for many steps: replaying the grounded bench's answers, keeping k at 16
        # took 40 verify steps for 384 tokens against 54 when halving
        # (benchmarks/probes/draft_policy.py). A draft model always shrinks (each draft is a step).
        self.shrink_k = (mx.default_device() != mx.gpu) if shrink_k is None else shrink_k
        self.cooldown = cooldown
        self.pipeline = default_pipeline() if pipeline is None else bool(pipeline)
        # Plain, verify or pipelined per batch-size bucket, by measured tokens/s
        # (runtime/measured_gate.py); None: verify whenever a row drafted (pipelined when `pipeline`).
        self.gate = ArmGate() if (default_adaptive() if adaptive is None else adaptive) else None
        self._inflight: QueuedVerify | None = None  # a pipelined verify, built assuming full acceptance
        # Host seconds spent in verify steps, by part (the bench reports them per verify step):
        # draft (the drafter), build (graph + async_eval), wait (until the result is on the
        # host), post (trims, emitted tokens, per-row learning).
        self.timing = dict.fromkeys(("draft", "build", "wait", "post"), 0.0)
        self.eos_token_ids: set = set(eos_token_ids)  # the Engine's: a row whose drafts hold one may end, so no guess after it
        self.stats = stats if stats is not None else {}
        for k in STAT_KEYS:
            self.stats.setdefault(k, 0)
        self._rows: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # drafter(request, k) -> up to k draft tokens; None: prompt lookup over the row's own
        # prompt + output. Any drafter is safe: the verify step accepts only what the target agrees with.
        self.drafter = None
        # A DraftModel (runtime/speculative/draft_model.py) for rows whose method is "draft_model".
        self.draft_model = draft_model

    # -- who speculates ------------------------------------------------------------
    def config_for(self, params) -> SpecConfig | None:
        asked = parse_speculative(params.speculative, params.num_draft_tokens)
        if asked == OFF:
            return None
        if asked is None:
            asked = self.default
        if asked is None or self.problem is not None:
            return None
        if asked.method == "draft_model" and self.draft_model is None:
            return None
        return asked

    def request_problem(self, params) -> str | None:
        """Why a request that asks for speculation cannot have it (a 400), or None."""
        asked = parse_speculative(params.speculative, params.num_draft_tokens)
        if asked is None or asked == OFF:
            return None
        if self.problem is not None:
            return f"speculative decoding is off for this model: {self.problem}"
        if asked.method == "draft_model" and self.draft_model is None:
            return ("speculative method 'draft_model' needs a draft model: load the engine with "
                    "Engine.load(..., draft_model=DIR) or run graphc serve --draft-model DIR")
        return None

    def _state(self, req) -> RowState | None:
        st = self._rows.get(req, _UNSEEN)
        if st is _UNSEEN:  # resolved once per request (None: it does not speculate)
            cfg = self.config_for(req.params)
            st = None if cfg is None else RowState(cfg, NgramIndex(cfg.max_ngram, cfg.min_ngram),
                                                   cfg.num_draft_tokens)
            self._rows[req] = st
        return st

    def possible(self, rows) -> bool:
        """Whether this batch may verify at all (the static rules: docs/speculative.md)."""
        if self.problem is not None or not rows or len(rows) >= self.max_batch or self._k_cap(rows) < 1:
            return False
        if not any((s := self._state(r)) is not None and len(r.output_ids) >= s.paused_until for r in rows):
            return False
        return not any(needs_sampler(r.params) or not r.params.chain_safe for r in rows)

    @property
    def arms(self) -> tuple:
        return ("plain", "verify", "pipelined") if self.pipeline else ("plain", "verify")

    def wants(self, rows) -> bool:
        """True when the next step may verify drafts: the runner then does not chain into it."""
        if not self.possible(rows):
            return False
        return self.gate is None or self.gate.decide(len(rows), self.arms) != "plain"

    # -- the runner's cycle, for the gate ------------------------------------------------
    def begin_cycle(self) -> None:
        if self.gate is not None:
            self.gate.begin()

    def end_cycle(self, out: list, verified: bool) -> None:
        """`out`: the cycle's (request, token, logprobs) list; `verified`: a verify step made it.
        The gate is credited with the batch's rows times its *slowest* row's tokens: speculation
        must not make any request slower, and a row that accepts nothing gets one token from a
        verify step that costs more than a plain one (runtime/measured_gate.py). A plain step
        gives every row one token, so it needs no count."""
        g = self.gate
        if g is None or not out or not g.measuring:
            return
        if not verified:
            g.tokens(len(out))
            return
        per: dict = {}
        for r, _, _ in out:
            per[id(r)] = per.get(id(r), 0) + 1
        g.tokens(len(per) * min(per.values()))

    def busy(self) -> None:
        """The runner did other work this cycle (a prefill): the gate does not time it."""
        if self.gate is not None:
            self.gate.dirty()

    def _k_cap(self, rows) -> int:
        return self.max_tokens // len(rows) - 1

    def _draft(self, req, k_cap: int) -> list[int]:
        st = self._state(req)
        if st is None or len(req.output_ids) < st.paused_until:
            return []
        # Never draft past max_tokens: the last step's bonus token is the request's last.
        room = req.params.max_tokens - len(req.output_ids) - 1
        k = min(st.k, room, k_cap)
        if k <= 0:
            return []
        if self.drafter is not None:
            return [int(t) for t in self.drafter(req, k)][:k]
        if st.cfg.method == "draft_model":
            return self.draft_model(req, k)
        d = st.index.draft(req.prompt_ids + req.output_ids, k)
        # A row whose context keeps offering no match stops asking for a while, so its plain
        # steps chain again (an unchained step costs host time on the GPU).
        st.misses = 0 if d else st.misses + 1
        if st.misses >= self.MAX_MISSES:
            st.misses, st.paused_until = 0, len(req.output_ids) + self.MISS_PAUSE
        return d

    # -- the verify step -------------------------------------------------------------
    def step_batch(self, rows: list, caches: list) -> Verified | None:
        """Run one verify step for the decode batch (`rows`, their layer `caches`), or None when no
        row drafted (decode normally). The verify forward writes its positions into `caches`, as
        any decode forward does; what the rows keep of them is the runner's to apply
        (`Verified.trims`), with the emitted tokens."""
        cur, self._inflight = self._inflight, None
        if cur is not None and [id(r) for r in cur.rows] != [id(r) for r in rows]:
            self._discard(caches, cur)  # settle() was not called on a membership change: be safe
            cur = None
        if cur is None:
            if not self.possible(rows):
                return None
            if self.gate is not None and self.gate.current(len(rows), self.arms) == "plain":
                return None
            t0 = time.perf_counter()
            k_cap = self._k_cap(rows)
            drafts = [self._draft(r, k_cap) for r in rows]
            self.timing["draft"] += time.perf_counter() - t0
            if not any(drafts):
                # A plain step: not a sample of the verify arm. The gate weighs verifying the
                # drafts rows have; steps with none (a stretch of new text) are plain whichever
                # arm runs, and counting them drove the batch-1 gate to plain exactly where the
                # drafts were good (H200, batch 1: gated 1.22x against ungated 1.86x plain).
                self.busy()
                return None
            L = 1 + max(map(len, drafts))
            first = mx.array([[r.last_token] for r in rows], dtype=mx.int32)
            cur = self._launch(caches, rows, drafts, L, first)
        else:
            self.stats["spec_pipelined_steps"] += 1
        if self.gate is None:
            pipe = self.pipeline
        else:  # the next cycle's arm; a pipelined one is queued now
            pipe = self.possible(rows) and self.gate.decide(len(rows), self.arms) == "pipelined"
        nxt = self._pipelined(caches, cur) if pipe else None
        t0 = time.perf_counter()
        targets, accepted = cur.targets.tolist(), cur.accepted.tolist()
        t1 = time.perf_counter()
        self.timing["wait"] += t1 - t0
        if nxt is not None and any(a != len(d) for a, d in zip(accepted, cur.drafts)):
            # The guess was built on drafts the target rejected: drop it with them.
            self.stats["spec_pipeline_discards"] += 1
            trims = [nxt.L + cur.held - a for a in accepted]
            nxt = None
        else:
            # Keep [last token, accepted drafts] in the caches; the target's next token is not in
            # them yet (it is the next step's input), exactly as after a plain decode step.
            trims = [cur.held - a for a in accepted]
        self._inflight = nxt
        self.stats["spec_steps"] += 1
        emitted = []
        for r, d, t, a in zip(rows, cur.drafts, targets, accepted):
            emitted += [(r, tok, None) for tok in t[: a + 1]]
            if d:
                self._learn(r, len(d), a)
        self.stats["spec_emitted_tokens"] += len(emitted)
        self.timing["post"] += time.perf_counter() - t1
        return Verified(emitted, trims)

    def _launch(self, caches: list, rows, drafts, L, first) -> QueuedVerify:
        """Queue one verify forward: `first` [B, 1] (host or lazy) is each row's input token."""
        t0 = time.perf_counter()
        lengths = [len(d) for d in drafts]
        res = None
        if self.pad_positions:
            # Traced once per (rows, L, capacity): L is padded up to 2, 3, 5, 9 or 17 positions
            # (within the verify budget) so a row's adapting k does not retrace every step.
            Lp = 2 + (1 << (L - 2).bit_length()) - 1 if L > 2 else L
            L = Lp if Lp * len(rows) <= self.max_tokens else L
        pad = [d + [0] * (L - 1 - len(d)) for d in drafts]
        toks = mx.concatenate([first, mx.array(pad, dtype=mx.int32)], axis=1) if L > 1 else first
        if self.compiled is not None:
            res = self.compiled.verify(toks, lengths, caches)
        if res is None:
            seen = self.views(caches) if self.views is not None else caches
            out = self.step.forward(StepInputs(toks, seen, all_positions=True,
                                               options={"draft_lengths": lengths})).values[self.node]
            res = out.targets, out.accepted
        mx.async_eval(*res)
        self.timing["build"] += time.perf_counter() - t0
        return QueuedVerify(list(rows), drafts, L, *res)

    def _pipelined(self, caches: list, cur: QueuedVerify) -> QueuedVerify | None:
        """Verify N + 1, queued behind `cur` on the assumption that every row accepts all of its
        drafts (module docstring), or None when that cannot hold or no row has a guess."""
        rows = cur.rows
        D = len(cur.drafts[0])
        if any(len(d) != D for d in cur.drafts):
            return None  # full acceptance would leave the rows at different lengths
        k_cap = self._k_cap(rows)
        drafts = []
        for r, d in zip(rows, cur.drafts):
            st = self._rows.get(r)
            stops = set(r.params.stop_token_ids or ()) | (set() if r.params.ignore_eos else self.eos_token_ids)
            if st is None or st.cfg.method == "draft_model" or stops.intersection(d):  # the row may end here
                drafts.append([])
                continue
            n_out = len(r.output_ids) + D + 1  # after this step: its drafts and the bonus token
            k = min(st.k, r.params.max_tokens - n_out - 1, k_cap)
            drafts.append(self._guess(r, st, d, k) if k > 0 else [])
        if not any(drafts):
            return None
        if cur.held > D:  # padding after the drafts (a compiled verify's fixed L): out of the caches first
            for c in caches:
                c.trim_rows([cur.held - D] * len(rows))
            cur.held = D
        L = 1 + max(map(len, drafts))
        return self._launch(caches, rows, drafts, L, cur.targets[:, D:D + 1])

    def _guess(self, req, st: RowState, assumed: list[int], k: int) -> list[int]:
        """Up to k drafts for the step after a verify still in flight: the drafter continues the
        row as if `assumed` were accepted; its first proposal stands for the bonus token."""
        if self.drafter is not None:
            view = AssumedRow(req.id, req.prompt_ids, req.output_ids + assumed, req.params)
            out = [int(t) for t in self.drafter(view, k + 1)][: k + 1]
        else:
            ctx = req.prompt_ids + req.output_ids
            out = st.index.draft(ctx + assumed, k + 1, known=len(ctx))
        return out[1:]

    def _discard(self, caches: list | None, v: QueuedVerify) -> None:
        self.stats["spec_pipeline_discards"] += 1
        if caches is not None:
            for c in caches:
                c.trim_rows([v.L] * c.batch)

    def settle(self, caches: list | None) -> None:
        """Before the batch's rows change (join, leave, preempt): drop a pipelined verify, and
        its positions from the batch's `caches`, so they hold exactly the accepted sequence again."""
        v, self._inflight = self._inflight, None
        if v is not None:
            self._discard(caches, v)
        self.busy()

    def drop(self) -> None:
        """Forget a pipelined verify without touching caches (the runner dropped its batch)."""
        self._inflight = None

    def _learn(self, req, drafted: int, accepted: int) -> None:
        st = self._rows.get(req)
        self.stats["spec_drafted_tokens"] += drafted
        self.stats["spec_accepted_tokens"] += accepted
        if st is None:
            return
        if st.learn(drafted, accepted, shrink=self.shrink_k, window=self.WINDOW, min_acceptance=self.min_acceptance):
            st.pause(len(req.output_ids) + self.cooldown)
            log.debug("request %s: drafting paused for %d tokens (under %.0f%% of its drafts accepted)",
                      req.id, self.cooldown, 100 * self.min_acceptance)
