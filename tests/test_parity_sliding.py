"""Sliding-window models (gpt-oss with attention sinks, gemma 3) on graphs/sliding.yaml equal mlx-lm.

Reference: mlx-lm's own forward with its RotatingKVCache (window) and KVCache (full), one
prompt at a time. Prompts run far past the window (8), in small prefill chunks, batched with
mixed lengths and decoded past the window again; prefix hits must give the same tokens as cold.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from helpers import assert_chained_equals_unchained, assert_decode_logits_match, assert_generic_lowering_matches, assert_greedy_matches_mlx_lm, random_prompts, reference_greedy

LOGIT_ATOL = 2e-4
WINDOW = 8
ARCHS = ["gpt_oss", "gemma3_text"]


@pytest.fixture(scope="module", params=ARCHS)
def sliding_dir(request, model_dir):
    return model_dir(request.param, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def engine(sliding_dir):
    return Engine.load(sliding_dir, prefill_chunk=16, max_total_tokens=4096)


def test_graph_and_policies(engine):
    assert engine.compiled.spec.name == "sliding"
    kinds = {(l.kind, p.name) for l, p in zip(engine.compiled.binding.layers, engine.compiled.binding.policies)}
    assert kinds == {("sliding_attention", "windowed"), ("full_attention", "pool_backed")}


def test_batched_greedy_matches_mlx_lm(engine):
    # Mixed lengths, most far longer than the window; 40 decode steps run past it again.
    prompts = random_prompts(7, engine.vocab_size, [5, 40, 17, 1, 33, 90, 9], seed=11)
    results = engine.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    assert_greedy_matches_mlx_lm(engine.model, prompts, results, 40)


@pytest.mark.parametrize("chunk", [3, 8, 64])
def test_chunked_prefill_matches_mlx_lm(sliding_dir, chunk):
    eng = Engine.load(sliding_dir, prefill_chunk=chunk, prefix_cache=False)
    prompts = random_prompts(3, eng.vocab_size, [29, 7, 50], seed=chunk)
    results = eng.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert_greedy_matches_mlx_lm(eng.model, prompts, results, 12)


def test_last_position_logits_close_to_mlx_lm(engine):
    """Chunked prefill then one left-padded batched decode step: logits match mlx-lm."""
    prompts = random_prompts(3, engine.vocab_size, [37, 5, 20], seed=3)
    assert_decode_logits_match(engine, prompts, LOGIT_ATOL)


def test_chained_and_unchained_give_identical_tokens(sliding_dir):
    prompts = random_prompts(4, 1024, [4, 30, 19, 2], seed=21)
    assert_chained_equals_unchained(sliding_dir, prompts, [30, 5, 17, 25], prefill_chunk=8, max_total_tokens=512)


def test_prefix_hits_equal_cold_and_save_prefill(sliding_dir):
    """Shared 60-token prefix (window 8): hits restore each sliding layer's last window
    positions and compute only the suffix; tokens equal a cold engine's."""
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 1000, 60).tolist()
    prompts = [shared + rng.integers(3, 1000, k).tolist() for k in (7, 1, 23)]
    prompts.append(list(prompts[0]))  # a full-prefix hit: only the last token is recomputed
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    cold = Engine.load(sliding_dir, prefill_chunk=16, prefix_cache=False).generate(prompts, params)
    warm_engine = Engine.load(sliding_dir, prefill_chunk=16, max_total_tokens=1024)
    warm = [warm_engine.generate([p], params)[0] for p in prompts]
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    cached = [r.cached_tokens for r in warm]
    assert cached[0] == 0 and cached[3] == len(prompts[0]) - 1
    # Sliding KV is kept for the window before boundaries (every `prefix_interval` = chunk = 16
    # tokens, and prompt / request ends), so a hit inside the shared 60 resumes at most 16 back.
    assert all(60 - 16 <= c <= 60 for c in cached[1:3]), cached
    st = warm_engine.stats
    assert st["computed_prompt_tokens"] == st["prompt_tokens"] - sum(cached)
    warm_engine.prefix.check()
    # Multi-turn: the next prompt continues a finished request's output; it resumes at its end.
    follow = prompts[1] + warm[1].token_ids + [11, 12, 13]
    [res] = warm_engine.generate([follow], params)
    assert res.cached_tokens == len(prompts[1]) + len(warm[1].token_ids)
    assert res.token_ids == reference_greedy(warm_engine.model, follow, 20)
    warm_engine.prefix.check()


def test_windowed_request_bytes_stay_constant_past_the_window(sliding_dir):
    eng = Engine.load(sliding_dir, prefill_chunk=8, max_total_tokens=512)
    eng.add_request(random_prompts(1, 1024, [20], seed=1)[0], SamplingParams(max_tokens=60, ignore_eos=True))
    sizes = []
    windowed = [i for i, p in enumerate(eng.compiled.binding.policies) if p.name == "windowed"]
    while eng.has_unfinished():
        eng.step()
        if eng.runner.caches is not None:
            sizes.append(sum(eng.runner.caches[i].nbytes for i in windowed))
    # Context runs from 20 to 80 tokens; the windowed layers hold exactly 2 x window columns throughout.
    info = eng.compiled.binding.layers[windowed[0]]
    assert set(sizes) == {len(windowed) * 2 * WINDOW * info.kv_bytes_per_token}


def test_inspect_memory_table_shows_windowed_vs_full(engine):
    from graphc.compiler.inspect import inspect_plan, memory_table

    table = memory_table(engine.compiled)
    assert table["columns"] == ["as bound", "all full", "sliding, bound", "sliding if full"]
    sliding = [l for l in engine.compiled.binding.layers if l.kind == "sliding_attention"]
    steady = sum(2 * WINDOW * l.kv_bytes_per_token for l in sliding)
    for row in table["rows"]:
        bound, full, s_bound, s_full = row["values"]
        assert s_bound == steady  # the same at 8k and 32k: bounded by the window
        assert s_full == sum(l.kv_bytes_per_token for l in sliding) * row["context"]
        assert full - bound == s_full - s_bound
    assert "sliding if full" in inspect_plan(engine.compiled, "decode", trace=False)


def test_prompt_logprobs_unchanged_by_the_prefix_cache(sliding_dir):
    """Requests asking for prompt logprobs skip the match and are prefilled in whole chunks."""
    [p] = random_prompts(1, 1024, [45], seed=17)
    params = SamplingParams(max_tokens=3, prompt_logprobs=2, ignore_eos=True)
    plain = Engine.load(sliding_dir, prefill_chunk=16, prefix_cache=False).generate([p], params)[0]
    eng = Engine.load(sliding_dir, prefill_chunk=16, max_total_tokens=512)
    eng.generate([p], SamplingParams(max_tokens=3, ignore_eos=True))  # now cached
    got = eng.generate([p], params)[0]
    assert got.cached_tokens == 0 and got.token_ids == plain.token_ids
    assert len(got.prompt_logprobs) == len(p)
    for a, b in zip(got.prompt_logprobs[1:], plain.prompt_logprobs[1:]):
        assert a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_generic_lowering_matches_mlx_lm(model_dir, arch):
    """The same model through its own forward (lowering="generic") instead of the fast path."""
    assert_generic_lowering_matches(model_dir(arch, sliding_window=WINDOW))
