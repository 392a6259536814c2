"""One layer's decode attention over quantized KV (runtime/kernels/quantized_attention.py) against
bf16 KV, rows of equal length: MLX's fused one-query attention on bf16 (what an eager step of rows
that started together runs), graphc's ragged bf16 kernel (grouped and vec), and the quantized
kernel's two kinds at 8 and 4 bits, the vec kind at each of CONFIGS (warps, keys a lane per trip,
codes a lane; the first is the one that serves at the shape's head dim, qa.vec_config). First the
quantized kernel's own check (both kinds) here. µs per call: 32 calls a graph over 8 distinct K/V sets
(benchmarks/probes/kernel_bench.py).

    python benchmarks/probes/quantized_decode.py [SHAPE 1b|8b] [BATCH 64] [COLUMNS 1024] [REPS 15]
"""
import sys

import mlx.core as mx

from graphc.runtime.kernels import decode_attention as da
from graphc.runtime.kernels import quantized_attention as qa
from kernel_bench import timed  # benchmarks/probes/kernel_bench.py (run from this folder's path)

SHAPES = {"8b": (32, 8, 128), "1b": (32, 8, 64)}  # query heads, KV heads, head dim
shape = sys.argv[1] if len(sys.argv) > 1 else "1b"
B = int(sys.argv[2]) if len(sys.argv) > 2 else 64
C = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 15
Hq, Hkv, D = SHAPES[shape]
CONFIGS = (qa.vec_config(D), *qa.VEC_CONFIGS)
scale = D ** -0.5

print(f"{shape}: {Hq} query heads, {Hkv} KV heads, D={D}, batch {B}, {C} columns; {mx.default_device()}", flush=True)
print(f"check: {qa.check()}; vec kind: {qa.KERNEL.vec_ok}", flush=True)
qs = [mx.random.normal((B, Hq, 1, D), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(8)]
kb = [mx.random.normal((B, Hkv, C, D), key=mx.random.key(100 + i)).astype(mx.bfloat16) for i in range(8)]
vb = [mx.random.normal((B, Hkv, C, D), key=mx.random.key(200 + i)).astype(mx.bfloat16) for i in range(8)]
start, end = mx.zeros((B,), dtype=mx.int32), mx.array([C], dtype=mx.int32)
mx.eval(qs, kb, vb)
row = {"mlx fused bf16": timed(lambda: [mx.fast.scaled_dot_product_attention(qs[i % 8], kb[i % 8], vb[i % 8], scale=scale)
                                        for i in range(32)], reps)}
for kind in ("grouped", "vec"):
    row[f"ragged bf16 {kind}"] = timed(lambda kind=kind: [da.ragged_attention(qs[i % 8], kb[i % 8], vb[i % 8], start, end,
                                                                              scale, kind=kind) for i in range(32)], reps)
for bits in (8, 4):
    planes = [(*mx.quantize(kb[i], group_size=64, bits=bits), *mx.quantize(vb[i], group_size=64, bits=bits)) for i in range(8)]
    mx.eval(planes)
    want = qa.reference(qs[0].astype(mx.float32), planes[0], start, end, scale, 64, bits)
    for kind, config in [("grouped", None)] + [("vec", c) for c in dict.fromkeys(CONFIGS)]:
        name = f"quantized {bits}-bit {kind}" + (f" {config}" if config else "")
        if config and not qa.vec_fits(Hq, Hkv, D, config[2]):
            continue
        try:
            got = qa.KERNEL.attend(qs[0], planes[0], start, end, scale, 64, bits, kind=kind, config=config)
            err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
        except Exception as e:  # noqa: BLE001 - a config that does not build: say so, go on
            print(f"  {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        row[f"{name} (err {err:.1e})"] = timed(
            lambda kind=kind, planes=planes, bits=bits, config=config: [
                qa.KERNEL.attend(qs[i % 8], planes[i % 8], start, end, scale, 64, bits, kind=kind, config=config)
                for i in range(32)], reps)
base = row["mlx fused bf16"]
for name, us in row.items():
    print(f"  {name:40s} {us:8.1f} us   {us / base:5.2f}x mlx fused bf16", flush=True)
