"""Prefill lanes (compiler/passes/prefill_choices.py `prefill lanes`, runtime/batched_prefill.py):
the CPU's measured lanes become the plan's choice, a step's whole prompts are split into a group
per lane and run side by side on CPU streams, and every request's tokens stay mlx-lm's."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest

from graphc.compiler.compile import compile_graph
from graphc.compiler.target import Requested, Target
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cpu_lanes import LANE_GAIN, cpu_lanes, lanes_for
from graphc.runtime.grammar import Grammar
from graphc.runtime.prefill_groups import group_prefill
from graphc.runtime.request import Request
from helpers import assert_greedy_matches_mlx_lm, random_prompts


def _plan(model_dir, arch="llama", target=None, **asked):
    d = model_dir(arch)
    model, _ = mlx_lm.load(str(d))
    config = json.loads((Path(d) / "config.json").read_text())
    graph = "hybrid" if arch == "qwen3_next" else "dense"
    return compile_graph(graph, model, config, target=target or Target(device="cpu", cpu_lanes=(2, "measured")),
                         requested=Requested.of(None, **asked)).plan("prefill")


def test_the_measured_lanes_are_the_plans_choice(model_dir):
    two = _plan(model_dir).choice("prefill lanes")
    assert two.choice == "2" and "measured" in two.why and two.alternatives == ("1", "2")
    assert _plan(model_dir, target=Target(device="cpu", cpu_lanes=(1, "threaded BLAS"))).choice(
        "prefill lanes").choice == "1"
    asked = _plan(model_dir, prefill_lanes=1).choice("prefill lanes")
    assert asked.choice == "1" and "prefill_lanes=1" in asked.why
    cuda = _plan(model_dir, target=Target(device="cuda")).choice("prefill lanes")
    assert cuda.choice == "1" and "device is cuda" in cuda.why
    hybrid = _plan(model_dir, arch="qwen3_next").choice("prefill lanes")
    assert hybrid.choice == "1" and "one at a time" in hybrid.why
    ranked = _plan(model_dir, target=Target(device="cpu", cpu_lanes=(2, "measured"), ranks=2), prefill_lanes=2)
    assert ranked.choice("prefill lanes").choice == "1" and "distributed" in ranked.choice("prefill lanes").why


def test_lanes_asked_where_prompts_prefill_one_at_a_time_stay_one_in_plan_and_runner(model_dir):
    """A graph whose layers keep other state than plain rows (here a hybrid model's recurrent
    layers) prefills prompts one at a time: asked for 2 lanes, the plan says 1 and why, and the
    runner runs what the plan says."""
    asked = _plan(model_dir, arch="qwen3_next", prefill_lanes=2).choice("prefill lanes")
    assert asked.choice == "1" and "one at a time" in asked.why
    eng = Engine.load(model_dir("qwen3_next"), prefill_lanes=2)
    assert eng.compiled.prefill.plan.choice("prefill lanes").choice == "1" == str(eng.runner.batched.lanes)


def test_the_probe_decides_by_the_measured_ratio():
    assert lanes_for(0.080, 0.042, cores=2).count == 2  # the reference BLAS: two streams, half the time
    threaded = lanes_for(0.004, 0.0039, cores=8)  # a threaded BLAS: the pair takes as long either way
    assert threaded.count == 1 and "already uses the cores" in threaded.why
    assert lanes_for(0.080, 0.080 * LANE_GAIN, cores=2).count == 1  # not under the gain: one lane
    assert lanes_for(0.080, 0.030, cores=1).count == 1
    assert cpu_lanes() is cpu_lanes()  # measured once per process


def test_whole_prompts_make_a_group_per_lane():
    params = SamplingParams()
    reqs = [Request([i + 1] * n, params) for i, n in enumerate([384, 384, 384, 384, 384])]
    chunks = [(r, len(r.context_ids)) for r in reqs]
    one = group_prefill(chunks, batch_prefill=True, chunk=2048, lanes=1)
    two = group_prefill(chunks, batch_prefill=True, chunk=2048, lanes=2)
    assert [len(g) for g in one] == [5] and [len(g) for g in two] == [3, 2]
    mid = Request([9] * 500, params)
    mid.prefilled = 100  # a piece of a prompt (after a hit) is never batched
    split = group_prefill([(mid, 200)] + chunks[:1], batch_prefill=True, chunk=2048, lanes=2)
    assert [[r for r, _ in g] for g in split] == [[mid], [reqs[0]]]


@pytest.fixture
def mdir(model_dir):
    return model_dir("llama")


def test_lanes_run_groups_side_by_side_and_stay_exact(mdir, monkeypatch):
    """Two lanes forced: a burst's whole prompts run as two groups at once, each forward built on a
    lane's stream; the tokens equal mlx-lm's own greedy decode and the one-lane engine's."""
    prompts = random_prompts(7, 1024, [30, 12, 45, 7, 22, 38, 16], seed=9)
    eng = Engine.load(mdir, prefill_lanes=2)
    assert eng.runner.batched.lanes == 2 and eng.scheduler.lanes == 2
    sched = json.loads(json.dumps(eng.describe()))["scheduling"]  # plain data, as describe() promises
    assert sched["prefill_lanes"] == 2 and (sched["burst_tokens"], sched["burst_step_tokens"]) == (2048, 2048)
    waves, streams = [], []
    orig_run, orig_build = eng.runner.batched.run, eng.runner.batched._build
    monkeypatch.setattr(eng.runner.batched, "run", lambda groups: (waves.append([len(g) for g in groups]),
                                                                   orig_run(groups))[1])
    monkeypatch.setattr(eng.runner.batched, "_build", lambda reqs: (streams.append(mx.default_stream(mx.cpu)),
                                                                    orig_build(reqs))[1])
    got = eng.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert waves and all(len(w) == 2 for w in waves) and sum(map(sum, waves)) == 7
    assert len(set(streams)) == 2 and mx.default_stream(mx.cpu) not in streams
    assert_greedy_matches_mlx_lm(eng.model, prompts, got, 8)
    one = Engine.load(mdir, prefill_lanes=1).generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert [r.token_ids for r in got] == [r.token_ids for r in one]


def test_a_grammar_prompt_never_runs_in_a_lane(mdir, monkeypatch):
    """A request with host edits (a grammar) is prefilled in a forward of its own, not beside others:
    its mask is computed on the host between its forward and its head."""
    eng = Engine.load(mdir, prefill_lanes=2)
    waves = []
    orig_run = eng.runner.batched.run
    monkeypatch.setattr(eng.runner.batched, "run", lambda groups: (waves.append(groups), orig_run(groups))[1])
    prompts = random_prompts(3, 1024, [20, 9, 14], seed=3)
    params = [SamplingParams(max_tokens=10, grammar=Grammar.regex("[a-z]{3,6}"))] + \
        [SamplingParams(max_tokens=6, ignore_eos=True)] * 2
    got = eng.generate(prompts, params)
    assert all(not any(r.grammar is not None for g in w for r in g) or len(w) == 1 for w in waves)
    assert got[0].finish_reason == "stop" and len(got[0].text) >= 3
