"""The measured gate (runtime/measured_gate.py): per batch-size bucket it runs the arm —
plain, verify, pipelined — that produced tokens fastest, explores the others now and then,
and never changes the tokens."""

from __future__ import annotations

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.measured_gate import ArmGate, bucket
from helpers import reference_greedy


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _cycle(gate, clock, arm_cost, batch=1, available=("plain", "verify"), dirty=False):
    """One runner cycle: begin, run the arm chosen for it, return the arm."""
    gate.begin()
    arm = gate.current(batch, available)
    tokens, seconds = arm_cost[arm]
    clock.now += seconds
    gate.tokens(tokens)
    if dirty:
        gate.dirty()
    return arm


def test_batch_sizes_fall_in_power_of_two_buckets_up_to_16():
    assert [bucket(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 15, 16)] == [1, 1, 2, 4, 4, 8, 8, 16, 16, 16]


def test_gate_runs_the_faster_arm_and_explores_the_other():
    clock = Clock()
    gate = ArmGate(clock)
    fast_verify = {"plain": (1, 1.0), "verify": (3, 1.5)}
    arms = [_cycle(gate, clock, fast_verify) for _ in range(300)]
    assert arms[:gate.RUN] == ["plain"] * gate.RUN  # untried arms first, in order
    late = arms[100:]
    assert late.count("verify") > 0.9 * len(late) and "plain" in late  # exploration stretches
    rates = gate.rates()[1]
    assert abs(rates["verify"][0] - 2.0) < 1e-6 and abs(rates["plain"][0] - 1.0) < 1e-6
    # The traffic changes (drafts stop being accepted): verify now loses, and the gate follows.
    slow_verify = {"plain": (1, 1.0), "verify": (1, 2.0)}
    arms = [_cycle(gate, clock, slow_verify) for _ in range(400)]
    assert arms[-200:].count("plain") > 0.9 * 200


def test_unmeasured_cycles_do_not_count():
    clock = Clock()
    gate = ArmGate(clock)
    cost = {"plain": (1, 1.0), "verify": (1, 1.0)}
    _cycle(gate, clock, cost)  # the stretch's first cycle: pays the switch
    for _ in range(2):
        _cycle(gate, clock, cost, dirty=True)  # a prefill in the cycle
    gate.begin()
    assert gate.rates() == {}
    gate._cur = gate._last + (False,)  # pretend the chosen stretch continues into this cycle
    clock.now += 1.0
    gate.tokens(1)
    gate.begin()
    assert gate.rates() == {1: {"plain": (1.0, 1)}}
    gate2 = ArmGate(Clock())
    gate2.current(1, ("plain", "verify"))
    assert gate2.decide(1, ("plain", "verify")) == "plain"  # a stretch continues for RUN cycles


def test_buckets_are_measured_apart():
    clock = Clock()
    gate = ArmGate(clock)
    for _ in range(200):  # at batch 1 verify wins, at batch 12 plain does
        _cycle(gate, clock, {"plain": (1, 1.0), "verify": (3, 1.5)}, batch=1)
    for _ in range(200):
        _cycle(gate, clock, {"plain": (12, 1.0), "verify": (14, 2.0)}, batch=12)
    r = gate.rates()
    assert r[1]["verify"][0] > r[1]["plain"][0] and r[16]["plain"][0] > r[16]["verify"][0]
    nxt = [_cycle(gate, clock, {"plain": (12, 1.0), "verify": (14, 2.0)}, batch=12) for _ in range(40)]
    assert nxt.count("plain") >= 40 - ArmGate.RUN  # at most one exploring stretch


def _engine_with_costs(model_dir, verify_seconds: float = 1.0, cost: dict | None = None, pipeline: bool = False):
    """An engine whose gate sees a fake clock: a cycle costs cost[arm] seconds (default: plain 1 s,
    verify `verify_seconds`); a test cannot rely on this machine's timings."""
    eng = Engine.load(model_dir("llama"), prefill_chunk=64, spec_max_tokens=64, spec_adaptive=True,
                      spec_pipeline=pipeline)
    cost = cost or {"plain": 1.0, "verify": verify_seconds}
    spec = eng.speculator
    clock = Clock()
    spec.gate.clock = clock
    end = spec.end_cycle

    def end_cycle(out, verified):
        clock.now += cost[spec.gate._cur[0]] if spec.gate._cur else 1.0
        end(out, verified)

    spec.end_cycle = end_cycle
    return eng


def test_engine_gate_turns_speculation_off_where_it_loses_and_keeps_tokens(model_dir):
    eng = _engine_with_costs(model_dir, verify_seconds=50.0)
    [p] = [list(range(5, 17)) * 3]
    ref = reference_greedy(eng.model, p, 160)
    eng.speculator.drafter = lambda req, k: ref[len(req.output_ids):len(req.output_ids) + k]  # always right
    [r] = eng.generate([p], SamplingParams(max_tokens=160, ignore_eos=True, speculative="prompt_lookup",
                                           num_draft_tokens=4))
    assert r.token_ids == ref
    rates = eng.speculator.gate.rates()[1]
    assert rates["plain"][0] > rates["verify"][0]
    # After the first stretches, only plain steps (and at most one exploring stretch) ran.
    assert eng.stats["spec_steps"] <= 3 * ArmGate.RUN


def test_engine_gate_keeps_speculation_where_it_wins(model_dir):
    eng = _engine_with_costs(model_dir, verify_seconds=1.0)  # a 5-token verify for the price of a step
    [p] = [list(range(5, 17)) * 3]
    ref = reference_greedy(eng.model, p, 160)
    eng.speculator.drafter = lambda req, k: ref[len(req.output_ids):len(req.output_ids) + k]
    [r] = eng.generate([p], SamplingParams(max_tokens=160, ignore_eos=True, speculative="prompt_lookup",
                                           num_draft_tokens=4))
    assert r.token_ids == ref
    s = eng.stats
    assert s["spec_emitted_tokens"] > 0.75 * 160  # most tokens came from verify steps
    assert eng.speculator.gate.rates()[1]["verify"][0] > eng.speculator.gate.rates()[1]["plain"][0]


def test_engine_gate_with_pipelined_arm_keeps_tokens(model_dir):
    """Three arms; pipelined cycles cost least: the gate settles there, switching arms (and so
    discarding or skipping pipelined verifies) along the way without changing a token."""
    eng = _engine_with_costs(model_dir, cost={"plain": 1.0, "verify": 2.0, "pipelined": 1.2}, pipeline=True)
    spec = eng.speculator
    p = list(range(5, 17)) * 3
    ref = reference_greedy(eng.model, p, 200)
    wrong = {7, 19, 30, 31, 60, 90}  # some drafts rejected: pipelined verifies discarded there

    def drafter(req, k):
        n = len(req.output_ids)
        return [t + (i + n in wrong) for i, t in enumerate(ref[n:n + k])]

    spec.drafter = drafter
    [r] = eng.generate([p], SamplingParams(max_tokens=200, ignore_eos=True, speculative="prompt_lookup",
                                           num_draft_tokens=4))
    assert r.token_ids == ref
    rates = spec.gate.rates()[1]
    assert max(rates, key=lambda a: rates[a][0]) == "pipelined"
    assert eng.stats["spec_pipelined_steps"] > 10 and eng.stats["spec_pipeline_discards"] > 0


def test_engine_gate_credits_the_slowest_row(model_dir):
    """Two rows, one whose drafts are always right and one whose drafts are always wrong; a verify
    cycle costs 1.2 plain ones. In total tokens verifying wins (~6 tokens per 1.2 s against 2 per
    1 s), but the second row would get one token per 1.2 s instead of per 1 s: the gate keeps the
    batch plain, so no request is slowed by its batch-mate's speculation."""
    eng = _engine_with_costs(model_dir, verify_seconds=1.2)
    good, bad = list(range(5, 17)) * 3, list(range(30, 41)) * 3
    refs = {tuple(p): reference_greedy(eng.model, p, 120) for p in (good, bad)}

    def drafter(req, k):
        ref, n = refs[tuple(req.prompt_ids)], len(req.output_ids)
        d = ref[n:n + k]
        return d if req.prompt_ids == good else [(t + 1) % eng.vocab_size for t in d]

    eng.speculator.drafter = drafter
    eng.speculator.min_acceptance = 0.0  # keep the bad row drafting (no per-row pause)
    out = eng.generate([good, bad], SamplingParams(max_tokens=120, ignore_eos=True, speculative="prompt_lookup",
                                                   num_draft_tokens=4))
    assert [r.token_ids for r in out] == [refs[tuple(good)], refs[tuple(bad)]]
    rates = eng.speculator.gate.rates()[2]
    assert rates["plain"][0] > rates["verify"][0]


def test_engine_gate_does_not_count_steps_without_drafts_against_verify(model_dir):
    """Stretches of new text (no draft) alternate with copied text (drafts always right). A verify
    cycle costs 1.5 plain ones and gives 5 tokens; a step without drafts is a plain step whichever
    arm runs. Counted as verify samples, those steps (1 token per cycle) sank the verify arm's
    rate in the new-text stretches and the gate ran plain through the copied ones."""
    eng = _engine_with_costs(model_dir, verify_seconds=1.5)
    [p] = [list(range(5, 17)) * 3]
    ref = reference_greedy(eng.model, p, 240)

    def drafter(req, k):
        n = len(req.output_ids)
        return ref[n:n + k] if (n // 24) % 2 else []  # 24 tokens copied, then 24 new, ...

    spec = eng.speculator
    spec.drafter = drafter
    spec.MAX_MISSES = 10**9  # keep asking for drafts in the new-text stretches
    [r] = eng.generate([p], SamplingParams(max_tokens=240, ignore_eos=True, speculative="prompt_lookup",
                                           num_draft_tokens=4))
    assert r.token_ids == ref
    rates = spec.gate.rates()[1]
    assert rates["verify"][0] > rates["plain"][0]
    assert eng.stats["spec_emitted_tokens"] > 0.4 * 240  # most copied tokens came from verify steps


def test_close_arms_are_rechecked_sooner():
    """Two arms within CLOSE of each other: a noisy window can order them wrongly, so the other
    one is re-checked every EXPLORE_CLOSE cycles; arms far apart every EXPLORE_EVERY."""
    for verify, every in (((5, 4.0), ArmGate.EXPLORE_CLOSE), ((1, 4.0), ArmGate.EXPLORE_EVERY)):
        clock = Clock()
        gate = ArmGate(clock)
        cost = {"plain": (1, 1.0), "verify": verify}  # verify 1.25 tok/s (close) or 0.25 (far)
        arms = [_cycle(gate, clock, cost) for _ in range(400)]
        late = arms[100:]
        stretches = sum(1 for a, b in zip(late, late[1:]) if a == "plain" and b == "verify")
        # Stretches of the losing arm, one per `every` measured cycles (about RUN - 1 of each
        # stretch is measured): 300 cycles hold ~300 / (every + RUN) of them.
        assert abs(stretches - 300 / (every + ArmGate.RUN)) <= 2, (verify, stretches)


def test_a_noisy_wrong_order_is_corrected_within_a_few_stretches():
    """Verify is truly faster (1.3x), but its first window saw a bad stretch (new text): plain
    wins at first; the close re-check brings verify back within ~EXPLORE_CLOSE cycles."""
    clock = Clock()
    gate = ArmGate(clock)
    bad = {"plain": (1, 1.0), "verify": (1, 1.2)}  # the first stretches: verify looks slower
    for _ in range(3 * ArmGate.MIN_SAMPLES + 8):
        _cycle(gate, clock, bad)
    rates = gate.rates()[1]
    assert rates["plain"][0] > rates["verify"][0]
    good = {"plain": (1, 1.0), "verify": (13, 10.0)}  # verify 1.3 tok/s from now on
    arms = [_cycle(gate, clock, good) for _ in range(120)]
    first = arms.index("verify") if "verify" in arms else len(arms)
    assert first <= ArmGate.EXPLORE_CLOSE + 2 * ArmGate.RUN
    assert arms[-40:].count("verify") > 30
