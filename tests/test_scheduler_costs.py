"""The time-aware step budget (Scheduler(step_tokens="auto"), runtime/scheduler_costs.py): the cost
model fed with synthetic step times (no clocks read), the scheduler spending what it says, and
greedy tokens unchanged when the budget moves."""

from __future__ import annotations

import random

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.request import Request, Status
from graphc.runtime.scheduler import STEP_TOKENS, STEP_TOKENS_FLOOR, STEP_TOKENS_FLOORS, Scheduler, step_tokens_floor
from graphc.runtime.scheduler_costs import PROBE_EVERY, StepCosts
from helpers import random_prompts


def _drive(costs: StepCosts, fixed_s: float, per_token_s: float, steps: int = 200, ceil: int = 4096) -> list[int]:
    """Steps whose wall time is fixed_s + per_token_s * n, n the budget the model gave each."""
    costs.observe(fixed_s * 0.8, 0, True)  # a pure decode step first: the fallback's F
    out = []
    for _ in range(steps):
        n = costs.budget(STEP_TOKENS_FLOOR, ceil, 2.0)
        out.append(n)
        costs.observe(fixed_s + per_token_s * n, n, True)
    return out


def test_fixed_cost_dominated_steps_get_a_bigger_budget():
    """A GPU-like step (10 ms fixed, 5 us a prompt token): the budget grows to F / b = 2000 tokens,
    so a step stays within twice its fixed cost while the queue drains 8x faster than at 256."""
    costs = StepCosts()
    got = _drive(costs, 0.010, 5e-6)
    f, b = costs.fit()
    assert f == pytest.approx(0.010, rel=1e-6) and b == pytest.approx(5e-6, rel=1e-6)
    plain = [n for i, n in enumerate(got[-40:]) if (len(got) - 40 + i + 1) % PROBE_EVERY]
    assert plain and all(1990 <= n <= 2000 for n in plain)


def test_per_token_dominated_steps_keep_the_floor():
    """A CPU-like step (15 ms fixed, 3.5 ms a prompt token): a bigger budget only lengthens the
    stall, so it stays at the floor; the probe steps, only while the sizes seen do not vary, spend
    two thirds of it, never more."""
    got = _drive(StepCosts(), 0.015, 3.5e-3)
    assert max(got) == STEP_TOKENS_FLOOR
    probes = [i for i, n in enumerate(got) if n != STEP_TOKENS_FLOOR]
    assert probes and all(got[i] == 2 * STEP_TOKENS_FLOOR // 3 and (i + 1) % PROBE_EVERY == 0 for i in probes)
    assert len(probes) < 200 // PROBE_EVERY  # not on every fourth step: not while the sizes vary


def test_the_budget_never_passes_one_prefill_chunk_and_needs_a_measurement():
    costs = StepCosts()
    assert costs.budget(256, 2048, 2.0) == 256  # nothing measured yet: the floor
    assert costs.budget(256, 100, 2.0) == 100  # nor more than the chunk
    assert max(_drive(StepCosts(), 0.010, 1e-7, ceil=2048)) == 2048
    burst = StepCosts()
    burst.observe(0.5, 2048, False)  # a burst step (no rows decoded) is not a stall anyone saw
    assert burst.fit() is None


def test_scheduler_auto_spends_the_measured_budget():
    """Engine's default step_tokens is "auto": while rows decode, a step spends what the cost model
    says (here a model taught a 10 ms fixed cost and 5 us a token: ~2000 of a 3,000-token prompt,
    in whole CHUNK_ALIGN units: 1920)."""
    assert STEP_TOKENS == "auto"
    s = Scheduler(prefill_chunk=4096, step_tokens="auto")
    first = Request([1] * 10, SamplingParams())
    s.add(first)
    s.advance(first, s.schedule().prefill[0][1])
    s.started(first)
    for n in (256, 256, 512, 256):
        s.costs.observe(0.010 + 5e-6 * n, n, True)
    s.costs._asked = 0  # the next budget is not a probe step
    long = Request([2] * 3000, SamplingParams())
    s.add(long)
    (req, n), = s.schedule().prefill
    assert req is long and n == 1920 and n % s.CHUNK_ALIGN == 0
    for bad in (0, "fast", True, 1.5):
        with pytest.raises(ValueError, match="step_tokens"):
            Scheduler(step_tokens=bad)


def test_an_idle_gap_is_not_timed_as_a_step():
    """The interval between two schedule() calls is a step's cost only while work was queued: a
    request reaching an idle scheduler drops the pending measurement."""
    s = Scheduler(step_tokens="auto")
    r = Request([1] * 4, SamplingParams())
    s.add(r)
    s.schedule()
    assert s._last is not None
    s.finish(r, "abort")
    s.add(Request([2] * 4, SamplingParams()))
    assert s._last is None


def test_greedy_tokens_unchanged_when_the_budget_grows(mdir_llama):
    """A 300-token prompt joining 4 decoding rows, once with a cost model that allows whole chunks
    and once with step_tokens=16: the same greedy tokens for every request (and those it gets alone)."""
    prompts = [[5 + i, 6, 7] for i in range(4)] + random_prompts(1, 1024, [300], seed=3)
    p = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [Engine.load(mdir_llama).generate([x], [p])[0].token_ids for x in prompts]
    runs = []
    for step_tokens in ("auto", 16):
        eng = Engine.load(mdir_llama, step_tokens=step_tokens)
        if step_tokens == "auto":
            for n in (256, 512, 256, 512):
                eng.scheduler.costs.observe(0.010 + 1e-6 * n, n, True)  # as if prompt tokens were free
            eng.scheduler._clock = lambda: 0.0  # keep the taught model: no real timings this run
        ids = [eng.add_request(x, p) for x in prompts[:4]]
        outs = {r: [] for r in ids}
        while any(eng.scheduler.by_id[r].status is not Status.RUNNING for r in ids):
            for o in eng.step():
                outs[o.request_id] += o.new_token_ids
        ids.append(eng.add_request(prompts[4], p))
        outs[ids[-1]] = []
        while eng.has_unfinished():
            for o in eng.step():
                outs[o.request_id] += o.new_token_ids
        runs.append([outs[r] for r in ids])
    assert runs[0] == runs[1] == alone


@pytest.fixture
def mdir_llama(model_dir):
    return model_dir("llama")


def test_noisy_step_times_never_push_the_budget_past_the_floor_on_a_per_token_cost():
    """A shared CPU's step times swing (here up to +-100%, a seeded draw): b is taken at the upper end
    of its interval, so chance never makes a per-token-dominated step's budget large."""
    rng, costs, got = random.Random(2), StepCosts(), []
    costs.observe(0.016, 0, True)
    for _ in range(300):
        n = costs.budget(STEP_TOKENS_FLOOR, 2048, 2.0)
        got.append(n)
        costs.observe((0.02 + 3.5e-3 * n) * (1 + (2 * rng.random() - 1)), n, True)
    assert max(got) == STEP_TOKENS_FLOOR


def test_auto_floor_is_the_devices():
    """On CUDA "auto" spends at least STEP_TOKENS_FLOORS["cuda"] while rows decode; the CPU keeps 256."""
    assert step_tokens_floor("cpu") == STEP_TOKENS_FLOOR == 256
    assert step_tokens_floor("cuda") == STEP_TOKENS_FLOORS["cuda"] > STEP_TOKENS_FLOOR
    sched = Scheduler(prefill_chunk=2048, step_tokens="auto", step_tokens_floor=step_tokens_floor("cuda"))
    sched.running.append(object())  # rows decode: the measured budget applies
    assert sched.step_budget() == STEP_TOKENS_FLOORS["cuda"]  # nothing measured yet: the floor
    sched = Scheduler(prefill_chunk=512, step_tokens="auto", step_tokens_floor=1024)
    sched.running.append(object())
    assert sched.step_budget() == 512  # never above one prefill chunk


def test_engine_takes_the_floor_of_its_device(model_dir):
    eng = Engine.load(model_dir("llama"))
    assert eng.scheduler.step_tokens_floor == STEP_TOKENS_FLOOR  # the CPU here
