"""Eager decode over left-padded rows: MLX's masked attention against the ragged kernel.

Rows that joined a batch at different lengths decode left-padded, so each layer's attention
needs an array mask, which sends MLX's CUDA attention to its slow path. One Engine (eager),
B prompts of different lengths (padded) and of one length (unpadded, MLX's fused kernel
either way); steady decode ms/step = (T(new=48) - T(new=8)) / 40, interleaved, median of
`reps`; "kernel" runs the attention through runtime/kernel_views.py, "mlx" does not.
Usage: benchmarks/probes/padded_decode.py [shape] [batches] [reps]  (shape: a bench shape, default
llama-3.2-1b; batches: comma list, default 8,32)."""

import statistics
import sys
import time

from graphc.runtime import Engine, SamplingParams
from graphc.benchmarks.shapes import load_shape

shape = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b"
batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "8,32").split(",")]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
model, tok, cfg, label = load_shape(shape, "bfloat16")
eng = Engine(model, tok, cfg, max_batch=max(batches))
views = eng.runner.views
blocks = views.blocks
print(f"{label}: kernel views {views.note}", flush=True)


def timed(prompts, n):
    t0 = time.perf_counter()
    eng.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
    return time.perf_counter() - t0


for B in batches:
    padded = [[3 + (i * 31 + j) % 1000 for j in range(64 + 9 * i)] for i in range(B)]
    same = [[3 + (i * 31 + j) % 1000 for j in range(64)] for i in range(B)]
    res = {}
    for r in range(reps + 1):
        for name, prompts, b in (("padded kernel", padded, blocks), ("padded mlx", padded, {}),
                                 ("unpadded", same, blocks)):
            views.blocks = b
            ms = (timed(prompts, 48) - timed(prompts, 8)) / 40 * 1e3
            if r:
                res.setdefault(name, []).append(ms)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"B={B}: " + ", ".join(f"{k} {min(v):.2f} / {med[k]:.2f} / {max(v):.2f} ms/step" for k, v in res.items())
          + f"; padded mlx / kernel {med['padded mlx'] / med['padded kernel']:.2f}x", flush=True)
