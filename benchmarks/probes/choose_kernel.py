"""The Gumbel-choose kernel (runtime/kernels/gumbel_choose.py) on the GPU.

  python benchmarks/probes/choose_kernel.py [B] [iters]

Prints both sampling kernels' checks, then the fused selection of a [B, 128256] bf16 batch (T 0.8,
top-p 0.9, top-k 50, seeded rows) with the choose kernel off and on, alternating: host ms to build
and submit one selection (`mx.async_eval`), and wall ms per selection evaluated (median of
`iters`), and whether both give the same tokens."""

from __future__ import annotations

import sys
import time
from statistics import median

import mlx.core as mx

from graphc.runtime.kernels import gumbel_choose as GC
from graphc.runtime.kernels import top_ranks as TR
from graphc.runtime.sampling import SamplingParams, SamplingTensors, select_tokens

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200
print("top-ranks check:", TR.check(), "|", TR.note())
print("gumbel-choose check:", GC.check(), "|", GC.note())
params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=i) for i in range(B)]
x = (3.0 * mx.random.normal((B, 128256), key=mx.random.key(1))).astype(mx.bfloat16)
pos = mx.arange(B, dtype=mx.int32) + 100
mx.eval(x, pos)


def build(choose_on: bool):
    real = GC.usable
    GC.usable = real if choose_on else (lambda *config: False)
    try:
        return SamplingTensors.build(params, 128256, top_ranks_kernel=True)
    finally:
        GC.usable = real


sts = {False: build(False), True: build(True)}
print("fused flags:", {k: v.describe()["fused"] for k, v in sts.items()})
toks = {}
times = {False: ([], []), True: ([], [])}
for it in range(N + 20):
    for on in (False, True) if it % 2 == 0 else (True, False):
        t0 = time.perf_counter()
        t = select_tokens(x, sts[on], pos + it)
        mx.async_eval(t)
        t1 = time.perf_counter()
        mx.eval(t)
        t2 = time.perf_counter()
        if it >= 20:
            times[on][0].append((t1 - t0) * 1e3)
            times[on][1].append((t2 - t0) * 1e3)
        if it == 20:
            toks[on] = t.tolist()
for on in (False, True):
    h, w = times[on]
    print(f"choose kernel {'on ' if on else 'off'}: host build+submit {median(h):.3f} ms "
          f"(min {min(h):.3f}), wall per selection {median(w):.3f} ms (min {min(w):.3f})")
print("same tokens on and off:", toks[False] == toks[True])
