"""What a fresh host-made array costs a GPU kernel on MLX's CUDA backend, per step.

MLX allocates an array made on the host (``mx.array(list)``, from numpy) in CUDA managed memory
(arrays of at most 8 bytes come from a small pool the GPU reads in place), and a GPU kernel's
first touch of such a page after the CPU wrote it migrates the page. An ncu profile of an
8B batch-64 compiled step showed one 200-224 µs embedding gather per step, which the same lookup
on device-made tokens does not cost (18-26 µs). This times, one evaluated op at a time
(median µs over N), an op on device-made inputs against the same op on a fresh host-made input:

  lookup  the embedding lookup of B tokens in a 128,256 x 4,096 bf16 table
  add     an int32 add on B values (the per-op floor)

for B = 1 (4 bytes: the small pool) and 64 (256 bytes: managed memory), and a host array
reused (made once) against one made every iteration; and, for a verify step's 8-16 drafts, one
host array against the same values as 8-byte pieces joined on the device.
Usage: benchmarks/probes/host_arrays.py [N]"""
import statistics
import sys
import time

import mlx.core as mx

N = int(sys.argv[1]) if len(sys.argv) > 1 else 40
V, H = 128256, 4096
table = (0.02 * mx.random.normal((V, H))).astype(mx.bfloat16)
mx.eval(table)


def timed(make, op):
    ts = []
    for i in range(N + 5):
        x = make(i)
        t0 = time.perf_counter()
        mx.eval(op(x))
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts[5:])


def pieces(vals):
    """The same int32s as arrays of 8 bytes each (MLX's small pool), joined on the device."""
    return mx.concatenate([mx.array(vals[i:i + 2], dtype=mx.int32) for i in range(0, len(vals), 2)])


for B in (1, 64):
    dev = [mx.random.randint(0, V, (B,), key=mx.random.key(i)).astype(mx.int32) for i in range(N + 5)]
    mx.eval(dev)
    host_lists = [[int(t) for t in d.tolist()] for d in dev]
    once = mx.array(host_lists[0], dtype=mx.int32)
    makes = {
        "device-made": lambda i: dev[i],
        "host-made, fresh": lambda i: mx.array(host_lists[i], dtype=mx.int32),
        "host-made once, reused": lambda i: once,
    }
    for op_name, op in (("lookup", lambda t: table[t]), ("add", lambda t: t + 1)):
        for name, make in makes.items():
            print(f"B={B:3d} {op_name:6s} {name:24s} {timed(make, op):8.1f} µs", flush=True)

# A verify step's drafts are host data every step (8-16 tokens at batch 1): one array of them
# migrates; the same values as 8-byte pieces come from the small pool and are joined on the device.
for n in (8, 16):
    vals = [[(i * 31 + j) % V for j in range(n)] for i in range(N + 5)]
    for name, make in (("one host array", lambda i: mx.array(vals[i], dtype=mx.int32)),
                       ("8-byte pieces, joined", lambda i: pieces(vals[i]))):
        print(f"n={n:3d} add    {name:24s} {timed(make, lambda t: t + 1):8.1f} µs", flush=True)
