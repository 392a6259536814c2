"""Mixed steps (`decode: {mixed_step: true}`): a prompt chunk riding the decode step's forward
(compiler/mixed_forward.py, runtime/mixed_step.py) gives what separate forwards give.

The suite runs MLX's reference BLAS (tests/conftest.py), whose matmuls do not depend on the rows
around them, so the comparison is exact: tokens and logprobs equal, not close."""

from __future__ import annotations

import random

import pytest

from graphc.compiler.mixed_forward import why_not_mixable
from graphc.runtime import Engine, SamplingParams

from helpers import reference_greedy

MIXED = {"mixed_step": True}


def _arrivals(path, options, *, seed=0, n=14, every=3, **load_kw):
    """Requests arriving every `every` steps while earlier ones decode: greedy and seeded sampled
    rows, logprobs, max_tokens 1 (ends at its first token), and prompts sharing a cached header.
    Returns (engine, [token ids], [logprobs]) in arrival order."""
    eng = Engine.load(path, decode_options=options, max_batch=8, step_tokens=48, prefill_chunk=48, **load_kw)
    rng = random.Random(seed)
    header = [rng.randrange(3, 1000) for _ in range(60)]
    prompts = [(header if i % 3 == 0 else []) + [rng.randrange(3, 1000) for _ in range(rng.randrange(5, 150))]
               for i in range(n)]
    toks, lps, ids, i, steps = {}, {}, [], 0, 0
    while i < n or eng.has_unfinished():
        if i < n and steps % every == 0:
            params = SamplingParams(max_tokens=[1, 20, 7, 30][i % 4], ignore_eos=True, seed=i,
                                    temperature=0.8 if i % 2 else 0.0, logprobs=2 if i % 5 == 0 else None)
            ids.append(eng.add_request(prompts[i], params))
            i += 1
        for o in eng.step():
            toks.setdefault(o.request_id, []).extend(o.new_token_ids)
            lps.setdefault(o.request_id, []).extend(o.new_logprobs or [])
        steps += 1
    return eng, prompts, [toks[x] for x in ids], [lps[x] for x in ids]


@pytest.mark.parametrize("load_kw", [{}, {"final_chunk": "whole", "pad_final_chunk": True}, {"compile": True}],
                         ids=["default", "whole-padded", "compiled-decode"])
def test_mixed_steps_give_the_separate_steps_tokens_and_logprobs(model_dir, load_kw):
    path = model_dir("llama")
    sep, prompts, toks, lps = _arrivals(path, {}, **load_kw)
    mix, _, mtoks, mlps = _arrivals(path, MIXED, **load_kw)
    assert mix.describe()["scheduling"]["mixed_steps"] >= 10  # chunks did ride
    assert sep.describe()["scheduling"]["mixed_steps"] is None
    assert sep.runner.mixed is None
    assert mtoks == toks and mlps == lps
    for i in range(0, len(prompts), 4):  # greedy rows against mlx-lm's own forward
        assert mtoks[i] == reference_greedy(mix.model, prompts[i], len(mtoks[i]))
    assert mix.stats["cached_tokens"] == sep.stats["cached_tokens"]
    assert mix.stats["cached_tokens"] > 0 or load_kw  # the header hit (a padded engine cuts hits to 128s: none)
    assert not mix.has_unfinished()
    mix.prefix.flush()
    mix.prefix.check()
    assert mix.cache_stats()["pool_used"] == 0


def test_chunks_that_cannot_ride_run_alone_in_the_same_step(model_dir):
    """Prompt logprobs need every position's logits: such a chunk runs as its own forward while
    the others ride; a step that does not decode leaves its chunk to run alone too."""
    path = model_dir("llama")
    eng = Engine.load(path, decode_options=MIXED, max_batch=4, step_tokens=32, prefill_chunk=32)
    ref = Engine.load(path, max_batch=4, step_tokens=32, prefill_chunk=32)
    prompts = [[7 + i for i in range(40)], [300 + i for i in range(70)], [500 + i for i in range(50)]]
    params = [SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=6, ignore_eos=True, prompt_logprobs=1),
              SamplingParams(max_tokens=6, ignore_eos=True)]
    out = {}
    for e in (eng, ref):
        e.add_request(prompts[0], params[0])
        e.step()
        e.step()  # the first row decodes
        rest = [e.add_request(p, q) for p, q in zip(prompts[1:], params[1:])]
        scored = e.request(rest[0])  # kept: a finished request leaves the engine's tables
        res = {}
        while e.has_unfinished():
            for o in e.step():
                res.setdefault(o.request_id, []).extend(o.new_token_ids)
        out[e is eng] = ([res[r] for r in rest], scored.prompt_logprobs)
    assert out[True] == out[False]
    assert len(out[True][1]) == len(prompts[1]) and out[True][1][0] is None  # every position scored, alone
    assert eng.runner.mixed.steps > 0


def test_the_plan_says_when_steps_mix_and_why_not(model_dir):
    eng = Engine.load(model_dir("llama"), decode_options=MIXED)
    choice = eng.runner.compiled.decode.plan.choice("mixed step")
    assert choice.choice == "fused" and "rides the decode forward" in choice.why
    off = Engine.load(model_dir("llama")).runner.compiled.decode.plan.choice("mixed step")
    assert off.choice == "separate" and "mixed_step: false" in off.why
    other = Engine.load(model_dir("qwen3"), decode_options=MIXED)
    c = other.runner.compiled.decode.plan.choice("mixed step")
    assert c.choice == "separate" and "llama" in c.why and other.runner.mixed is None
    assert why_not_mixable(other.runner.compiled.binding) is not None
    wide = model_dir("llama", hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32)  # a quantizable head dim
    for kw in ({"kv_bits": 8, "kv_group_size": 32}, {"graph": "dense_paged"}):
        e = Engine.load(wide, decode_options=MIXED, **kw)
        c = e.runner.compiled.decode.plan.choice("mixed step")
        assert c.choice == "separate" and "plain K/V" in c.why and e.runner.mixed is None, (kw, c)


def test_a_failing_mixed_step_ends_only_the_culprits_and_frees_their_slots(model_dir, monkeypatch):
    """A fault inside a mixed forward is contained like any step's (runtime/fault.py): the engine
    recovers, requests go on or end with an error, and no cache slot stays referenced."""
    path = model_dir("llama")
    eng = Engine.load(path, decode_options=MIXED, max_batch=4, step_tokens=32, prefill_chunk=32)
    real = eng.runner.mixed.forward
    calls = {"n": 0}

    def flaky(step, inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected mixed-step failure")
        return real(step, inputs)

    monkeypatch.setattr(eng.runner.mixed, "forward", flaky)
    prompts = [[11 + i for i in range(20)], [200 + i for i in range(60)], [400 + i for i in range(45)]]
    rids = [eng.add_request(prompts[0], SamplingParams(max_tokens=16, ignore_eos=True))]
    eng.step()
    eng.step()
    rids += [eng.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts[1:]]
    done = {}
    for _ in range(200):
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.finish_reason
        if not eng.has_unfinished():
            break
    assert not eng.has_unfinished() and set(done) == set(rids)
    assert calls["n"] >= 2  # the failure was hit
    assert set(done.values()) <= {"length", "error"}
    eng.prefix.flush()
    eng.prefix.check()
    assert eng.cache_stats()["pool_used"] == 0


@pytest.mark.parametrize("flag,want", [("graph", False), ("off", False), ("on", True)])
def test_serve_mixed_step_flag_reaches_the_plan(model_dir, flag, want):
    """`graphc serve --mixed-step on`: the decode option, and so the plan's choice (default: the graph's)."""
    import argparse

    from graphc.runtime.server.cli import add_parser, config_from_args
    from graphc.runtime.server.state import load_engine

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", str(model_dir("llama")), "--mixed-step", flag])
    eng = load_engine(config_from_args(args))
    assert eng.decode_options["mixed_step"] is want
    assert (eng.runner.mixed is not None) is want


def test_metrics_count_fused_chunks_and_the_bench_reads_them(model_dir):
    """/metrics' graphc_fused_prompt_chunks_total is the runner's count; the serving bench takes a
    run's share of it from two scrapes (benchmarks/serving/engine_side.py)."""
    from graphc.benchmarks.serving.engine_side import parse, run_quantiles
    from graphc.runtime.engine_snapshot import EngineSnapshot, Snapshots
    from graphc.runtime.server.metrics import ServerMetrics

    def scrape(eng):
        snap = Snapshots().take(eng, EngineSnapshot(), 0, {})
        return parse(ServerMetrics().render(snap, ready=True, engine_alive=True, model="tiny"))

    sep, *_ = _arrivals(model_dir("llama"), {}, n=6)
    assert scrape(sep)["fused_chunks"] == 0
    mix, *_ = _arrivals(model_dir("llama"), MIXED, n=6)
    fused = mix.describe()["scheduling"]["mixed_steps"]
    assert fused > 0
    after = scrape(mix)
    assert after["fused_chunks"] == fused
    before = {**after, "fused_chunks": 1.0}
    assert run_quantiles(before, after)["engine_fused_chunks"] == fused - 1
