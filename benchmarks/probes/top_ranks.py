"""The top-ranks kernel (runtime/kernels/top_ranks.py) against MLX's candidate search, on CUDA.

1. check(): the kernel's keys against MLX's, bit for bit, on random and tie-heavy logits; then
   each variant (radix select, bitonic sort) on its own.
2. Selection alone at [B, 128256] bf16, top-k 50 + top-p 0.9 + T 0.8 (K = 64): median ms of
   evaluated calls and host µs to build, for greedy argmax, the fused selection with MLX's
   ops and with the kernel, and the candidate stage alone both ways and per matching variant.
3. Through the public API: two Engines on one model, the kernel on (default) and off
   (`decode_options={"sampling_kernel": False}`); per repeat, each engine runs a sampled and a
   greedy pair of calls (16 and 144 new tokens on B fresh 128-token prompts): steady ms/step
   = (T144 - T16) / 128 and sampled / greedy per repeat, as `graphc bench --user-api` does.

Usage: benchmarks/probes/top_ranks.py SHAPE B [REPEATS]   (SHAPE: a bench shape, e.g. llama-3.2-1b)
"""

import random
import statistics
import sys
import time

import mlx.core as mx

from graphc.benchmarks.contestants import graphc_params, make_engine
from graphc.benchmarks.shapes import load_shape
from graphc.runtime.kernels import top_ranks
from graphc.runtime import SamplingParams
from graphc.benchmarks.sampling_select import median_build_us, median_eval_s
from graphc.runtime.sampling.select import select_tokens
from graphc.runtime.sampling.tensors import SamplingTensors

SAMPLING = dict(temperature=0.8, top_p=0.9, top_k=50)


def timed(fn, iters=50):
    """(median ms of evaluated calls, median µs to build one): benchmarks/sampling_select.py's timers."""
    return median_eval_s(fn, iters, warmup=5) * 1e3, median_build_us(fn, 20)


print("check:", top_ranks.check() or "matched MLX bit for bit", "| runs:", top_ranks.note(), flush=True)


def verdict(v):
    """None when variant v matches MLX; else why not (a failed build or launch included)."""
    try:
        return top_ranks._compare(0, v)
    except Exception as e:  # noqa: BLE001 - one variant's launch failure must not end the probe
        return f"{type(e).__name__}: {e}"


# each variant against MLX on its own (check() stops at the first that matches)
verdicts = {v: verdict(v) for v in top_ranks._VARIANTS} if top_ranks.check() is None else {}
print("variants:", verdicts or "-", flush=True)
V = 128256
for B in (1, 16, 64):
    x = (3 * mx.random.normal((B, V))).astype(mx.bfloat16)
    mx.eval(x)
    pos = mx.arange(B, dtype=mx.int32) + 100
    key = mx.random.key(1)
    inv_t, h = mx.full((B,), 1.25, mx.float32), mx.arange(B, dtype=mx.uint32) * 7919
    sts = {k: SamplingTensors.build([SamplingParams(**SAMPLING)] * B, V, top_ranks_kernel=k) for k in (False, True)}
    assert sts[True].fused.kernel == (top_ranks.check() is None)
    same = mx.array_equal(select_tokens(x, sts[False], pos, key), select_tokens(x, sts[True], pos, key)).item()
    rows = {
        "greedy argmax": lambda: mx.argmax(x, axis=-1),
        "fused selection, MLX search": lambda: select_tokens(x, sts[False], pos, key),
        "fused selection, kernel": lambda: select_tokens(x, sts[True], pos, key),
        "candidates alone, MLX": lambda: top_ranks.reference(x, 64, inv_t, h, pos),
        "candidates alone, kernel": lambda: top_ranks.candidates(x, 64, inv_t, h, pos),
        **{f"candidates alone, kernel {v}": (lambda v=v: top_ranks.candidates(x, 64, inv_t, h, pos, variant=v))
           for v in verdicts if verdicts[v] is None},
    }
    for name, fn in rows.items():
        if "kernel" in name and top_ranks.check() is not None:
            continue
        ms, us = timed(fn)
        print(f"B={B:3d} {name:30s} {ms:7.3f} ms  host {us:6.1f} us", flush=True)
    print(f"B={B:3d} same tokens both ways: {same}", flush=True)

if len(sys.argv) < 3:
    sys.exit(0)
model, tok, cfg, label = load_shape(sys.argv[1], "bfloat16")
Bn = int(sys.argv[2])
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
engines = {"kernel": make_engine(model, tok, cfg),
           "mlx": make_engine(model, tok, cfg, decode_options={"sampling_kernel": False})}
for n, e in engines.items():
    print(n, dict(e.compiled.decode.plan.passes).get("sampling kernel", "no plan line"), flush=True)
rng = random.Random(0)


def prompts():
    return [[rng.randrange(3, cfg["vocab_size"]) for _ in range(128)] for _ in range(Bn)]


def call(eng, new, samp):
    t0 = time.perf_counter()
    eng.generate(prompts(), graphc_params(new, samp))
    return time.perf_counter() - t0


for e in engines.values():  # warm-up: kernels, traces, pools
    for s in (SAMPLING, None):
        call(e, 144, s)
res = {n: {"sampled": [], "greedy": []} for n in engines}
for r in range(reps):
    for n, e in engines.items():
        for what, s in (("sampled", SAMPLING), ("greedy", None)):
            short = call(e, 16, s)
            long_ = call(e, 144, s)
            res[n][what].append((long_ - short) * 1e3 / 128)
for n, d in res.items():
    ratios = sorted(a / b for a, b in zip(d["sampled"], d["greedy"]))
    med = {w: statistics.median(v) for w, v in d.items()}
    print(f"{label} B={Bn} {n:6s}: sampled {med['sampled']:.2f} ms/step (min {min(d['sampled']):.2f} max "
          f"{max(d['sampled']):.2f}), greedy {med['greedy']:.2f} (min {min(d['greedy']):.2f} max {max(d['greedy']):.2f}); "
          f"sampled/greedy per repeat {' '.join(f'{x:.3f}' for x in ratios)} -> median {statistics.median(ratios):.3f}",
          flush=True)
