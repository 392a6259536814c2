"""Why the embedding lookup costs 174-224 µs inside an 8B batch-64 decode step (run 19a's ncu
profile) but 34 µs alone (run 19b). Three suspects, each timed as one evaluated op (median µs of N,
on the H200; a CPU run only checks that it runs):

  alone       the lookup of 64 random rows of a 128,256 x 4,096 bf16 table, nothing between
  after GEMMs the same right after a matmul stream over ~`GB` of other weights (a decode step's
              16 GB at 8B): if the GPU's TLB entries for the table are gone, each of the 64 rows
              is a page walk
  recycled    the same right after the host read a device array of the lookup's output size
              (`np.array`), then dropped it: MLX's allocator turns a buffer the host reads into
              managed memory and its cache may hand that buffer to the next op of that size,
              whose writes then migrate the pages back
  small rows  the lookup of 64 rows all within one 2 MB page of the table (tokens 0-63): the
              TLB suspect predicts the step's cost drops to the alone case even after GEMMs

Usage: proto_gather_cause.py [N] [GB]   (defaults 30, 16)"""
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

N = int(sys.argv[1]) if len(sys.argv) > 1 else 30
GB = float(sys.argv[2]) if len(sys.argv) > 2 else 16.0
V, H, B = 128256, 4096, 64
table = (0.02 * mx.random.normal((V, H))).astype(mx.bfloat16)
# the weight stream: square bf16 matrices, each 4096 x 4096 (32 MB), multiplied by a [B, 4096] row block
n_w = max(1, int(GB * 2**30 / (H * H * 2)))
ws = [(0.02 * mx.random.normal((H, H))).astype(mx.bfloat16) for _ in range(min(n_w, 64))]
reps = -(-n_w // len(ws))  # the same matrices again when GB asks for more than 64 of them
x = mx.random.normal((B, H)).astype(mx.bfloat16)
mx.eval(table, ws, x)
toks = [mx.random.randint(0, V, (B,), key=mx.random.key(i)).astype(mx.int32) for i in range(N + 5)]
near = mx.arange(B, dtype=mx.int32)
mx.eval(toks)


def stream():
    y = x
    for _ in range(reps):
        for w in ws:
            y = (y @ w) * 0.01
    return y


def timed(prep, tk):
    out = []
    for i in range(N + 5):
        prep()
        t0 = time.perf_counter()
        mx.eval(table[tk(i)])
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out[5:])


def read_back():
    z = mx.ones((B, H // 2), mx.float32) * 2  # a device array of the lookup's output size (bytes)
    mx.eval(z)
    np.array(z)  # the host reads it: MLX moves its buffer to managed memory
    del z


cases = {
    "alone": (lambda: None, lambda i: toks[i]),
    f"after GEMMs (~{n_w * H * H * 2 / 2**30:.0f} GB)": (lambda: mx.eval(stream()), lambda i: toks[i]),
    "recycled output buffer": (read_back, lambda i: toks[i]),
    "after GEMMs, rows in one page": (lambda: mx.eval(stream()), lambda i: near),
}
for name, (prep, tk) in cases.items():
    print(f"B={B} lookup {name:32s} {timed(prep, tk):8.1f} µs", flush=True)
