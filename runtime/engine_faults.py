"""The Engine's side of fault recovery: it applies the `Recovery` its StepGuard answers.

runtime/fault.py decides over plain values (who to reset, which groups to probe, who the
culprit is) and holds no engine; these methods of the Engine (a mixin, like engine_views.py)
do the work with the engine's own scheduler, runner and prefix cache, and run the probes'
steps as the engine's own `_step`.
"""

from __future__ import annotations

import logging

from .fault import PROBE_STEP_LIMIT, Recovery
from .request import Request, RequestOutput

log = logging.getLogger("graphc.fault")


class FaultRecovery:
    """Mixin of Engine: `_recover` is what `Engine.step` returns when its step raised."""

    def _recover(self, exc: Exception) -> list[RequestOutput]:
        """Isolate the request(s) responsible for `exc` (runtime/fault.py); the deltas of the
        requests that went on, and the final ones of those that ended."""
        rec: Recovery = self.faults.recovery(exc, self.scheduler.running)
        self.stats["step_faults"] = self.stats.get("step_faults", 0) + 1
        self._reset_rows(list(rec.suspects))
        outs: list[RequestOutput] = []  # the probes' own deltas (their text was taken from the detokenizers)
        if rec.give_up is not None:
            for r in rec.suspects:
                self._end_culprit(r, rec.give_up)
        else:
            sus = rec.suspects  # the bisection's groups are positions in this list
            while (group := rec.probes.next_group({i for i, r in enumerate(sus) if r.finished})) is not None:
                err, probed = self._probe([sus[i] for i in group])
                outs += probed
                culprit = rec.probes.report(group, err)
                if culprit is not None:
                    i, why = culprit
                    self._end_culprit(sus[i], why)
        self.faults.settled(rec)
        # Then what is left: tokens appended before the failure, culprits' final deltas.
        touched = dict.fromkeys(rec.finished + rec.suspects)
        return outs + [self._delta(r) for r in touched if r.finished or len(r.output_ids) > r.emitted_tokens]

    def _reset_rows(self, reqs: list[Request]) -> None:
        """Drop the working state of `reqs` (and the whole decode batch) without caching it."""
        gone = {id(r) for r in reqs}
        # Rows sharing the batch lose their KV too, and prompts whose first token rode the dropped
        # chain (runner.reset forgets it): recompute them as well.
        reqs += [r for r in self.scheduler.running + self.scheduler.in_flight() if id(r) not in gone]
        self.runner.reset()
        front = []
        for r in reqs:
            if r.finished:
                continue
            self.scheduler.reset(r)  # out of the queues, back to waiting; its prefix-cache holds released
            self.runner.forget(r)  # its working KV, dropped without storing it
            front.append(r)
        self.scheduler.requeue_front(front)
        if self.prefix is not None:
            self.prefix.flush()  # a write that failed half way may have left slots unwritten

    def _probe(self, group: list[Request]) -> tuple[Exception | None, list[RequestOutput]]:
        """Run `group` alone until each member has one more decode token (or finished). The
        exception if it failed again (the group is reset), None if it went through (its members
        go back to the queue, their KV into the prefix cache); and the deltas its steps made."""
        target = {id(r): len(r.output_ids) + 2 for r in group}  # the prefill token and one decode token
        err, outs = None, []
        with self.scheduler.alone(group):
            try:
                for _ in range(PROBE_STEP_LIMIT):
                    if all(r.finished or len(r.output_ids) >= target[id(r)] for r in group):
                        break
                    outs += self._step()
            except Exception as e:  # noqa: BLE001 - the fault reproduced in this group
                err = e
            if err is not None:
                self._reset_rows(list(group))
            else:
                for r in list(self.scheduler.running):  # cleared: rejoined with the others later
                    self.scheduler.preempt(r)  # not a budget preemption: stats["preemptions"] stays
                    self.runner.leave([r])  # stores its KV in the prefix cache on the way out
        return err, outs

    def _end_culprit(self, req: Request, why: str) -> None:
        log.warning("request %s failed in the engine step and was ended alone: %s", req.id, why)
        self.fail(req, why)
