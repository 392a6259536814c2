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
fault — e.g. another poison request that just arrived — and is bisected in turn.) Cost: a
fault costs a recompute of the suspects plus about 2·log2(n) small steps; a step without a
fault pays nothing.

Who does what: this module decides, over plain values, and holds no engine. `StepGuard`
is told who takes part in each step and, when one raises, answers with a `Recovery` (who
to reset, whom to end, the `Bisection` that names each group to probe and, from each
probe's outcome, the next group or the culprit). The engine applies it with its own
scheduler and runner (runtime/engine_faults.py) and hands the value back (`settled`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging

from .request import Request

log = logging.getLogger("graphc.fault")

# Steps a probe group may take to produce its first decode token (prefill chunks of a long
# prompt + burst admission + one decode); a group that needs more is treated as cleared.
PROBE_STEP_LIMIT = 4096


class Bisection:
    """The groups of suspects to probe alone: the halves of the set that failed, and the halves
    of every group that fails again, depth first (a failing half is found soon), down to
    single requests; a single request that fails is a culprit.

    Over plain values: a suspect is its position in the list of `n` suspects (Recovery.suspects),
    and what happened to the requests meanwhile is passed in (`next_group(finished)`); the
    engine holds the requests and maps positions to them (runtime/engine_faults.py)."""

    def __init__(self, n: int):
        # The whole set just failed: start from its halves (a single suspect is probed alone).
        half = n // 2
        self._groups = collections.deque([list(range(half)), list(range(half, n))] if half else [list(range(n))])
        self.culprits: list[tuple[int, str]] = []  # (suspect, what raised), in the order found

    def next_group(self, finished=frozenset()) -> list[int] | None:
        """The next group to probe, less the suspects in `finished` (ended meanwhile: aborted, or
        done in an earlier probe); None when none is left."""
        while self._groups:
            group = [i for i in self._groups.popleft() if i not in finished]
            if group:
                return group
        return None

    def report(self, group: list[int], err: Exception | None) -> tuple[int, str] | None:
        """The probe of `group` ended: `err` is what it raised again, None when it went through.
        (suspect, why) when `group` is one suspect that failed: the culprit, to be ended."""
        if err is None:
            return None
        if len(group) == 1:
            self.culprits.append((group[0], f"{type(err).__name__}: {err}"))
            return self.culprits[-1]
        half = len(group) // 2
        self._groups.extendleft([group[half:], group[:half]])
        return None


@dataclasses.dataclass
class Recovery:
    """What a step that raised calls for: `StepGuard.recovery`'s answer, applied by the engine."""

    suspects: list[Request]  # reset: KV dropped uncached, back at the front of the queue
    finished: list[Request]  # ended inside the failed step: their final deltas still go out
    give_up: str | None  # set: end every suspect with this error and probe nothing
    probes: Bisection | None  # otherwise: the groups to probe alone (positions in `suspects`)


class StepGuard:
    """Records who takes part in a step and decides what a step that raised calls for.
    Engine.step calls `start`, then `passed` or (through the engine's recovery) `recovery`
    and, once that is applied, `settled`."""

    def __init__(self):
        self.in_step: list[Request] = []  # requests the current step touches (set by begin())
        self.recoveries = 0  # faults recovered from (for /metrics)
        self.culprits = 0  # requests ended with "error" by a recovery
        self._failed_last = False  # the last fault had no culprit and no step succeeded since

    def start(self) -> None:
        """A step begins (Engine.step): nobody takes part yet."""
        self.in_step = []

    def begin(self, prefill: list, running: list[Request]) -> None:
        """The step knows its work: its prefill chunks ((request, tokens) pairs) and the decode rows."""
        seen = dict.fromkeys(r for r, _ in prefill)
        seen.update(dict.fromkeys(running))
        self.in_step = list(seen)

    def passed(self) -> None:
        """The step went through: a failure of the next one is a new fault."""
        self._failed_last = False

    def recovery(self, exc: Exception, running: list[Request]) -> Recovery:
        """The step raised `exc` with `running` in the decode batch: what to reset, and whether to
        bisect for the culprit(s) or, failing twice in a row unexplained, end them all."""
        suspects = [r for r in dict.fromkeys(self.in_step + list(running)) if not r.finished]
        finished = [r for r in self.in_step if r.finished]
        self.recoveries += 1
        log.warning("engine step failed (%s: %s); isolating the request(s) responsible among %d",
                    type(exc).__name__, exc, len(suspects), exc_info=log.isEnabledFor(logging.DEBUG))
        if self._failed_last:  # nothing reproduced it alone last time and it failed again: stop retrying
            why = f"the engine step failed twice in a row: {type(exc).__name__}: {exc}"
            return Recovery(suspects, finished, give_up=why, probes=None)
        return Recovery(suspects, finished, give_up=None, probes=Bisection(len(suspects)))

    def settled(self, rec: Recovery) -> None:
        """`rec` was applied: count the requests it ended. A bisection that found no culprit
        leaves the fault unexplained, so if the very next step fails too, it gives up; a
        culprit found means this fault is dealt with, and a later one is a new fault."""
        if rec.probes is None:
            self.culprits += len(rec.suspects)
            self._failed_last = False
        else:
            self.culprits += len(rec.probes.culprits)
            self._failed_last = not rec.probes.culprits
