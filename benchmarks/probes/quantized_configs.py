"""Which vec-kind config of the quantized attention kernel (runtime/kernels/quantized_attention.py
vec_config: warps a block, keys a lane per trip, codes a lane) makes the whole decode step with 8-bit
KV fastest against bf16 KV, in one run: each config's one-layer kernel time at the shape (as
quantized_decode.py times it), then the engine's eager decode step (benchmarks/kv_quantized.py
`speed`, bf16 and 8-bit arms interleaved) for the serving config and the TOP fastest others, each
with the shape's head dim set to it (VEC_CONFIG_BY_DIM) for that engine's whole life (its in-process
check included).

    python benchmarks/probes/quantized_configs.py [SHAPE llama-3.1-8b] [BATCH 64] [PROMPT 2048] [TOP 2]
"""
import gc
import json
import sys

import mlx.core as mx

from graphc.benchmarks.kv_quantized import speed
from graphc.benchmarks.shapes import SHAPES, load_shape
from graphc.runtime.kernels import decode_attention as da
from graphc.runtime.kernels import quantized_attention as qa
from kernel_bench import timed  # benchmarks/probes/kernel_bench.py (run from this folder's path)

CONFIGS = qa.VEC_CONFIGS

shape = sys.argv[1] if len(sys.argv) > 1 else "llama-3.1-8b"
B = int(sys.argv[2]) if len(sys.argv) > 2 else 64
C = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
top = int(sys.argv[4]) if len(sys.argv) > 4 else 2
cfg = SHAPES[shape]
Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
D = cfg.get("head_dim") or cfg["hidden_size"] // Hq
scale = D ** -0.5
serving = qa.vec_config(D)
by_dim = dict(qa.VEC_CONFIG_BY_DIM)
print(f"{shape}: {Hq}/{Hkv} heads, D={D}, batch {B}, {C} columns; serving config {serving}; {mx.default_device()}",
      flush=True)

qs = [mx.random.normal((B, Hq, 1, D), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(8)]
planes, kv = [], []
for i in range(8):
    k = mx.random.normal((B, Hkv, C, D), key=mx.random.key(100 + i)).astype(mx.bfloat16)
    v = mx.random.normal((B, Hkv, C, D), key=mx.random.key(200 + i)).astype(mx.bfloat16)
    planes.append((*mx.quantize(k, group_size=64, bits=8), *mx.quantize(v, group_size=64, bits=8)))
    kv.append((k, v))
    mx.eval(planes[-1], kv[-1])
start, end = mx.zeros((B,), dtype=mx.int32), mx.array([C], dtype=mx.int32)
want = qa.reference(qs[0].astype(mx.float32), planes[0], start, end, scale, 64, 8)
bf16_us = {"mlx fused bf16": timed(lambda: [mx.fast.scaled_dot_product_attention(qs[i % 8], *kv[i % 8], scale=scale)
                                            for i in range(32)], 15),
           "ragged bf16 vec": timed(lambda: [da.ragged_attention(qs[i % 8], *kv[i % 8], start, end, scale, kind="vec")
                                             for i in range(32)], 15)}
for name, us in bf16_us.items():
    print(f"  kernel {name}: {us:.1f} us a layer", flush=True)
del kv
kernel_us = {}
for c in CONFIGS:
    if not qa.vec_fits(Hq, Hkv, D, c[2]):
        continue
    try:
        err = mx.max(mx.abs(qa.KERNEL.attend(qs[0], planes[0], start, end, scale, 64, 8, kind="vec", config=c)
                            .astype(mx.float32) - want)).item()
    except Exception as e:  # noqa: BLE001 - a config that does not build: say so, go on
        print(f"  {c}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        continue
    if not err < 2e-2:
        print(f"  {c}: differs from the reference by {err:.3g}; not timed", flush=True)
        continue
    kernel_us[c] = timed(lambda c=c: [qa.KERNEL.attend(qs[i % 8], planes[i % 8], start, end, scale, 64, 8, kind="vec",
                                                       config=c) for i in range(32)], 15)
    print(f"  kernel {c}: {kernel_us[c]:.1f} us a layer (err {err:.1e})", flush=True)
del planes, qs
gc.collect()

ranked = sorted(kernel_us, key=kernel_us.get)
arms = list(dict.fromkeys([serving] + [c for c in ranked if c != serving][:top]))
model, tokenizer, config, _ = load_shape(shape)
steps = {}
for c in arms:
    qa.VEC_CONFIG_BY_DIM = {**by_dim, D: c}
    r = speed(model, tokenizer, config, B, C, 64, 3, bits=(8,), compile_modes=(False,), mlx_lm_arms=False)
    steps[str(c)] = {"kernel_us": round(kernel_us.get(c, float("nan")), 1), "step_ms": r["step_ms_median"],
                     "8bit_over_bf16": r["ratios"]["eager_8bit_over_bf16"]}
    print(f"  step {c}: {json.dumps(steps[str(c)])}", flush=True)
    gc.collect()
qa.VEC_CONFIG_BY_DIM = by_dim
print(json.dumps({"shape": shape, "batch": B, "columns": C,
                  "bf16_kernel_us": {k: round(v, 1) for k, v in bf16_us.items()},
                  "kernel_us": {str(k): round(v, 1) for k, v in kernel_us.items()},
                  "steps": steps}, indent=1))
