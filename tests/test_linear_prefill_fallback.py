"""A chunked gated-delta form that fails the self-check falls back to mlx-lm's loop (compiler/compile.py).

On CUDA the prefill plan takes the chunked form by default. It rounds differently from mlx-lm's
per-position loop, and on some models (bf16 weights, mixtures of experts, float32 matmuls in
TF32) that compounds past the self-check's tolerance: the model was then refused outright, where
the same fast lowering on the loop is exact. These tests stand in for such a device: the plan is
made for a CUDA target while the check runs here, and the chunked form's matmuls are made to
round like TF32 (a 10-bit mantissa), which the float32 check's tolerance does not admit. An engine
that asks for the chunked form itself is checked against mlx-lm's forward with that recurrence.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest

import graphc.compiler.gated_delta_chunked as gdc
from graphc.compiler.compile import compile_graph
from graphc.compiler.errors import UnsupportedModel
from graphc.compiler.selfcheck_cache import _rebuild, _store
from graphc.compiler.target import Requested, Target

CHOICE = "linear attention (prompt chunks)"
CUDA = Target(device="cuda")


def _tf32(x):
    """float32 rounded to TF32's 10-bit mantissa (to nearest, ties away), as cuBLAS rounds its inputs."""
    bits = x.astype(mx.float32).view(mx.uint32)
    bits = (bits + mx.array(0x1000, mx.uint32)) & mx.array(0xFFFFE000, mx.uint32)
    return bits.view(mx.float32)


@pytest.fixture(scope="module")
def hybrid(model_dir):
    d = model_dir("qwen3_next")
    model, _ = mlx_lm.load(str(d))
    return model, json.loads((Path(d) / "config.json").read_text())


@pytest.fixture
def rounding_like_tf32(monkeypatch):
    monkeypatch.setattr(gdc, "matmul", lambda a, b: _tf32(a) @ _tf32(b))


def test_exact_chunked_form_keeps_the_cuda_default(hybrid):
    model, config = hybrid
    compiled = compile_graph(None, model, config, target=CUDA)
    c = compiled.plan("prefill").choice(CHOICE)
    assert c.choice == "chunked" and c.why.startswith("device is cuda:"), c
    assert [(k.lowering, k.linear_prefill, k.ok) for k in compiled.binding.checks] == [("fast", "chunked", True)]


def test_failed_chunked_form_retries_the_fast_lowering_on_the_loop(hybrid, rounding_like_tf32, tmp_path):
    model, config = hybrid
    compiled = compile_graph(None, model, config, target=CUDA)
    checks = compiled.binding.checks
    assert [(k.lowering, k.linear_prefill, k.ok) for k in checks] == [("fast", "chunked", False), ("fast", "mlx-lm", True)]
    assert compiled.binding.lowering == "fast" and compiled.binding.check is checks[-1]
    c = compiled.plan("prefill").choice(CHOICE)
    assert c.choice == "mlx-lm" and "failed this model's self-check" in c.why and "chunked gated-delta" in c.why, c
    # A stored verdict rebuilds the same plan: the failed check travels with it.
    path = tmp_path / "verdict.json"
    _store(path, compiled)
    rebuilt = _rebuild(json.loads(path.read_text()), None, model, config, None, None, CUDA, Requested())
    assert rebuilt.plan("prefill").choice(CHOICE).choice == "mlx-lm"


def test_explicit_chunked_is_checked_against_mlx_lm_with_the_chunked_recurrence(hybrid, rounding_like_tf32):
    """An engine that asks for the chunked form accepts its rounding: past the tolerance against the
    loop, it is checked against mlx-lm's own forward with the same recurrence in its layers."""
    model, config = hybrid
    compiled = compile_graph(None, model, config, lowering="fast", target=CUDA,
                             requested=Requested(linear_prefill="chunked"))
    checks = compiled.binding.checks
    assert [(k.linear_prefill, k.reference, k.ok) for k in checks] == [
        ("chunked", None, False), ("chunked", "mlx-lm's forward with the chunked recurrence", True)]
    assert "against mlx-lm's forward with the chunked recurrence" in checks[-1].describe()
    c = compiled.plan("prefill").choice(CHOICE)
    assert c.choice == "chunked" and "rounds past the self-check's tolerance" in c.why, c
    # the model's own layers are back in place once the reference has run
    assert all(type(layer.linear_attn).__name__ == "Qwen3NextGatedDeltaNet"
               for layer in model.layers if hasattr(layer, "linear_attn"))


def test_the_chunked_reference_still_catches_the_engines_own_bugs(hybrid, monkeypatch):
    """The check against the chunked reference is not a check against itself: the reference runs each
    prompt in one forward from an empty state, graphc in chunks of 4 carrying its state. A chunked
    form that drops the state it is handed (a caching bug) is refused."""
    model, config = hybrid
    real = gdc.gated_delta_chunked

    def forgets_state(q, k, v, g, beta, state=None, mask=None, chunk=gdc.CHUNK):
        return real(_tf32(q), k, v, g, beta, None, mask, chunk)  # also past the loop's tolerance

    monkeypatch.setattr("graphc.compiler.gated_delta_layer.gated_delta_chunked", forgets_state)
    with pytest.raises(UnsupportedModel, match="no lowering reproduces"):
        compile_graph(None, model, config, lowering="fast", target=CUDA, requested=Requested(linear_prefill="chunked"))


def test_the_cpu_default_never_tries_the_chunked_form(hybrid, rounding_like_tf32):
    model, config = hybrid
    compiled = compile_graph(None, model, config, target=Target(device="cpu"))
    assert [(k.lowering, k.linear_prefill, k.ok) for k in compiled.binding.checks] == [("fast", "mlx-lm", True)]
