"""Batched greedy decode equals mlx-lm token for token; logits match within float32 tolerance.

Reference: mlx_lm.generate.generate_step with mlx-lm's own KVCache, one prompt at a time.
"""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from helpers import assert_chained_equals_unchained, assert_decode_logits_match, assert_generic_lowering_matches, assert_greedy_matches_mlx_lm, random_prompts

# float32 tiny models: graphc runs the same mlx-lm modules, so differences come only from
# batching (left padding, masked columns) and chunking changing reduction order.
LOGIT_ATOL = 2e-4

ARCHS = ["llama", "qwen3"]


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, model_dir):
    return Engine.load(model_dir(request.param), prefill_chunk=16)


def test_batched_greedy_matches_mlx_lm(engine):
    # 8 prompts of different lengths, several longer than the prefill chunk (16).
    prompts = random_prompts(8, engine.vocab_size, [5, 40, 17, 1, 33, 9, 64, 2], seed=11)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    results = engine.generate(prompts, params)
    assert_greedy_matches_mlx_lm(engine.model, prompts, results, 64)
    assert all(res.finish_reason == "length" for res in results)


def test_decode_runs_one_forward_per_step_for_the_batch(engine):
    prompts = random_prompts(4, engine.vocab_size, [3, 20, 7, 12], seed=5)
    before = engine.runner.steps
    engine.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    # All four decode together: ~10 batched steps (+ a few while the later prompts are still being
    # prefilled, + a chained step queued past the end), not 40 as one forward per request would take.
    assert engine.runner.steps - before <= 15


def test_last_position_logits_close_to_mlx_lm(engine):
    """Prefill (chunked) then batched decode with left padding: logits match mlx-lm's full forward."""
    prompts = random_prompts(3, engine.vocab_size, [37, 5, 20], seed=3)
    assert_decode_logits_match(engine, prompts, LOGIT_ATOL)


def test_chained_and_unchained_give_identical_tokens(model_dir):
    d = model_dir("llama")
    prompts = random_prompts(5, 1024, [4, 30, 9, 18, 2], seed=21)
    chained = assert_chained_equals_unchained(d, prompts, [30, 5, 17, 1, 25], prefill_chunk=8)
    assert [len(r.token_ids) for r in chained] == [30, 5, 17, 1, 25]


@pytest.mark.parametrize("arch", ARCHS)
def test_generic_lowering_matches_mlx_lm(model_dir, arch):
    """The same model through its own forward (lowering="generic") instead of the fast path."""
    assert_generic_lowering_matches(model_dir(arch))
