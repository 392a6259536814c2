"""A prompt's final chunk, whole (one forward) or split (L-1 positions, then the last): a choice
the prefill pass makes (compiler/passes/prefill_choices.py), the plan records with the padding
choice beside it, inspect prints and the runner obeys. Either way greedy output equals mlx-lm's
and the other arm's; padded runs are in tests/test_pad_final_chunk.py."""

from __future__ import annotations

import json
from pathlib import Path

import mlx_lm
import numpy as np
import pytest

from graphc.cli.main import build_parser
from graphc.compiler.compile import compile_graph
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.plan import Plan
from graphc.compiler.target import Requested, Target
from graphc.runtime import Engine, EngineConfig, SamplingParams
from graphc.runtime.server.cli import config_from_args
from graphc.runtime.server.state import load_engine
from helpers import assert_greedy_matches_mlx_lm, random_prompts, reference_greedy

PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)
LENGTHS = [5, 300, 17, 1, 129, 2, 64]
CUDA, CPU = Target(device="cuda"), Target(device="cpu")


def _compiled(model_dir, graph="dense", arch="llama", target=CPU, lowering="auto", **asked):
    d = model_dir(arch)
    model, _ = mlx_lm.load(str(d))
    config = json.loads((Path(d) / "config.json").read_text())
    return compile_graph(graph, model, config, lowering=lowering, target=target, requested=Requested(**asked))


def _chosen(compiled) -> tuple:
    plan = compiled.plan("prefill")
    return plan.choice("final chunk").choice, plan.choice("final chunk padding").choice


def test_the_target_decides_whole_or_split_and_padding(model_dir):
    assert _chosen(_compiled(model_dir, target=CUDA)) == ("whole", "on")
    assert _chosen(_compiled(model_dir, target=CPU)) == ("split", "off")
    assert _chosen(_compiled(model_dir, target=Target())) == ("split", "off")  # unprobed: as before targets
    # What the engine asks wins, except padding where it is not exact.
    assert _chosen(_compiled(model_dir, target=CPU, final_chunk="whole", pad_final_chunk=True)) == ("whole", "on")
    assert _chosen(_compiled(model_dir, target=CUDA, final_chunk="split", pad_final_chunk=False)) == ("split", "off")
    sliding = _compiled(model_dir, "sliding", "gemma3_text", target=CUDA, pad_final_chunk=True)
    assert _chosen(sliding) == ("whole", "off")
    assert "sliding window or recurrent state" in sliding.plan("prefill").choice("final chunk padding").why


def test_generic_lowering_keeps_the_split_unless_asked(model_dir):
    generic = _compiled(model_dir, target=CUDA, lowering="generic")
    assert _chosen(generic) == ("split", "on")
    assert "head runs on every position" in generic.plan("prefill").choice("final chunk").why
    assert _chosen(_compiled(model_dir, target=CUDA, lowering="generic", final_chunk="whole"))[0] == "whole"


@pytest.mark.parametrize("graph", ["embed", "score"])
def test_graphs_that_read_every_position_run_one_forward_unpadded(model_dir, graph):
    compiled = _compiled(model_dir, graph, target=CUDA, final_chunk="split", pad_final_chunk=True)
    assert _chosen(compiled) == ("whole", "off")


def test_inspect_prints_both_choices_and_why_and_json_round_trips(model_dir):
    compiled = _compiled(model_dir, target=CUDA)
    text = inspect_plan(compiled, "prefill", "text", trace=False)
    plan = compiled.plan("prefill")
    for name in ("final chunk", "final chunk padding"):
        c = plan.choice(name)
        assert f"\n{name:<28} {c.choice}" in text and f"why: {c.why}" in text
    assert "device is cuda" in plan.choice("final chunk").why
    back = Plan.from_dict(json.loads(inspect_plan(compiled, "prefill", "json", trace=False)))
    assert back.choice("final chunk") == plan.choice("final chunk")


def test_bad_requests_name_the_option():
    with pytest.raises(ValueError, match="final_chunk must be one of auto, whole, split"):
        EngineConfig(final_chunk="both")


def test_the_runner_obeys_the_plan(model_dir):
    eng = Engine.load(model_dir("llama"))
    assert eng.engine_config.final_chunk == "auto"
    assert eng.runner.final_chunk.whole is False  # the CPU's choice
    assert Engine.load(model_dir("llama"), final_chunk="whole").runner.final_chunk.whole is True


def test_serve_flag_reaches_the_plan(model_dir):
    args = build_parser().parse_args(["serve", "--model", str(model_dir("llama")), "--final-chunk", "whole"])
    eng = load_engine(config_from_args(args))
    assert eng.compiled.plan("prefill").choice("final chunk").choice == "whole" and eng.runner.final_chunk.whole


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def dense_dir(request, model_dir):
    return model_dir(request.param)


@pytest.mark.parametrize("prefill_chunk", [2048, 48])
def test_whole_equals_split_and_mlx_lm_batched_and_chunked(dense_dir, prefill_chunk):
    """Whole prompts in one batched prefill (2048) and prompts chunked (48), unpadded."""
    prompts = random_prompts(len(LENGTHS), 1024, LENGTHS, seed=prefill_chunk + 1)
    out = {}
    for arm in ("whole", "split"):
        eng = Engine.load(dense_dir, prefill_chunk=prefill_chunk, final_chunk=arm, pad_final_chunk=False)
        out[arm] = eng.generate(prompts, PARAMS)
        assert eng.runner.padded_tokens == 0
    assert_greedy_matches_mlx_lm(eng.model, prompts, out["whole"], 10)
    assert [r.token_ids for r in out["whole"]] == [r.token_ids for r in out["split"]]


def test_whole_prefix_hits_equal_split(model_dir):
    d = model_dir("llama")
    shared = random_prompts(1, 1024, [150], seed=21)[0]
    prompts = [shared + [7, 8, 9], shared + list(range(30, 90)), shared + [5]]

    def run(arm):
        eng = Engine.load(d, prefill_chunk=64, final_chunk=arm, max_total_tokens=8192)
        res = [eng.generate([p], PARAMS)[0] for p in prompts]
        return [r.token_ids for r in res], [r.cached_tokens for r in res], eng

    whole, hits, eng = run("whole")
    assert hits[0] == 0 and all(h >= 128 for h in hits[1:]), hits
    assert whole == [reference_greedy(eng.model, p, 10) for p in prompts]
    assert (whole, hits) == run("split")[:2]


@pytest.mark.parametrize("arch, sizes", [("gpt_oss", {"sliding_window": 8}), ("qwen3_next", {})])
def test_sliding_and_hybrid_whole_equals_split(model_dir, arch, sizes):
    d = model_dir(arch, **sizes)
    prompts = random_prompts(4, 1024, [5, 40, 1, 150], seed=12)
    out = {}
    for arm in ("whole", "split"):
        eng = Engine.load(d, prefill_chunk=16, max_total_tokens=4096, final_chunk=arm, pad_final_chunk=True)
        assert eng.runner.final_chunk.align == 0  # padding stays off: not exact here
        out[arm] = eng.generate(prompts, PARAMS)
    assert_greedy_matches_mlx_lm(eng.model, prompts, out["whole"], 10)
    assert [r.token_ids for r in out["whole"]] == [r.token_ids for r in out["split"]]


def test_prompt_logprobs_are_every_position_either_way(model_dir):
    d = model_dir("llama")
    prompt = random_prompts(1, 1024, [90], seed=5)[0]
    params = SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    a, b = (Engine.load(d, prefill_chunk=64, final_chunk=arm).generate([prompt], params)[0] for arm in ("whole", "split"))
    assert len(a.prompt_logprobs) == len(prompt) and a.token_ids == b.token_ids
    np.testing.assert_allclose([x["logprob"] for x in a.prompt_logprobs[1:]],
                               [x["logprob"] for x in b.prompt_logprobs[1:]], atol=1e-5, rtol=0)
