"""qwen3_next (gated-delta linear attention + full attention) on graphs/hybrid.yaml equals mlx-lm.

Reference: mlx-lm's forward with its ArraysCache (linear layers) and KVCache (full layers).
The recurrent state is batched across requests (merge / filter / extract along the batch
axis); prefix hits resume exactly at a state snapshot, or fall back to a shorter one.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from helpers import assert_chained_equals_unchained, assert_decode_logits_match, assert_generic_lowering_matches, assert_greedy_matches_mlx_lm, random_prompts, reference_greedy

LOGIT_ATOL = 2e-4


@pytest.fixture(scope="module")
def hybrid_dir(model_dir):
    return model_dir("qwen3_next")


@pytest.fixture(scope="module")
def engine(hybrid_dir):
    return Engine.load(hybrid_dir, prefill_chunk=16, max_total_tokens=4096)


def test_graph_and_policies(engine):
    assert engine.compiled.spec.name == "hybrid"
    names = {(l.kind, p.name) for l, p in zip(engine.compiled.binding.layers, engine.compiled.binding.policies)}
    assert names == {("linear_attention", "ssm_state"), ("full_attention", "pool_backed")}
    assert all(p.bytes_per_request(32768) == l.state_bytes > 0
               for l, p in zip(engine.compiled.binding.layers, engine.compiled.binding.policies)
               if p.name == "ssm_state")
    b = engine.compiled.binding  # the layers whose caches count positions, found at bind time
    assert b.folding_layers == tuple(i for i, p in enumerate(b.policies) if p.name == "ssm_state")


def test_batched_greedy_matches_mlx_lm(engine):
    prompts = random_prompts(6, engine.vocab_size, [5, 40, 17, 1, 33, 70], seed=11)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (30, 12, 30, 25, 3, 30)]
    results = engine.generate(prompts, params)
    assert_greedy_matches_mlx_lm(engine.model, prompts, results, [sp.max_tokens for sp in params])


def test_last_position_logits_close_to_mlx_lm(engine):
    prompts = random_prompts(3, engine.vocab_size, [37, 5, 20], seed=3)
    assert_decode_logits_match(engine, prompts, LOGIT_ATOL)


def test_chained_and_unchained_give_identical_tokens(hybrid_dir):
    prompts = random_prompts(4, 1024, [4, 30, 19, 2], seed=21)
    assert_chained_equals_unchained(hybrid_dir, prompts, [30, 5, 17, 25], prefill_chunk=8, max_total_tokens=512)


def test_prefix_hits_resume_at_snapshots_and_equal_cold(hybrid_dir):
    rng = np.random.default_rng(7)
    shared = rng.integers(3, 1000, 45).tolist()
    prompts = [shared + rng.integers(3, 1000, k).tolist() for k in (6, 2, 30)]
    prompts.append(list(prompts[0]))  # full-prefix hit: snapshot at len - 1, one token recomputed
    prompts.append(shared[:40])  # ends between snapshots: falls back to the one at 32
    params = SamplingParams(max_tokens=15, ignore_eos=True)
    cold = Engine.load(hybrid_dir, prefill_chunk=16, prefix_cache=False).generate(prompts, params)
    eng = Engine.load(hybrid_dir, prefill_chunk=16, max_total_tokens=4096, snapshot_interval=16)
    warm = [eng.generate([p], params)[0] for p in prompts]
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    cached = [r.cached_tokens for r in warm]
    # Snapshots sit at multiples of 16, at len-1 and at len of each prompt, and at request ends;
    # the shared 45 tokens resume from the snapshot at 32.
    assert cached == [0, 32, 32, len(prompts[0]) - 1, 32], cached
    eng.prefix.check()
    follow = prompts[2] + warm[2].token_ids + [5, 6]
    [res] = eng.generate([follow], params)
    assert res.cached_tokens == len(prompts[2]) + len(warm[2].token_ids)
    assert res.token_ids == reference_greedy(eng.model, follow, 15)


def test_snapshot_limit_evicts_lru_and_hits_fall_back(hybrid_dir):
    """A tiny pool allows few snapshots: older ones are evicted, hits fall back, tokens stay exact."""
    eng = Engine.load(hybrid_dir, prefill_chunk=8, max_total_tokens=300)
    limit = eng.prefix.max_snapshots
    prompts = random_prompts(6, 1024, [30, 26, 41], seed=9)
    prompts += [p[:20] + [3, 4] for p in prompts[:3]]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for p in prompts:
        [res] = eng.generate([p], params)
        assert res.token_ids == reference_greedy(eng.model, p, 6)
        assert eng.prefix.n_snapshots <= limit
        eng.prefix.check()
    assert eng.cache_stats()["snapshot_evictions"] > 0


def test_generic_lowering_matches_mlx_lm(hybrid_dir):
    """The same model through its own forward (lowering="generic") instead of the fast path."""
    assert_generic_lowering_matches(hybrid_dir)
