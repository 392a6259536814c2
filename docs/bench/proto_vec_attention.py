"""The vec decode-attention kernel (runtime/kernels/decode_attention.py) against the grouped one
and MLX's attention, on CUDA.

1. check() and which kernel serves (grouped_note()).
2. Kernel alone at the Llama shapes: 32 calls per timed graph over 8 distinct K/V buffers (a
   32-layer step whose KV does not fit in L2), µs per call = median graph time / 32, for the
   grouped kernel, MLX's attention (L = 1: fused one-query kernel on K/V sliced to the valid
   columns; L > 1: masked) and the vec kernel in each (warps, keys per lane) configuration, plus
   each one's largest difference from MLX's masked attention in float32.
3. Through the public API (when SHAPE and batches are given): two Engines (compile="auto") on
   one model, the vec kernel on and off (off = the grouped kernel; the module's verdict is set
   before each engine's call, so eager steps and each engine's compiled traces follow it);
   per repeat each runs 16 and 144 new greedy tokens on B fresh 128-token prompts: steady
   ms/step = (T144 - T16) / 128, as `graphc bench --user-api` measures.

Usage: proto_vec_attention.py                          (1 and 2)
       proto_vec_attention.py SHAPE BATCHES [REPEATS]  (1 and 3), e.g. llama-3.1-8b 1,64
"""

import random
import statistics
import sys
import time

import mlx.core as mx

from graphc.runtime.kernels import decode_attention as da
from kernel_bench import attention_case, timed  # docs/bench/kernel_bench.py

print("check():", da.check(), "| serving:", da.grouped_note(), flush=True)
CONFIGS = [(4, 2), (4, 4), (4, 8), (8, 2), (8, 4), (16, 2), (16, 4)]
HEADS = {"8b": (32, 8, 128), "1b": (32, 8, 64)}  # query heads, KV heads, head dim



CASES = [("8b", L, B, ctx) for L in (1, 9) for B in (1, 16, 64) for ctx in (272, 1040)]
CASES += [("1b", 1, B, ctx) for B in (1, 64) for ctx in (272, 1040)]
if da.check() is None and len(sys.argv) < 3:
    for shape, L, B, ctx in CASES:
        Hq, Hkv, D = HEADS[shape]
        c = attention_case(Hq, Hkv, D, L, B, ctx)
        qs, kb, vb, start, end, scale = c.qs, c.kb, c.vb, c.start, c.end, c.scale
        want = da.reference(qs[0].astype(mx.float32), kb[0].astype(mx.float32), vb[0].astype(mx.float32),
                            start, ctx, scale)

        def run(kind, config=None):
            return lambda: [da.ragged_attention(qs[i % 8], kb[i % 8], vb[i % 8], start, end, scale, kind=kind,
                                                config=config) for i in range(32)]

        row = {"grouped": timed(run("grouped")), "mlx": timed(c.mlx_fast)}
        errs = {}
        for cfg in CONFIGS:
            name = f"vec{cfg[0]}x{cfg[1]}"
            try:
                got = da.ragged_attention(qs[0], kb[0], vb[0], start, end, scale, kind="vec", config=cfg)
                errs[name] = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
                row[name] = timed(run("vec", cfg))
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed: {type(e).__name__}: {e}", flush=True)
        auto = da.vec_config(B * Hkv * L, Hq // Hkv, D)
        best = min((k for k in row if k.startswith("vec")), key=row.get, default=None)
        print(f"{shape} L={L} B={B:3d} ctx={ctx:5d} | " + " ".join(f"{n} {v:.1f}" for n, v in row.items())
              + f" µs | best {best} ({row['grouped'] / row[best]:.2f}x grouped, {row['mlx'] / row[best]:.2f}x MLX); "
              f"auto vec{auto[0]}x{auto[1]} | max err {max(errs.values()):.1e}", flush=True)
        del c, qs, kb, vb

if len(sys.argv) < 3 or da.check() is not None:
    sys.exit(0)
from graphc.benchmarks.contestants import graphc_params, make_engine  # noqa: E402
from graphc.benchmarks.shapes import load_shape  # noqa: E402

model, tok, cfg, label = load_shape(sys.argv[1], "bfloat16")
batches = [int(x) for x in sys.argv[2].split(",")]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
vec_ok = da._vec_ok["ok"]
engines = {"vec": make_engine(model, tok, cfg, compile="auto"), "grouped": make_engine(model, tok, cfg, compile="auto")}
rng = random.Random(0)


def call(name, B, new):
    da._vec_ok["ok"] = vec_ok and name == "vec"
    prompts = [[rng.randrange(3, cfg["vocab_size"]) for _ in range(128)] for _ in range(B)]
    t0 = time.perf_counter()
    engines[name].generate(prompts, graphc_params(new))
    return time.perf_counter() - t0


for B in batches:
    for n in engines:  # warm-up: kernels, traces, pools
        call(n, B, 144)
    res = {n: [] for n in engines}
    for _ in range(reps):
        for n in engines:
            short = call(n, B, 16)
            res[n].append((call(n, B, 144) - short) * 1e3 / 128)
    ratios = sorted(g / v for v, g in zip(res["vec"], res["grouped"]))
    print(f"{label} B={B} ms/step min/median/max: " + "; ".join(
        f"{n} {min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}" for n, v in res.items())
        + f"; grouped/vec per repeat {' '.join(f'{x:.3f}' for x in ratios)}", flush=True)
