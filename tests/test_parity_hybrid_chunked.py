"""qwen3_next with its gated-delta prompt chunks chunkwise (Engine(linear_prefill="chunked")) against mlx-lm.

mlx-lm's own forward on the CPU runs gated_delta_ops, the per-position loop; graphc's chunked
form (compiler/gated_delta_chunked.py) equals it to float32 rounding, not bit for bit
(tests/test_gated_delta_chunked.py). So logits are compared within a tolerance and greedy tokens
for equality, on prompts that cross the 64-position chunks of the recurrence and the engine's
prefill chunks. The default on the CPU stays mlx-lm's loop (tests/test_parity_hybrid.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx_lm.models.qwen3_next as qwen3_next
import numpy as np
import pytest

from graphc.compiler.lower import StepInputs
from graphc.runtime import Engine, SamplingParams
from helpers import assert_greedy_matches_mlx_lm, random_prompts, reference_logits

CHOICE = "linear attention (prompt chunks)"
# float32 model: the recurrence differs from the loop by ~1e-6 of its values; after the rest of
# the model the logits (|logit| ~ 1) moved by ~1e-5 at most. 2e-4 is test_parity_hybrid's bound.
LOGIT_ATOL = 2e-4


@pytest.fixture(scope="module")
def hybrid_dir(model_dir):
    return model_dir("qwen3_next")


@pytest.fixture(scope="module")
def engine(hybrid_dir):
    return Engine.load(hybrid_dir, prefill_chunk=96, max_total_tokens=8192, linear_prefill="chunked")


def test_the_plan_says_chunked_and_the_cpu_default_is_mlx_lm(engine, hybrid_dir):
    assert engine.compiled.plan("prefill").choice(CHOICE).choice == "chunked"
    assert engine.compiled.plan("decode").choice(CHOICE) is None  # decode steps are mlx-lm's own
    default = Engine.load(hybrid_dir, prefill_chunk=96)
    c = default.compiled.plan("prefill").choice(CHOICE)
    assert c.choice == "mlx-lm" and "device is cpu" in c.why, c


def test_prompt_chunks_never_reach_mlx_lms_loop(engine, monkeypatch):
    """The chunked plan runs no gated_delta_update over more than one position (decode steps do)."""
    real = qwen3_next.gated_delta_update

    def only_single_positions(q, *a, **kw):
        assert q.shape[1] == 1, f"a prompt chunk of {q.shape[1]} positions reached mlx-lm's recurrence"
        return real(q, *a, **kw)

    monkeypatch.setattr(qwen3_next, "gated_delta_update", only_single_positions)
    [p] = random_prompts(1, engine.vocab_size, [150], seed=5)
    engine.generate([p], SamplingParams(max_tokens=3, ignore_eos=True))


@pytest.mark.parametrize("length", [5, 64, 65, 150, 300])
def test_logits_close_to_mlx_lm(engine, length):
    """A prompt prefilled in chunks of 96 (so the recurrence's 64-position chunks and the engine's
    fall differently), then one decode step: the last position's logits of each against mlx-lm's
    one forward over the same tokens."""
    [p] = random_prompts(1, engine.vocab_size, [length], seed=length)
    caches = [pol.new_cache() for pol in engine.compiled.binding.policies]
    for a in range(0, length, 96):
        end = min(length, a + 96)
        out = engine.compiled.prefill(StepInputs(mx.array(p[a:end], dtype=mx.int32)[None], caches,
                                                 final=end == length))
    prefill_err = np.abs(np.array(out.logits[0]) - np.array(reference_logits(engine.model, p)[-1])).max()
    step = engine.compiled.decode(StepInputs(mx.array([[7]], dtype=mx.int32), caches))
    decode_err = np.abs(np.array(step.logits[0]) - np.array(reference_logits(engine.model, p + [7])[-1])).max()
    assert prefill_err < LOGIT_ATOL and decode_err < LOGIT_ATOL, (prefill_err, decode_err)


def test_greedy_tokens_equal_mlx_lm(engine):
    prompts = random_prompts(4, engine.vocab_size, [70, 129, 250, 17], seed=23)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (20, 20, 12, 20)]
    results = engine.generate(prompts, params)
    assert_greedy_matches_mlx_lm(engine.model, prompts, results, [sp.max_tokens for sp in params])
