"""Fault recovery's decisions as values (runtime/fault.py), without an engine: the bisection
(over suspects' positions) finds exactly the requests that fail alone, in about 2·log2(n) probes, and the guard gives up
only on a fault that nothing explained and that came back on the very next step.
(tests/chaos/test_fault_isolation.py runs the same recovery through a real engine.)"""

from __future__ import annotations

import math

import pytest

from graphc.runtime.fault import Bisection, StepGuard


class Req:
    """What the guard reads of a request: whether it finished."""

    def __init__(self, i: int):
        self.i, self.finished = i, False

    def __repr__(self):
        return f"Req({self.i})"


def run_bisection(n: int, poison: set[int]):
    """Probe as an engine would: a group fails while it holds a poison request."""
    b, probes, ended = Bisection(n), [], []
    while (group := b.next_group(set(ended))) is not None:
        probes.append(group)
        err = RuntimeError("boom") if any(i in poison for i in group) else None
        culprit = b.report(group, err)
        if culprit is not None:
            i, why = culprit
            assert why == "RuntimeError: boom"
            ended.append(i)  # the engine ends it
    return b, probes, ended


@pytest.mark.parametrize("n, poison", [(1, {0}), (2, {1}), (13, {2, 9}), (64, {0, 63}), (40, set()), (7, {0, 1, 2})])
def test_the_bisection_ends_exactly_the_requests_that_fail_alone(n, poison):
    b, probes, ended = run_bisection(n, poison)
    assert sorted(ended) == sorted(poison)
    assert [i for i, _ in b.culprits] == ended
    # every suspect is probed (cleared or found), and each poison costs about 2·log2(n) probes
    assert {i for p in probes for i in p} == set(range(n))
    assert len(probes) <= 2 + 2 * len(poison) * max(1, math.ceil(math.log2(n)))


def test_the_bisection_skips_requests_that_finished_meanwhile():
    b = Bisection(4)
    assert b.next_group(set()) == [0, 1]
    assert b.next_group({2, 3}) is None  # e.g. aborted while the first half was probed


def test_the_guard_records_the_step_and_gives_up_only_on_an_unexplained_repeat():
    g = StepGuard()
    a, b, c = Req(0), Req(1), Req(2)
    g.start()
    g.begin([(a, 5), (b, 3), (a, 2)], running=[c])
    assert g.in_step == [a, b, c]
    b.finished = True  # ended inside the failed step: its last delta still goes out
    rec = g.recovery(RuntimeError("x"), running=[c])
    assert rec.suspects == [a, c] and rec.finished == [b] and rec.give_up is None
    g.settled(rec)  # no probe failed: unexplained
    assert (g.recoveries, g.culprits) == (1, 0)
    again = g.recovery(ValueError("y"), running=[c])  # and the very next step failed too
    assert again.probes is None and again.give_up == "the engine step failed twice in a row: ValueError: y"
    g.settled(again)
    assert (g.recoveries, g.culprits) == (2, 2)
    # after giving up (or any step that passed) the next fault is bisected again
    assert g.recovery(RuntimeError("z"), running=[c]).probes is not None
    g.passed()
    assert g.recovery(RuntimeError("z"), running=[c]).probes is not None


def test_a_fault_whose_culprit_was_found_does_not_make_the_next_one_a_repeat():
    g = StepGuard()
    r = Req(0)
    g.begin([], running=[r])
    rec = g.recovery(RuntimeError("poison"), running=[r])
    group = rec.probes.next_group()
    assert rec.probes.report(group, RuntimeError("poison")) == (0, "RuntimeError: poison")
    assert rec.suspects[0] is r  # the engine ends the suspect at that position
    g.settled(rec)
    assert g.culprits == 1
    assert g.recovery(RuntimeError("new"), running=[Req(1)]).probes is not None
