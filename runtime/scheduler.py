"""The scheduler: plain Python state (queues, counters); it decides, the runner does.

Each engine step: spend up to `prefill_chunk` prompt tokens on waiting requests (chunked), or
a bounded budget while rows are decoding (`step_tokens`: a fixed count, or "auto", the default:
the measured time-aware budget of runtime/scheduler_costs.py), so a long prompt never stalls the
running streams for more than one bounded step; then run one decode step for every running request.

It owns admission: matching a waiting request against the prefix cache (the radix tree's
bookkeeping, runtime/prefix_cache.py — like nano-vllm's scheduler owns its block manager),
the KV budget and preemption, prefill grouping, and the request fields that say where a
request is (see the ownership table in runtime/request.py): status, finish_reason,
finish_time, prefilled, cached_tokens, n_resumed, preemptions, scheduled_time. Other modules change them
through its methods (advance, started, preempt, reset, finish).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque

import attrs

from .prefill_groups import group_prefill
from .request import Request, Status
from .scheduler_costs import StepCosts


# Prompt tokens a step may spend while rows decode (Engine(step_tokens=), `graphc serve
# --step-tokens N` for a fixed N): every running stream waits for the step's prefill before its
# next token. "auto" (the default): measured per step, at least the device's floor, more where a
# step's fixed cost dominates its prompt work (docs/scheduling.md).
STEP_TOKENS = "auto"
# The floor: 256 on the CPU (its sweep's choice). On CUDA a prompt forward's launches cost about a
# decode step whatever its length up to ~1k tokens, and the fit could not see the per-token cost
# under that noise, so "auto" sat at 256; the H200 sweep (1B shape, 64 requests at once) gave at
# 1024 half the TTFT p50 and p99 of the 256 it chose, for the same wall time and ITL p99.
STEP_TOKENS_FLOOR = 256
STEP_TOKENS_FLOORS = {"cuda": 1024}


def step_tokens_floor(device: str) -> int:
    """The "auto" budget's floor on `device` (runtime/target.py's Target.device)."""
    return STEP_TOKENS_FLOORS.get(device, STEP_TOKENS_FLOOR)


# A burst (Scheduler.schedule): prompts that reach an idle engine are admitted before anything
# decodes, (BURST_TOKENS in all, BURST_STEP_TOKENS a step). The CPU's 2,048 / 2,048: there a
# prompt token costs the same in a burst as between decode steps, and a longer burst only delays
# its first rows' second token. On CUDA a prompt forward costs its launches more than its tokens
# (a 2,048-token forward of the 1B Llama shape took ~7 ms on the H200, a 64-row decode step as
# much), so prompts admitted between decode steps cost a forward each on top of the step: 64
# requests arriving at once waited ~4.8 s in the queue (docs/serving-bench.md). There the burst
# takes every prompt that fits the free rows, up to 65,536 tokens, 8,192 a step.
BURST_SIZES = {"cuda": (65536, 8192)}


def burst_sizes(device: str) -> tuple[int, int]:
    """(BURST_TOKENS, BURST_STEP_TOKENS) on `device` (runtime/target.py's Target.device)."""
    return BURST_SIZES.get(device, (Scheduler.BURST_TOKENS, Scheduler.BURST_STEP_TOKENS))


@attrs.define
class Schedule:
    prefill: list  # (request, n_tokens) chunks to run this step, in order
    decode: bool = True  # False while a burst is still being admitted (see Scheduler.schedule)
    # `prefill` as forwards: a group of several chunks is whole prompts with nothing cached, run
    # as one left-padded forward; every other chunk is a group of its own.
    groups: list = attrs.field(factory=list)
    cached_tokens: int = 0  # prompt tokens newly admitted from the prefix cache this step


@attrs.define
class DecodeBatch:
    """The step's decode work, decided once its prefill is postprocessed: rows to preempt (back to
    the queue, their KV leaves the batch) and whether the running rows decode one step."""

    preempt: list = attrs.field(factory=list)
    decode: bool = True


class Scheduler:
    def __init__(self, *, max_batch: int = 64, prefill_chunk: int = 512, prefix=None,
                 kv_budget: int | None = None, batch_prefill: bool = False, step_tokens: int | str | None = None,
                 step_tokens_floor: int = STEP_TOKENS_FLOOR, burst: tuple[int, int] | None = None,
                 lanes: int = 1, hit_align: int = 0):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        if step_tokens is not None and step_tokens != "auto" and (
                isinstance(step_tokens, bool) or not isinstance(step_tokens, int) or step_tokens < 1):
            raise ValueError(f"step_tokens must be an int >= 1, 'auto' or None, got {step_tokens!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        # Prompt tokens one step may spend while rows are decoding (None: prefill_chunk). Every
        # running stream waits for the step's prefill before its next token, so this bounds the
        # stall a long prompt causes; an idle engine still prefills prefill_chunk per step.
        self.step_tokens = step_tokens
        self.step_tokens_floor = step_tokens_floor  # "auto" never spends less (step_tokens_floor())
        # "auto": the step costs measured from the intervals between schedule() calls (see
        # _clock); _last is the step in flight: [start time, prompt tokens, rows decoded].
        self.costs = StepCosts()
        self._last: list | None = None
        # The prefix cache's bookkeeping (runtime/prefix_cache.py: PrefixCache) or None. A waiting
        # request is matched against it before its first chunk is sized; it waits a step instead
        # when requests scheduled ahead of it share a longer prefix than the cache holds (they
        # store it this step, so it hits next step).
        self.prefix = prefix
        # KV tokens the working caches of running and prefilling requests may hold together
        # (None: unbounded). Admission waits for room; schedule_decode preempts when decode outgrows it.
        self.kv_budget = kv_budget
        # Whole short prompts may share one left-padded prefill forward (the engine says so when
        # the graph's caches allow it and batching is on).
        self.batch_prefill = batch_prefill
        # Batched prefill forwards the runner runs at once (the prefill plan's lanes): whole prompts
        # are split into at least this many groups where there are as many.
        self.lanes = lanes
        # Prefix hits are cut to a multiple of this (0: as matched) where the runner pads prompts'
        # last chunks to it, so a restored prompt's chunks keep aligned shapes (PrefixCache.admit).
        self.hit_align = hit_align
        self._burst_left = 0  # prompt tokens the current burst may still admit before decoding
        if burst is not None:  # the device's burst sizes (burst_sizes()); the class's otherwise
            self.BURST_TOKENS, self.BURST_STEP_TOKENS = burst
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.by_id: dict[str, Request] = {}

    def add(self, req: Request) -> None:
        if req.id in self.by_id:
            raise ValueError(f"request id '{req.id}' is already in use")
        if not self.has_work:
            self._last = None  # the engine sat idle since its last step: that gap is no step's cost
        self.waiting.append(req)
        self.by_id[req.id] = req

    # A *burst* starts when requests arrive at an idle engine: its prompts are admitted in steps of
    # BURST_STEP_TOKENS (batched where they are whole), and decoding waits until the burst is in,
    # at most BURST_TOKENS (or one prefill_chunk) of prompt, so its rows decode together from equal
    # starting points. The burst's rows are streams already (each step hands out first tokens), so
    # on the CPU the burst is one step: every step after it decodes. At 8,192 tokens (four steps)
    # the first rows' second token waited for three more full prefill steps, and the burst's last
    # step could overrun it; benchmarks/step_timeline.py showed both (docs/scheduling.md). On CUDA
    # the burst is longer (BURST_SIZES above: there its steps cost far less than the forwards
    # they save).
    BURST_TOKENS = 2048
    BURST_STEP_TOKENS = 2048
    # A piece of a prompt (not its end) ends on a multiple of CHUNK_ALIGN tokens, so the chunk
    # forwards' attention shapes (query length, key length) come from a small set. On CUDA every
    # new shape builds a cuDNN attention plan (~40 ms on an H200, cached per exact shape): a step
    # budget split between prompts at arbitrary offsets built one per step, and a 256-token chunk
    # step cost ~80 ms instead of ~5 ms (benchmarks/probes/chunk_cost.py, docs/scheduling.md).
    CHUNK_ALIGN = 128

    # "auto": a step may take STEP_TIME_FACTOR x its fixed cost (the decode forward plus a prefill
    # forward's own overhead) once rows decode; runtime/scheduler_costs.py says why.
    STEP_TIME_FACTOR = 2.0

    def _clock(self) -> float:
        """Time the step that just ended (from its schedule() to this one) into the cost model."""
        now = time.perf_counter()
        if self._last is not None:
            start, tokens, decoded = self._last
            self.costs.observe(now - start, tokens, decoded)
        return now

    def schedule(self) -> Schedule:
        now = self._clock()
        flying = self.in_flight()
        if not self.running and not flying and self.waiting and self._burst_left <= 0:
            self._burst_left = max(self.BURST_TOKENS, self.prefill_chunk)
        bursting = self._burst_left > 0
        if bursting:  # a step of the burst, never past what the burst has left
            budget = step_budget = min(max(self.prefill_chunk, self.BURST_STEP_TOKENS), self._burst_left)
        else:  # (asked only with prompts waiting: "auto" counts its probe steps among those)
            budget = step_budget = self.step_budget() if self.waiting else 0
        chunks = []
        slots = self.max_batch - len(self.running) - len(flying)  # those join once their token is read
        align = self.CHUNK_ALIGN if min(step_budget, self.prefill_chunk) >= self.CHUNK_ALIGN else 1
        cached = 0
        for req in self.waiting:
            if budget <= 0 or slots <= 0:
                break
            if self._in_flight(req):
                continue
            if self.prefix is not None and req.status is Status.WAITING and not self.prefix.admitted(req):
                if self.prefix.should_wait(req, [r for r, _ in chunks], self.hit_align):
                    break
                req.prefilled = req.cached_tokens = self.prefix.admit(req, self._min_hit(req, chunks), self.hit_align)
                cached += req.cached_tokens
            if req.prefilled == req.cached_tokens and not self.fits(req, chunks):
                break  # no room for its KV yet: it waits (and nothing overtakes it)
            left = len(req.context_ids) - req.prefilled
            if (bursting and chunks and budget < left <= min(self.prefill_chunk, step_budget)
                    and self._burst_left - step_budget >= left):
                # A prompt that fits whole in the next burst step goes first there instead of being
                # split here: its tail would run as forwards of one row each (8 prompts of 384
                # tokens: 5 batched + 128 + 256 alone + 2 batched, against 5 + 3 batched), when the
                # burst has a next step for it.
                break
            n = min(budget, self.prefill_chunk, left)
            if n < left and (req.prefilled + n) % align:
                aligned = n - (req.prefilled + n) % align
                if aligned <= 0 and chunks:
                    break  # too little budget left to reach an aligned end: it goes first next step
                n = aligned if aligned > 0 else n
            chunks.append((req, n))
            if req.scheduled_time is None:
                req.scheduled_time = now
            budget -= n
            if req.prefilled + n == len(req.context_ids):
                slots -= 1
            elif not bursting:
                # A request mid-prompt goes first next step too (FIFO, no starvation). A burst step
                # goes on admitting after it (it still goes first next step): a long prompt's
                # first chunk would otherwise end a burst step after one prefill_chunk.
                break
        if bursting:
            self._burst_left -= step_budget  # a whole step of the burst, even one that stopped short above
            # The burst is in when a step finds nothing more to admit (or its tokens are spent):
            # not when a step took every prompt waiting, since requests sent together reach the
            # engine over a while (a server tokenizes and hands them over one by one) and those
            # that come during a burst step belong to the burst. Ending it at the first step that
            # emptied the queue left the rest to the decode steps' prompt budget, one step budget
            # a step (docs/scheduling.md). The step that finds nothing decodes.
            if not chunks:
                self._burst_left = 0
        self._last = [now, sum(n for _, n in chunks), False]
        return Schedule(chunks, decode=self._burst_left <= 0, groups=self.group_prefill(chunks), cached_tokens=cached)

    @staticmethod
    def _in_flight(req: Request) -> bool:
        return req.status is Status.PREFILLING and req.prefilled >= len(req.context_ids)

    def in_flight(self) -> list[Request]:
        """Waiting requests whose whole prompt is computed but whose first token is not read yet: a
        final chunk that rode a decode launch (runtime/mixed_step.py) is read with that launch's
        tokens, in the next step when decode steps chain. They are not scheduled again, they count
        as rows (they join once `started`), and a fault resets them with the step's rows."""
        return [r for r in self.waiting if self._in_flight(r)]

    def step_budget(self) -> int:
        """Prompt tokens this step may spend outside a burst: step_tokens while rows decode (for
        "auto", the measured budget: runtime/scheduler_costs.py)."""
        if not self.running and not self.in_flight() or self.step_tokens is None:
            return self.prefill_chunk
        if self.step_tokens == "auto":
            n = self.costs.budget(self.step_tokens_floor, self.prefill_chunk, self.STEP_TIME_FACTOR)
            # whole CHUNK_ALIGN units: a measured budget that moves by a few tokens each step would
            # give every step's chunk a new length (a new attention shape, see CHUNK_ALIGN)
            return n - n % self.CHUNK_ALIGN if n >= self.CHUNK_ALIGN else n
        return min(self.prefill_chunk, self.step_tokens)

    def schedule_decode(self, decode: bool = True) -> DecodeBatch:
        """The decode half of a step, after its prefill is postprocessed: preempt the newest running
        requests if the next decode step would overflow the KV budget (they go back to the queue,
        their KV to the prefix cache), then decode the rest (unless a burst is still admitting)."""
        preempt = self.over_budget()
        for req in preempt:
            self.preempt(req)
        out = DecodeBatch(preempt, decode=decode and bool(self.running))
        if self._last is not None:
            self._last[2] = out.decode
        return out

    # -- request state transitions (the only writers of these Request fields) ----------------------
    def advance(self, req: Request, end: int) -> None:
        """Prompt positions [0, end) of `req` are in its cache now (a chunk ran)."""
        req.prefilled = end
        if req.status is Status.WAITING:
            req.status = Status.PREFILLING

    # A prefix hit shorter than this is declined when the request can join a batched prefill
    # instead: restoring it would run the rest of the prompt as a forward of its own, while
    # recomputing a few cached tokens inside the batch costs almost nothing. Bursts of prompts
    # that share only a chat template's header or a BOS token stay batched (the same 32 tokens
    # as the prefix cache's MIN_GAIN for waiting on a sibling's prefill).
    SHORT_HIT = 32

    def _min_hit(self, req, chunks: list) -> int:
        """The shortest prefix hit worth taking for `req` this step (see SHORT_HIT)."""
        alone = not chunks and len(self.waiting) < 2
        if alone or not self.batch_prefill or len(req.context_ids) > self.prefill_chunk:
            return 1  # nothing to batch with, or it could not join a batched forward anyway
        return self.SHORT_HIT

    def group_prefill(self, chunks: list) -> list[list]:
        """The step's chunks as forwards (runtime/prefill_groups.py)."""
        return group_prefill(chunks, batch_prefill=self.batch_prefill, chunk=self.prefill_chunk, lanes=self.lanes)

    # -- KV budget ------------------------------------------------------------------
    HEADROOM = 16  # decode tokens a newly admitted request must have room for

    def kv_tokens(self) -> int:
        """KV tokens held by running requests (plus one in flight each) and started prefills."""
        held = sum(r.num_tokens + 1 for r in self.running)
        return held + sum(r.prefilled for r in self.waiting if r.prefilled > r.cached_tokens)

    def fits(self, req: Request, scheduled=()) -> bool:
        if self.kv_budget is None:
            return True
        extra = sum(len(r.context_ids) + self.HEADROOM for r, _ in scheduled if r.prefilled == r.cached_tokens)
        need = len(req.context_ids) + self.HEADROOM
        idle = not self.running and not extra and not any(self._in_flight(r) for r in self.waiting)
        return idle or self.kv_tokens() + extra + need <= self.kv_budget

    def at_kv_limit(self, req: Request) -> bool:
        """A request whose next token would not fit the budget even alone ends here ("length"):
        preempting others cannot make room for it, and the budget is a hard cap."""
        return self.kv_budget is not None and req.num_tokens + 2 > self.kv_budget

    def over_budget(self) -> list[Request]:
        """Running requests to preempt (newest first) so the next decode step fits the budget."""
        if self.kv_budget is None or len(self.running) <= 1:
            return []
        out, total = [], self.kv_tokens() + len(self.running)
        for req in reversed(self.running):
            if total <= self.kv_budget or len(out) == len(self.running) - 1:
                break
            out.append(req)
            total -= req.num_tokens + 2
        return out

    def preempt(self, req: Request) -> None:
        """Back to the front of the queue; its output so far is recomputed as context (through the
        prefix cache, where the runner stores its KV as it leaves the batch)."""
        self.running.remove(req)
        self._requeue(req)
        req.preemptions += 1
        self.waiting.appendleft(req)

    preempted = preempt  # the old name

    def reset(self, req: Request) -> None:
        """Out of the queues, back to the state of a request about to be recomputed from its prompt
        and output so far (fault recovery, runtime/fault.py; it puts it back in the queue)."""
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self._requeue(req)

    def requeue_front(self, reqs: list[Request]) -> None:
        """Put requests that were `reset` back at the front of the queue, in this order (fault
        recovery recomputes them before anything that was waiting)."""
        self.waiting.extendleft(reversed(reqs))

    @contextlib.contextmanager
    def alone(self, group: list[Request]):
        """Inside the block only `group`'s waiting requests are scheduled, from a fresh start (no
        burst in progress): fault recovery probes a group apart from the queue (runtime/fault.py).
        After it the others wait again behind whatever the block left waiting, and the burst that
        was in progress goes on."""
        mine = {id(r) for r in group}
        others = [r for r in self.waiting if id(r) not in mine]
        self.waiting = deque(r for r in self.waiting if id(r) in mine)
        burst, self._burst_left = self._burst_left, 0
        try:
            yield
        finally:
            self.waiting.extend(others)
            self._burst_left = burst

    def _requeue(self, req: Request) -> None:
        if self.prefix is not None:
            self.prefix.release(req)  # its tree lock and pins: it is matched again when readmitted
        req.status = Status.WAITING
        req.n_resumed = len(req.output_ids)
        req.prefilled = req.cached_tokens = 0

    def started(self, req: Request) -> None:
        """The request's prompt is in the cache and it joined the decode batch."""
        self.waiting.remove(req)
        req.status = Status.RUNNING
        self.running.append(req)

    def finish(self, req: Request, reason: str) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        if self.prefix is not None:
            self.prefix.release(req)  # every tree reference and pin it held, at any stage
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self.by_id.pop(req.id, None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
