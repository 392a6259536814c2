"""The generic lowering (the model's own forward on graphc's caches) equals mlx-lm on
architectures a hand-split forward gets wrong (see tests/generic_models.py for why each).

Reference: mlx-lm's generate_step / forward with its own caches, one prompt at a time.
graphc runs them batched (mixed lengths, past the sliding window), in small prefill chunks,
chained, and with prefix hits.
"""

from __future__ import annotations

import numpy as np
import pytest

from generic_models import make_tiny
from graphc.runtime import Engine, SamplingParams
from helpers import assert_chained_equals_unchained, assert_decode_logits_match, assert_greedy_matches_mlx_lm, random_prompts

ARCHS = ["gemma", "cohere", "phi", "gemma2", "gemma3", "baichuan_m1"]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    made = {}

    def get(model_type):
        if model_type not in made:
            made[model_type] = make_tiny(model_type, tmp_path_factory.mktemp(f"generic-{model_type}"))
        return made[model_type]

    return get


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_dir):
    return Engine.load(tiny_dir(request.param), prefill_chunk=8, max_total_tokens=4096)


def test_served_by_the_generic_lowering_after_a_passing_self_check(engine):
    b = engine.compiled.binding
    if b.model_type == "gemma3_text":  # the wrapper's text model: a fast-path type
        assert b.wrapper_type == "gemma3" and b.lowering == "fast"
    else:
        assert b.lowering == "generic" and [c.lowering for c in b.checks] == ["generic"]
    assert b.check.ok and b.check.max_abs_diff <= b.check.tolerance


def test_batched_chunked_greedy_matches_mlx_lm(engine):
    prompts = random_prompts(5, engine.vocab_size, [5, 30, 17, 1, 12], seed=3)
    results = engine.generate(prompts, SamplingParams(max_tokens=14, ignore_eos=True))
    assert_greedy_matches_mlx_lm(engine.model, prompts, results, 14)


def test_batched_decode_logits_match_mlx_lm(engine):
    prompts = random_prompts(3, engine.vocab_size, [21, 4, 13], seed=5)
    assert_decode_logits_match(engine, prompts, atol=2e-4, chunk=8)


def test_chained_equals_unchained(tiny_dir):
    d = tiny_dir("gemma2")
    prompts = random_prompts(3, 1024, [4, 19, 9], seed=8)
    assert_chained_equals_unchained(d, prompts, [12, 3, 9], prefill_chunk=8)


@pytest.mark.parametrize("arch", ["gemma2", "phi"])
def test_prefix_hits_equal_cold(tiny_dir, arch):
    d = tiny_dir(arch)
    rng = np.random.default_rng(2)
    shared = rng.integers(3, 1000, 30).tolist()
    prompts = [shared + rng.integers(3, 1000, k).tolist() for k in (5, 1, 11)] + [list(shared)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    cold = Engine.load(d, prefill_chunk=8, prefix_cache=False).generate(prompts, params)
    warm_engine = Engine.load(d, prefill_chunk=8, max_total_tokens=1024)
    assert warm_engine.prefix is not None
    warm = [warm_engine.generate([p], params)[0] for p in prompts]
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    assert all(r.cached_tokens >= 24 for r in warm[1:])


def test_cache_list_model_runs_without_prefix_reuse_and_says_why(tiny_dir):
    from graphc.compiler.inspect import inspect_plan

    eng = Engine.load(tiny_dir("baichuan_m1"), prefill_chunk=8)
    kinds = {l.kind for l in eng.compiled.binding.layers}
    assert kinds == {"cache_list"}
    assert eng.prefix is None
    text = inspect_plan(eng.compiled, "decode", trace=False)
    assert "prefix reuse off: layer 0's policy 'cache_list'" in text
    assert "cache_list(ssm_state, windowed(window=8))" in text


def test_prompt_logprobs_on_the_generic_path(tiny_dir):
    """Prompt logprobs read the model's own logits over the chunk (no adapter on this path)."""
    import mlx.core as mx

    from helpers import reference_logits

    eng = Engine.load(tiny_dir("cohere"), prefill_chunk=8, prefix_cache=False)
    p = random_prompts(1, 1024, [13], seed=4)[0]
    [r] = eng.generate([p], SamplingParams(max_tokens=1, prompt_logprobs=0))
    ref = reference_logits(eng.model, p)
    lp = ref - mx.logsumexp(ref, axis=-1, keepdims=True)
    want = [float(lp[i, p[i + 1]]) for i in range(len(p) - 1)]
    got = [e["logprob"] for e in r.prompt_logprobs[1:]]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_non_final_chunk_evaluates_the_cache_writes_not_the_head(model_dir):
    """MLX is lazy: what the runner evaluates for a non-final chunk on the generic path (the
    caches' arrays) must not depend on the model's logits, so the head is never computed."""
    import io
    import re

    import mlx.core as mx

    from graphc.compiler.lower import StepInputs

    eng = Engine.load(model_dir("llama"), lowering="generic", prefix_cache=False)
    emb = eng.model.model.embed_tokens  # the tied head is embed_tokens.as_linear: tag it with a marker op
    plain = emb.as_linear
    emb.as_linear = lambda x: mx.erfinv(mx.tanh(plain(x)) * 0.5)
    step = eng.compiled.prefill
    caches = [p.new_cache() for p in eng.compiled.binding.policies]
    ctx = step.forward(StepInputs(mx.array([[5, 6, 7, 8]], dtype=mx.int32), caches, final=False))

    def ops(*arrays):
        buf = io.StringIO()
        mx.export_to_dot(buf, *arrays)
        return re.findall(r'label ="([^"]+)"', buf.getvalue())

    filled, with_head = ops(*step.fill_targets(ctx)), ops(ctx.values[step.hidden_node])
    assert "ErfInv" in with_head and "ErfInv" not in filled
    assert filled.count("Matmul") < with_head.count("Matmul")  # nor the last layer's attention output and MLP
