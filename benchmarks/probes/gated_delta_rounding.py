"""How far the chunked gated-delta form (compiler/gated_delta_chunked.py) lands from mlx-lm's
per-position loop when its float32 matmuls round like TF32 (MLX's CUDA default,
MLX_ENABLE_TF32=1) or like bf16 — emulated on any device by rounding the matmul inputs.

    python benchmarks/probes/gated_delta_rounding.py [--lengths 256,1024]
        recurrence only, at qwen3-next-2b's gated-delta heads (16 key / 32 value heads of 128)
    python benchmarks/probes/gated_delta_rounding.py --selfcheck [--layers 8]
        graphc's load-time self-check on a dense bf16 cut of qwen3-next-2b (its MLP in place of the
        experts: MLX's CPU gather_mm is float32 only), prompt chunks chunked (float32, TF32) and on
        the loop

Why: on the H200 the chunked form failed the self-check of the bench's bf16 qwen3-next-2b
(docs/cpu-prefill.md#hybrid-models), where the loop had passed.
"""

from __future__ import annotations

import argparse
import logging

import mlx.core as mx
from mlx_lm.models.gated_delta import gated_delta_ops

import graphc.compiler.gated_delta_chunked as gdc
from graphc.benchmarks.shapes import SHAPES, IdTokenizer, random_model
from graphc.runtime import Engine


def tf32(x):
    """float32 rounded to a 10-bit mantissa, to nearest with ties away (cvt.rna.tf32.f32)."""
    bits = x.astype(mx.float32).view(mx.uint32)
    return ((bits + mx.array(0x1000, mx.uint32)) & mx.array(0xFFFFE000, mx.uint32)).view(mx.float32)


ROUNDINGS = {
    "float32": lambda a, b: a @ b,
    "tf32": lambda a, b: tf32(a) @ tf32(b),
    "bf16": lambda a, b: (a.astype(mx.bfloat16) @ b.astype(mx.bfloat16)).astype(mx.float32),
}


def recurrence(lengths: list[int]) -> None:
    mx.random.seed(0)
    B, Hk, Hv, D = 1, 16, 32, 128
    for T in lengths:
        q, k = mx.random.normal((B, T, Hk, D)), mx.random.normal((B, T, Hk, D))
        # as qwen3_next feeds them: RMS-normalized and scaled q and k, softplus decays, sigmoid betas
        q = D ** -1.0 * q * mx.rsqrt((q * q).mean(-1, keepdims=True) + 1e-6)
        k = D ** -0.5 * k * mx.rsqrt((k * k).mean(-1, keepdims=True) + 1e-6)
        v = mx.random.normal((B, T, Hv, D))
        A = mx.random.uniform(1, 16, (Hv,))
        g = mx.exp(-A * mx.logaddexp(mx.random.normal((B, T, Hv)), 0))
        beta = mx.sigmoid(mx.random.normal((B, T, Hv)))
        y0, s0 = gated_delta_ops(q, k, v, g, beta, mx.zeros((B, Hv, D, D)))
        scale = mx.abs(y0).max().item()
        for name, mm in ROUNDINGS.items():
            gdc.matmul = mm
            y, s = gdc.gated_delta_chunked(q, k, v, g, beta)
            print(f"T={T:5d} matmuls as {name:7s}: outputs off the loop by {mx.abs(y - y0).max().item() / scale:.2e} "
                  f"of their largest, states by {mx.abs(s - s0).max().item():.2e}", flush=True)


def selfcheck(layers: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    cfg = dict(SHAPES["qwen3-next-2b"], num_hidden_layers=layers, mlp_only_layers=list(range(layers)))
    model = random_model(cfg, mx.bfloat16)
    for arm, rounding in (("chunked", "float32"), ("chunked", "tf32"), ("mlx-lm", "float32")):
        gdc.matmul = ROUNDINGS[rounding]
        eng = Engine(model, IdTokenizer(), cfg, linear_prefill=arm, prefix_cache=False)
        check = eng.compiled.binding.check
        print(f"prompt chunks {arm:7s} (matmuls as {rounding}): {check.describe()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="256,1024")
    ap.add_argument("--selfcheck", action="store_true")
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    if a.selfcheck:
        selfcheck(a.layers)
    else:
        recurrence([int(n) for n in a.lengths.split(",")])


if __name__ == "__main__":
    main()
