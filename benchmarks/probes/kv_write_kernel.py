"""The compiled decode step's K/V write inside the attention kernel (decode option
`kv_write_kernel`, runtime/kernels/decode_attention.py `new=`) against a scatter per layer and
plane, on CUDA.

1. check() and write_check(): the plain and the writing kernels against MLX's masked attention
   (the writing one also: the cache buffers hold exactly the new columns afterwards).
2. Why MLX's write costs more than its kernel (`donation`): one [64, 8, C, 128] bf16 buffer,
   a column written per step by `put_along_axis` (the compiled step's write) or a slice
   assignment (mlx-lm's KVCache), each step's result read by an op, 40 steps either evaluated
   one by one ("synced") or submitted with async_eval and left running ("chained", as a
   decoding loop runs). ms per step at C = 256 / 1,024 / 4,096: a write that grows with C is
   a copy of the whole buffer — MLX hands a buffer over to the next write only when nothing
   in flight still holds it.
3. A 32-layer step's writes + attention at Llama-3.1-8B batch 64 (`kernel`): scatters + the vec
   kernel against the writing vec kernel, 20 chained steps over 32 layers' buffers,
   ms per step (median of 5).
4. Through the public API (when SHAPE and batches are given): two Engines (compile="auto"),
   the kernel write on and off; per repeat each runs 16 and 144 new greedy tokens on B fresh
   128-token prompts: steady ms/step = (T144 - T16) / 128, paired per repeat.

5. `copies`: the writing kernels take the queries, new keys and values
   as they come out of the fused q/k/v matmul and RoPE, strided views, with no copy; before,
   MLX made each of the three row-contiguous first (three copy launches a layer). Now only the
   queries are copied. `rows`: the 32-layer step of 3 with nk / nv as views of one fused row,
   read strided against copied first (`mx.contiguous`, the old launches), and through the API
   two Engines, one whose trace copies nk / nv first (old) and one that does not (new).

Usage: benchmarks/probes/kv_write_kernel.py                          (1, 2, 3)
       benchmarks/probes/kv_write_kernel.py SHAPE BATCHES [REPEATS]  (1 and 4), e.g. llama-3.1-8b 64,1 5
       benchmarks/probes/kv_write_kernel.py copies SHAPE BATCHES [REPEATS]  (1 and 5)
"""

import random
import statistics
import sys
import time

import mlx.core as mx

from graphc.runtime.compiled_decode_kv import write_columns
from graphc.runtime.kernels import decode_attention as da

print("check:", da.check() or "ok", "| write_check:", da.write_check() or "ok", "|", da.grouped_note(), flush=True)
if da.check() is not None or da.write_check() is not None:
    sys.exit(1)

B, H, D, HQ = 64, 8, 128, 32


def donation():
    new = mx.ones((B, H, 1, D), mx.bfloat16)
    q = mx.ones((1, 1, 1, D), mx.bfloat16)

    def scatter(buf, i):
        idx = mx.broadcast_to(mx.array(i, dtype=mx.int32).reshape(1, 1, 1, 1), new.shape)
        return mx.put_along_axis(buf, idx, new, axis=2)

    def assign(buf, i):
        buf[..., i:i + 1, :] = new
        return buf

    for name, write in (("put_along_axis", scatter), ("slice assignment", assign)):
        row = []
        for C in (256, 1024, 4096):
            for chained in (False, True):
                buf = mx.zeros((B, H, C, D), mx.bfloat16)
                mx.eval(buf)
                outs = []
                t0 = 0.0
                for i in range(48):
                    if i == 8:
                        mx.eval(outs)
                        t0 = time.perf_counter()
                    buf = write(buf, i)
                    s = (buf[:, :, :8] * q).sum(axis=(2, 3))  # reads the written buffer, as attention does
                    if chained:
                        mx.async_eval(s)
                    else:
                        mx.eval(s)
                    outs.append(s)
                mx.eval(outs)
                row.append(f"C={C} {'chained' if chained else 'synced'} {(time.perf_counter() - t0) / 40 * 1e3:.3f}")
                del buf, outs
        print(f"donation {name}: ms/step " + "; ".join(row), flush=True)


def kernel(ctx=272, cap=512, layers=32, kinds=("scatter", "kernel")):
    key = mx.random.key(0)
    ks = [mx.random.normal((B, H, cap, D), key=mx.random.split(key, 64)[i]).astype(mx.bfloat16) for i in range(layers)]
    vs = [x * 0.5 for x in ks]
    q = mx.random.normal((B, HQ, 1, D)).astype(mx.bfloat16)
    nk = mx.random.normal((B, H, 1, D)).astype(mx.bfloat16)
    start = mx.zeros((B,), mx.int32)
    mx.eval(ks, vs, q, nk)
    _, rk, rv = da.fused_rows_views(q, nk, nk)  # as a compiled step's fused matmul hands them over

    def step(kind, i):
        idx = mx.array(ctx + i, dtype=mx.int32)
        end = (idx + 1).reshape(1)
        outs = []
        for l in range(layers):
            if kind == "scatter":
                ks[l] = write_columns(ks[l], nk, idx)
                vs[l] = write_columns(vs[l], nk, idx)
                outs.append(da.ragged_attention(q, ks[l], vs[l], start, end, D ** -0.5))
            else:
                new = {"kernel": (nk, nk), "rows strided": (rk, rv),
                       "rows copied": (mx.contiguous(rk), mx.contiguous(rv))}[kind]
                outs.append(da.ragged_attention(q, ks[l], vs[l], start, end, D ** -0.5, new=new))
        return mx.sum(mx.stack([o.sum() for o in outs]))

    res = {k: [] for k in kinds}
    for rep in range(6):
        for kind in res:
            outs = [step(kind, 0)]
            mx.eval(outs)
            t0 = time.perf_counter()
            for i in range(1, 21):
                s = step(kind, i)
                mx.async_eval(s)
                outs.append(s)
            mx.eval(outs)
            if rep:
                res[kind].append((time.perf_counter() - t0) / 20 * 1e3)
    print("kernel 8B batch 64, 32 layers, ctx 272, cap 512, ms/step median (min-max): " + "; ".join(
        f"{k} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in res.items()), flush=True)


if len(sys.argv) < 3:
    donation()
    kernel()
    sys.exit(0)
COPIES = sys.argv[1] == "copies"
if COPIES:
    sys.argv.pop(1)
    kernel(kinds=("rows copied", "rows strided"))

from graphc.benchmarks.contestants import graphc_params, make_engine  # noqa: E402
from graphc.benchmarks.shapes import load_shape  # noqa: E402

model, tok, cfg, label = load_shape(sys.argv[1], "bfloat16")
batches = [int(x) for x in sys.argv[2].split(",")]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
NEW, OLD = ("strided", "copied") if COPIES else ("write", "scatter")
if COPIES:  # the "copied" Engine's traces copy nk / nv before the kernel, as MLX does for a row-contiguous-only kernel
    engines = {NEW: make_engine(model, tok, cfg, compile="auto"), OLD: make_engine(model, tok, cfg, compile="auto")}
    strided = da.ragged_attention
    copying = {"on": False}

    def ragged_attention(*a, new=None, **k):
        if new is not None and copying["on"]:
            new = (mx.contiguous(new[0]), mx.contiguous(new[1]))
        return strided(*a, new=new, **k)

    da.ragged_attention = ragged_attention
else:
    engines = {"write": make_engine(model, tok, cfg, compile="auto"),
               "scatter": make_engine(model, tok, cfg, compile="auto", decode_options={"kv_write_kernel": False})}
    copying = {"on": False}
print({n: e.compiled.decode.applied()["kv_write_kernel"] for n, e in engines.items()}, flush=True)
rng = random.Random(0)


def call(name, B, new):
    prompts = [[rng.randrange(3, cfg["vocab_size"]) for _ in range(128)] for _ in range(B)]
    copying["on"] = COPIES and name == OLD  # a trace built during this call copies, or not
    t0 = time.perf_counter()
    out = engines[name].generate(prompts, graphc_params(new))
    return time.perf_counter() - t0, [r.token_ids for r in out]


for B in batches:
    for n in engines:  # warm-up: kernels, traces, pools
        call(n, B, 144)
    same = [[rng.randrange(3, cfg["vocab_size"]) for _ in range(128)] for _ in range(B)]
    toks = {}
    for n, e in engines.items():
        copying["on"] = COPIES and n == OLD
        toks[n] = [r.token_ids for r in e.generate(same, graphc_params(64))]
    print(f"{label} B={B}: rows with the same 64 greedy tokens, {NEW} vs {OLD}: "
          f"{sum(a == b for a, b in zip(toks[NEW], toks[OLD]))} of {B}", flush=True)
    res = {n: [] for n in engines}
    for _ in range(reps):
        for n in engines:
            short, _ = call(n, B, 16)
            long, _ = call(n, B, 144)
            res[n].append((long - short) * 1e3 / 128)
    ratios = sorted(s / w for w, s in zip(res[NEW], res[OLD]))
    print(f"{label} B={B} ms/step min/median/max: " + "; ".join(
        f"{n} {min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}" for n, v in res.items())
        + f"; {OLD}/{NEW} per repeat {' '.join(f'{x:.3f}' for x in ratios)}", flush=True)
