"""Scheduler.alone / requeue_front: what fault recovery (runtime/fault.py) asks of the scheduler
instead of replacing its queue and writing its burst counter."""

from __future__ import annotations

from graphc.runtime.params import SamplingParams
from graphc.runtime.request import Request
from graphc.runtime.scheduler import Scheduler


def _reqs(n, length=4):
    return [Request(list(range(1, length + 1)), SamplingParams(max_tokens=4)) for _ in range(n)]


def test_alone_schedules_only_the_group_and_puts_the_others_back_behind_it():
    sched = Scheduler(max_batch=8, prefill_chunk=64)
    a, b, c, d = _reqs(4)
    for r in (a, b, c, d):
        sched.add(r)
    with sched.alone([b, d]):
        assert [r for r, _ in sched.schedule().prefill] == [b, d]
        sched.started(b)  # b went on to decode; d still waits
    assert list(sched.waiting) == [d, a, c] and sched.running == [b]


def test_alone_starts_from_no_burst_and_the_burst_in_progress_goes_on():
    """A probe inside a burst starts its own (its group is admitted alone, then decodes); after
    it the scheduler goes on exactly as if the probe had not run."""
    def scheduler():
        sched = Scheduler(max_batch=8, prefill_chunk=8)
        sched.BURST_TOKENS, sched.BURST_STEP_TOKENS = 16, 8  # two steps of two 4-token prompts
        reqs = _reqs(5)
        for r in reqs:
            sched.add(r)
        assert not sched.schedule().decode  # mid-burst: decoding waits for the rest of it
        return sched, reqs

    probed, reqs = scheduler()
    with probed.alone(reqs[4:]):
        inside = probed.schedule()
        assert [r for r, _ in inside.prefill] == reqs[4:]  # its own burst, all in
        for r, n in inside.prefill:
            probed.advance(r, r.prefilled + n)
            probed.started(r)
        nothing = probed.schedule()  # the burst ends at a step that finds nothing more, which decodes
        assert not nothing.prefill and nothing.decode
        probed.finish(reqs[4], "stop")  # the probed request ends (or is preempted back) in the block
    plain, plain_reqs = scheduler()
    plain.finish(plain_reqs[4], "stop")
    after, want = probed.schedule(), plain.schedule()
    assert after.decode == want.decode
    assert [reqs.index(r) for r, _ in after.prefill] == [plain_reqs.index(r) for r, _ in want.prefill]


def test_requeue_front_keeps_the_order_given():
    sched = Scheduler(max_batch=8, prefill_chunk=64)
    a, b, c = _reqs(3)
    sched.add(c)
    sched.requeue_front([a, b])
    assert list(sched.waiting) == [a, b, c]
