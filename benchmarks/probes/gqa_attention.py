"""Decode attention at the Llama shapes: graphc's per-head kernel, its grouped kernel (one block
per KV head serving the whole query group) and MLX's fused attention, on the device.

32 attention calls per timed graph over 8 distinct K/V buffers (like a 32-layer step whose KV
does not fit in L2), µs per call = median graph time / 32. For L = 1 MLX's attention runs on
K/V sliced to the valid columns with no mask (its fused one-query kernel, what an eager step of
rows that started together gets); for L > 1 with the causal array mask. Also prints the largest
difference of each kernel from MLX's masked attention in float32.
Usage: benchmarks/probes/gqa_attention.py [SHAPES] [BATCHES] [CONTEXTS] [LS]
  e.g. benchmarks/probes/gqa_attention.py 8b,1b 1,16,64 272,1040,4112 1,9"""
import sys

import mlx.core as mx

from graphc.runtime.kernels import decode_attention as da
from kernel_bench import attention_case, timed  # benchmarks/probes/kernel_bench.py (run from this folder's path)

SHAPES = {"8b": (32, 8, 128), "1b": (32, 8, 64)}  # query heads, KV heads, head dim
shapes = (sys.argv[1] if len(sys.argv) > 1 else "8b,1b").split(",")
batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,16,32,64").split(",")]
contexts = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "272,1040,4112").split(",")]
lengths = [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1,9").split(",")]
print("check():", da.check(), "| grouped:", da.grouped_note(), flush=True)



for shape in shapes:
    Hq, Hkv, D = SHAPES[shape]
    for L in lengths:
        for B in batches:
            for ctx in contexts:
                c = attention_case(Hq, Hkv, D, L, B, ctx)
                qs, kb, vb, start, end, scale = c.qs, c.kb, c.vb, c.start, c.end, c.scale
                want = da.reference(qs[0].astype(mx.float32), kb[0].astype(mx.float32), vb[0].astype(mx.float32),
                                    start, ctx, scale)
                errs, row = {}, {}
                for kind in ("per_head", "grouped"):
                    try:
                        got = da.ragged_attention(qs[0], kb[0], vb[0], start, end, scale, kind=kind)
                        errs[kind] = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
                        row[kind] = timed(lambda: [da.ragged_attention(qs[i % 8], kb[i % 8], vb[i % 8], start, end, scale,
                                                                       kind=kind) for i in range(32)])
                    except Exception as e:  # noqa: BLE001
                        errs[kind], row[kind] = float("nan"), float("nan")
                        print(f"  {kind} failed: {type(e).__name__}: {e}", flush=True)
                row["mlx"] = timed(c.mlx_fast)
                print(f"{shape} L={L} B={B:3d} ctx={ctx:5d} | " + "  ".join(f"{n} {v:.1f}" for n, v in row.items())
                      + f" µs | per-head/grouped {row['per_head'] / row['grouped']:.2f}x MLX/grouped "
                      f"{row['mlx'] / row['grouped']:.2f}x | max err " + " ".join(f"{n} {v:.1e}" for n, v in errs.items()),
                      flush=True)
                del c
