"""Fault isolation for the engine step: one bad request never fails the others.

`Engine.step()` builds and runs one batch for many requests. If anything in it raises
(a sampler tensor built from a request's parameters, a grammar mask, a logits processor,
a prefix-cache write, the forward itself), the batch's working state can no longer be
trusted: caches may have advanced for some layers and not others, a pool write may have
been half done. So recovery does not patch the batch; it rebuilds it:

1. **Reset.** Every request that took part in the failed step is put back in the
   waiting queue the way a KV-budget preemption does it (its prompt plus the output
   so far is recomputed later), its working KV dropped *without* storing it in the
   prefix cache, its tree locks released; then the prefix cache is flushed of every
   entry no live request holds, so nothing a failed write touched can be hit later.
2. **Find the culprits by bisection.** The suspects run again, alone in the engine
   (the other waiting requests are set aside), in groups: a group that completes one
   prefill and one decode step is cleared (its KV goes to the prefix cache the normal
   way and it goes back to the queue); a group that fails again is reset and split in
   halves, down to single requests. A single request that fails is the culprit: it
   ends with finish_reason "error" and `error` saying what raised.
3. **Go on.** Cleared requests continue from where they were and produce exactly the
   tokens they would have produced alone (the same invariant as preemption by
   recompute): greedy rows, seeded rows, and unseeded sampled rows, whose noise seed
   (Request.noise_seed) stays with them.

A fault that no subset reproduces (transient, or only in one combination of rows)
clears every group; if the next step fails again with no step in between having
succeeded, the requests of that step are ended with "error" rather than retried
forever. (After a recovery that found its culprit, a failure of the next step is a new
fault — e.g. another poison request that just arrived — and is bisected in turn.) Cost: a fault costs a recompute of the suspects plus about 2·log2(n) small
steps; a step without a fault pays nothing.
"""

from __future__ import annotations

import collections
import logging

from .request import Request, RequestOutput

log = logging.getLogger("graphc.fault")

# Steps a probe group may take to produce its first decode token (prefill chunks of a long
# prompt + burst admission + one decode); a group that needs more is treated as cleared.
PROBE_STEP_LIMIT = 4096


class StepGuard:
    """Records who takes part in a step and recovers when it raises (Engine.step calls `start`,
    then `passed` or `recover`). Only recovery runs steps itself: its probes (`_probe`)."""

    def __init__(self, engine):
        self.engine = engine
        self.in_step: list[Request] = []  # requests the current step touches (set by begin())
        self.recoveries = 0  # faults recovered from (for /metrics)
        self.culprits = 0  # requests ended with "error" by a recovery
        self._failed_last = False  # the last fault had no culprit and no step succeeded since
        self._outs: list[RequestOutput] = []  # deltas produced by probe steps, returned by recover

    def begin(self, prefill: list) -> None:
        """Called by the step once it knows its work: the prefill chunks and the decode rows."""
        seen = dict.fromkeys(r for r, _ in prefill)
        seen.update(dict.fromkeys(self.engine.scheduler.running))
        self.in_step = list(seen)

    def start(self) -> None:
        """A step begins (Engine.step): nobody takes part yet."""
        self.in_step = []

    def passed(self) -> None:
        """The step went through: a failure of the next one is a new fault."""
        self._failed_last = False

    # -- recovery ---------------------------------------------------------------------
    def recover(self, exc: Exception) -> list[RequestOutput]:
        """The step raised `exc`: isolate the request(s) responsible (module docstring); the
        deltas of the requests that went on."""
        eng = self.engine
        suspects = [r for r in dict.fromkeys(self.in_step + list(eng.scheduler.running)) if not r.finished]
        finished_in_step = [r for r in self.in_step if r.finished]
        self.recoveries += 1
        eng.stats["step_faults"] = eng.stats.get("step_faults", 0) + 1
        log.warning("engine step failed (%s: %s); isolating the request(s) responsible among %d",
                    type(exc).__name__, exc, len(suspects), exc_info=log.isEnabledFor(logging.DEBUG))
        self._reset(suspects)
        if self._failed_last:  # nothing reproduced it alone last time and it failed again: stop retrying
            for r in suspects:
                self._fail(r, f"the engine step failed twice in a row: {type(exc).__name__}: {exc}")
            self._failed_last = False
        else:
            before = self.culprits
            self._bisect(suspects)
            # Unexplained (no probe failed): if the very next step fails too, stop retrying.
            # A culprit found means this fault is dealt with; a later one is a new fault.
            self._failed_last = self.culprits == before
        # The probes' own deltas first (their text was taken from the detokenizers), then what
        # is left: tokens appended before the failure, culprits' final deltas.
        outs, self._outs = self._outs, []
        touched = dict.fromkeys(finished_in_step + suspects)
        return outs + [eng._delta(r) for r in touched if r.finished or len(r.output_ids) > r.emitted_tokens]

    def _reset(self, reqs: list[Request]) -> None:
        """Drop the working state of `reqs` (and the whole decode batch) without caching it."""
        eng, sched, runner = self.engine, self.engine.scheduler, self.engine.runner
        gone = {id(r) for r in reqs}
        running_left = [r for r in sched.running if id(r) not in gone]
        for r in running_left:  # rows sharing the batch lose their KV too: recompute them as well
            reqs.append(r)
        runner.reset()
        front = []
        for r in reqs:
            if r.finished:
                continue
            sched.reset(r)  # out of the queues, back to waiting; its prefix-cache holds released
            runner.forget(r)  # its working KV, dropped without storing it
            front.append(r)
        sched.requeue_front(front)
        if eng.prefix is not None:
            eng.prefix.flush()  # a write that failed half way may have left slots unwritten

    def _bisect(self, suspects: list[Request]) -> None:
        # The whole set just failed: start from its halves (a single suspect is probed alone).
        half = len(suspects) // 2
        groups = collections.deque([suspects[:half], suspects[half:]] if half else [suspects])
        while groups:
            g = [r for r in groups.popleft() if not r.finished]
            if not g:
                continue
            err = self._probe(g)
            if err is None:
                continue
            if len(g) == 1:
                self._fail(g[0], f"{type(err).__name__}: {err}")
                continue
            half = len(g) // 2
            groups.extendleft([g[half:], g[:half]])  # depth first: the failing half is found soon

    def _probe(self, group: list[Request]) -> Exception | None:
        """Run `group` alone until each member has one more decode token (or finished).
        Returns the exception if it failed (the group is reset), None if it went through
        (its members are preempted back into the queue, their KV stored in the prefix cache)."""
        eng, sched = self.engine, self.engine.scheduler
        target = {id(r): len(r.output_ids) + 2 for r in group}  # the prefill token and one decode token
        err = None
        with sched.alone(group):
            try:
                for _ in range(PROBE_STEP_LIMIT):
                    if all(r.finished or len(r.output_ids) >= target[id(r)] for r in group):
                        break
                    self._outs += eng._step()
            except Exception as e:  # noqa: BLE001 - the fault reproduced in this group
                err = e
            if err is not None:
                self._reset(list(group))
            else:
                cleared = list(sched.running)
                for r in cleared:
                    eng._preempt(r)  # KV into the prefix cache; back to the queue to be rejoined
                eng.stats["preemptions"] -= len(cleared)  # not budget preemptions
        return err

    def _fail(self, req: Request, why: str) -> None:
        log.warning("request %s failed in the engine step and was ended alone: %s", req.id, why)
        self.culprits += 1
        self.engine.fail(req, why)
