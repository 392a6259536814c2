"""Eager decode attention over rows of mixed lengths (the serving mix): the ragged kernel against
MLX's masked attention, by batch.

Rows that joined at different lengths decode left-padded to the longest: MLX's attention reads
every row's padding (and takes an array mask), the ragged kernel (runtime/kernels/decode_attention.py)
reads each row's own columns (runtime/kernel_views.py: every padded eager decode step takes it).
Rows at the serving bench's lengths (lognormal 64-4096 prompt tokens, as
graphc.benchmarks.serving.workload draws them) and rows of one length padded alike. µs per call: 32 calls a graph over 8 distinct K/V sets (benchmarks/probes/kernel_bench.py).

    python benchmarks/probes/ragged_decode.py [SHAPE 1b|8b] [BATCHES 16,32,64] [REPS 15]
"""
import math
import random
import sys

import mlx.core as mx

from graphc.runtime.kernels import decode_attention as da
from kernel_bench import timed  # benchmarks/probes/kernel_bench.py (run from this folder's path)

SHAPES = {"8b": (32, 8, 128), "1b": (32, 8, 64)}  # query heads, KV heads, head dim
shape = sys.argv[1] if len(sys.argv) > 1 else "1b"
batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,32,64").split(",")]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 15
Hq, Hkv, D = SHAPES[shape]


def mixed_lengths(B: int, seed: int = 0) -> list[int]:
    """Prompt lengths lognormal between 64 and 4096 (median ~512), plus a few decoded tokens."""
    rnd = random.Random(seed)
    lo, hi = math.log(64), math.log(4096)
    return [int(min(4096, max(64, math.exp(rnd.gauss((lo + hi) / 2, (hi - lo) / 4))))) + 40 for _ in range(B)]


def case(B: int, lengths: list[int]):
    C = -(-max(lengths) // 256) * 256
    start = mx.array([C - n for n in lengths], dtype=mx.int32)  # left-padded: row b's columns start[b] .. C-1
    end = mx.array([C], dtype=mx.int32)
    qs = [mx.random.normal((B, Hq, 1, D), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(8)]
    kb = [mx.random.normal((B, Hkv, C, D), key=mx.random.key(100 + i)).astype(mx.bfloat16) for i in range(8)]
    vb = [mx.random.normal((B, Hkv, C, D), key=mx.random.key(200 + i)).astype(mx.bfloat16) for i in range(8)]
    mask = (mx.arange(C)[None] >= start[:, None])[:, None, None]  # [B, 1, 1, C]
    mx.eval(qs, kb, vb, start, mask)
    return C, start, end, qs, kb, vb, mask


scale = D ** -0.5
print(f"{shape}: {Hq} query heads, {Hkv} KV heads, D={D}; device {mx.default_device()}", flush=True)
for B in batches:
    for label, lengths in (("mixed", mixed_lengths(B)), ("equal", [1040] * B)):
        C, start, end, qs, kb, vb, mask = case(B, lengths)
        live = sum(lengths) / (B * C)
        row = {"mlx masked": timed(lambda: [mx.fast.scaled_dot_product_attention(
            qs[i % 8], kb[i % 8], vb[i % 8], scale=scale, mask=mask) for i in range(32)], reps)}
        want = da.reference(qs[0].astype(mx.float32), kb[0].astype(mx.float32), vb[0].astype(mx.float32), start, C, scale)
        errs = {}
        for kind in ("vec", "grouped"):
            try:
                got = da.ragged_attention(qs[0], kb[0], vb[0], start, end, scale, kind=kind)
                errs[kind] = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
                row[kind] = timed(lambda: [da.ragged_attention(qs[i % 8], kb[i % 8], vb[i % 8], start, end, scale,
                                                               kind=kind) for i in range(32)], reps)
            except Exception as e:  # noqa: BLE001 - a kind that does not take this shape says so and is skipped
                print(f"  {kind}: {type(e).__name__}: {str(e)[:160]}", flush=True)
        best = min(v for k, v in row.items() if k != "mlx masked") if len(row) > 1 else float("nan")
        print(f"B={B:3d} {label:5s} C={C:5d} live {live:.0%} | " + "  ".join(f"{k} {v:.1f}" for k, v in row.items())
              + f" µs | mlx / best kernel {row['mlx masked'] / best:.2f}x | max err "
              + " ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
        del qs, kb, vb
