"""Compiled decode steps whose fused llama blocks add each residual inside the o_proj / down_proj
matmul (decode option `residual_matmul`: `_FixedKV.plus_matmul`, `mx.addmm`, cuBLAS's C input on
CUDA): two add launches a layer fewer. It is on only on CUDA, where the compiled step's numbers
already differ from mlx-lm's by rounding; on the CPU the step keeps mlx-lm's exact adds. Here
the device test is switched on by hand to run the path on the CPU."""

from __future__ import annotations

import mlx.core as mx

from graphc.runtime import Engine, SamplingParams
from graphc.runtime import compiled_decode_kv as cdkv
from helpers import random_prompts, reference_greedy

PLAIN = SamplingParams(max_tokens=12, ignore_eos=True)


def _compile_pass(eng) -> str:
    return dict(eng.compiled.plan("decode").passes)["compile"]


def test_off_on_the_cpu_and_the_plan_says_why(model_dir):
    eng = Engine.load(model_dir("llama"), compile=True)
    assert not eng.compiled.decode.residual
    assert "residual adds: off (not a CUDA device: mlx-lm's own adds, bit for bit)" in _compile_pass(eng)


def test_the_adds_run_inside_the_matmuls_and_tokens_stay_mlx_lms(model_dir, monkeypatch):
    """Rows of different lengths: every fused layer's two residuals go through `mx.addmm`, no
    separate add, and greedy tokens are mlx-lm's (on the CPU the rounding happens to agree on
    this model; on CUDA cuBLAS rounds once instead of twice, which the bench's `exact` workload
    counts)."""
    monkeypatch.setattr(cdkv, "on_cuda", lambda: True)
    calls = []
    addmm = mx.addmm

    def spy(c, a, b, *args, **kw):
        calls.append(c.shape)
        return addmm(c, a, b, *args, **kw)

    monkeypatch.setattr(mx, "addmm", spy)
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, compile=True)
    assert eng.compiled.decode.residual and "residual adds: on (mx.addmm)" in _compile_pass(eng)
    prompts = random_prompts(3, eng.vocab_size, [5, 17, 9], seed=2)
    out = eng.generate(prompts, PLAIN)
    assert [r.token_ids for r in out] == [reference_greedy(eng.model, p, PLAIN.max_tokens) for p in prompts]
    layers = len(eng.compiled.decode.fused)
    assert eng.compiled.decode.compiled_steps > 0 and layers > 0
    assert calls and len(calls) % (2 * layers) == 0  # each trace: two per fused layer


def test_the_option_and_the_skinny_matmul_switch_it_off(model_dir, monkeypatch):
    monkeypatch.setattr(cdkv, "on_cuda", lambda: True)
    eng = Engine.load(model_dir("llama"), compile=True, decode_options={"residual_matmul": False})
    assert not eng.compiled.decode.residual
    assert "residual adds: off;" in _compile_pass(eng)  # switched off, as the other options say it
    # the skinny matmul kernel serves the projections: it has no C input, so the adds stay adds
    from graphc.runtime.kernels import skinny_matmul

    monkeypatch.setattr(skinny_matmul, "check", lambda seed=0: None)
    eng = Engine.load(model_dir("llama"), compile=True, skinny_gemm=True)
    assert eng.compiled.decode.skinny and not eng.compiled.decode.residual
    assert "residual adds: off (the skinny matmul serves the projections)" in _compile_pass(eng)
