"""The public-API step profiler splits every steady decode step into its parts, for graphc and the
plain mlx-lm loop."""

from __future__ import annotations

import json

from graphc.benchmarks import step_profile


def test_step_profile_splits_steps(tmp_path):
    out = tmp_path / "p.json"
    res = step_profile.main(["--model", "tiny", "--batch", "2", "--prompt-len", "8", "--new", "12",
                             "--skip", "2", "--repeats", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    (run,) = res["runs"]
    for who in ("graphc", "plain"):
        parts = run[who]
        assert parts["steps"] >= 8, parts  # every decode step after the skipped ones was seen
        assert all(parts[p] >= 0 for p in ("build", "submit", "engine", "step")), parts
        # the parts are pieces of the step: none of their medians exceeds the median step
        assert parts["build"] <= parts["step"] and parts["submit"] <= parts["step"], parts
    assert run["plain"]["engine"] == 0.0


def test_paired_mode_alternates_greedy_and_sampled_calls_on_one_engine(tmp_path, monkeypatch):
    """--paired: one ratio of per-step medians per pair, after one warm-up call of each kind,
    the order flipping every pair so drift falls on both."""
    from graphc.runtime import Engine

    order = []
    real = Engine.generate

    def generate(self, prompts, params):
        order.append("sampled" if params.temperature else "greedy")
        return real(self, prompts, params)

    monkeypatch.setattr(Engine, "generate", generate)
    out = tmp_path / "p.json"
    res = step_profile.main(["--model", "tiny", "--batch", "2", "--prompt-len", "8", "--new", "12", "--skip", "2",
                             "--repeats", "3", "--paired", '{"temperature": 0.8, "top_k": 20}', "--json", str(out)])
    assert json.loads(out.read_text()) == res
    (pairs,) = res["pairs"]
    assert order == ["greedy", "sampled"] + ["greedy", "sampled", "sampled", "greedy", "greedy", "sampled"]
    assert len(pairs["greedy"]) == len(pairs["sampled"]) == len(pairs["ratio"]) == 3
    for g, s, r in zip(pairs["greedy"], pairs["sampled"], pairs["ratio"]):
        assert g > 0 and s > 0 and abs(r - s / g) < 1e-3
    lo, mid, hi = pairs["ratio_min_median_max"]
    assert lo <= mid <= hi and mid == sorted(pairs["ratio"])[1]


def test_paired_mode_with_a_control_normalizes_each_pair_by_the_plain_loop(tmp_path, monkeypatch):
    """--control: the plain loop runs after every call (and once to warm up); each pair's
    normalized ratio is (sampled / its control) / (greedy / its control)."""
    controls = []
    real = step_profile.plain_loop

    def plain_loop(*a, **k):
        controls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(step_profile, "plain_loop", plain_loop)
    res = step_profile.main(["--model", "tiny", "--batch", "2", "--prompt-len", "8", "--new", "12", "--skip", "2",
                             "--repeats", "2", "--paired", '{"temperature": 0.8, "top_k": 20}', "--control"])
    (pairs,) = res["pairs"]
    assert len(controls) == 1 + 2 * 2
    assert len(pairs["greedy_control"]) == len(pairs["sampled_control"]) == len(pairs["normalized"]) == 2
    for r, g, s, n in zip(pairs["ratio"], pairs["greedy_control"], pairs["sampled_control"], pairs["normalized"]):
        assert g > 0 and s > 0 and abs(n - r * g / s) < 1e-3
    assert sorted(pairs["normalized"])[0] == pairs["normalized_min_median_max"][0]


def test_a_budget_cuts_the_pairs_by_time_and_keeps_the_ones_done(tmp_path, monkeypatch):
    """--budget: no new pair starts once the budget (counted from the start) is spent; the pairs
    done are summarized and written, marked as cut (a device call's time limit otherwise kills the
    process and loses them all)."""
    ticks = iter(range(0, 10_000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(step_profile, "_clock", lambda: next(ticks))
    out = tmp_path / "p.json"
    res = step_profile.main(["--model", "tiny", "--batch", "2", "--prompt-len", "8", "--new", "12", "--skip", "2",
                             "--repeats", "5", "--paired", '{"temperature": 0.8, "top_k": 20}', "--budget", "25",
                             "--json", str(out)])
    (pairs,) = res["pairs"]
    # the start is 0, pairs look at 10 and 20 (within 25) and stop at 30
    assert len(pairs["ratio"]) == 2 and pairs["cut"] == "after 2 of 5 pairs (--budget 25 s)"
    assert pairs["ratio_min_median_max"][0] == min(pairs["ratio"])
    assert json.loads(out.read_text()) == res
    ticks = iter(range(0, 10_000, 100))  # spent before the first pair: nothing to summarize, no crash
    res = step_profile.main(["--model", "tiny", "--batch", "2", "--prompt-len", "8", "--new", "12", "--skip", "2",
                             "--repeats", "3", "--paired", '{"temperature": 0.8}', "--budget", "25"])
    assert res["pairs"][0]["ratio"] == [] and res["pairs"][0]["ratio_verdict"] == "not resolved (no pairs)"


def test_the_median_interval_is_the_binomial_order_statistics():
    """n = 9: the 2nd smallest and 2nd largest (coverage 1 - 20/512 = 0.961; the 3rd would be
    0.820); n = 6: the extremes (0.969); n = 5 cannot reach 95 % (0.9375)."""
    rs = [1.30, 0.90, 1.00, 1.10, 0.95, 1.02, 1.05, 0.98, 1.01]
    assert step_profile.median_interval(rs) == (0.95, 1.10)
    assert step_profile.median_interval([3, 1, 2, 6, 5, 4]) == (1, 6)
    assert step_profile.median_interval([1, 2, 3, 4, 5]) is None
    many = [1 + i / 1000 for i in range(100)]  # 100 pairs: k = 40 (P(40 <= X <= 60) >= 0.95, 41 not)
    assert step_profile.median_interval(many) == (many[39], many[60])


def test_the_verdict_says_what_the_interval_shows_against_the_limit():
    assert step_profile.against((0.98, 1.04), 0.05) == "<= 5% over greedy shown"
    assert step_profile.against((1.06, 1.20), 0.05) == "> 5% over greedy shown"
    assert step_profile.against((0.97, 1.11), 0.05) == "not resolved at 5%"
    assert step_profile.against(None, 0.05) == "not resolved (too few pairs)"
