"""A chunked gated-delta form that fails the self-check falls back to mlx-lm's loop (compiler/compile.py).

On CUDA the prefill plan takes the chunked form by default. It rounds differently from mlx-lm's
per-position loop, and on some models (bf16 weights, mixtures of experts, float32 matmuls in
TF32) that compounds past the self-check's tolerance: the model was then refused outright, where
the same fast lowering on the loop is exact. These tests stand in for such a device: the plan is
made for a CUDA target while the check runs here, and the chunked form's matmuls are made to
round like TF32 (a 10-bit mantissa), which the float32 check's tolerance does not admit.
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
    monkeypatch.setattr(gdc, "_mm", lambda a, b: _tf32(a) @ _tf32(b))


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


def test_explicit_chunked_is_refused_with_what_to_ask_instead(hybrid, rounding_like_tf32):
    model, config = hybrid
    with pytest.raises(UnsupportedModel, match="linear_prefill='auto' or 'mlx-lm'"):
        compile_graph(None, model, config, lowering="fast", target=CUDA, requested=Requested(linear_prefill="chunked"))


def test_the_cpu_default_never_tries_the_chunked_form(hybrid, rounding_like_tf32):
    model, config = hybrid
    compiled = compile_graph(None, model, config, target=Target(device="cpu"))
    assert [(k.lowering, k.linear_prefill, k.ok) for k in compiled.binding.checks] == [("fast", "mlx-lm", True)]
