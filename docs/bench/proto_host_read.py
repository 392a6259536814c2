"""Run 21: the in-step embedding lookup's ~250 µs is a managed-memory effect, and which host read
avoids it.

Run 21a: the lookup costs 3 µs alone in every condition proto_gather_model.py tried, but 156-295 µs
inside a chained decode step (ncu, `run21-h200.sh gatherstep`). With the host reading a copy of
the tokens (PROTO_HOST_COPY=1) one lookup in three fell to 5 µs. MLX's CUDA allocator moves a
buffer the host reads (`tolist`) into managed memory, and a freed buffer goes back to the cache
for any later array of its size. So the next step's small arrays (the argmax's tokens, the lookup's
index) land in pages the host touched, and the GPU faults on them while the host reads.

This loop is the runner's chain without the model: step N + 1 = the embedding lookup of step N's
tokens, one [B, hidden] x [hidden, V] head matmul, argmax; queued before the host reads step N's
tokens. The host read is varied:

  tokens     the host reads the tokens the next lookup indexes (the runner today)
  copy       the host reads `tokens + 0`; the lookup indexes the original
  pieces     the host reads 8-byte pieces of the tokens: MLX's scalar pool (managed memory the
             GPU maps, no migration)
  padded     the host reads a copy padded to a size no step array has (11 pages), so its
             recycled managed buffers only ever come back as that copy
  none       the host reads nothing (device time of the loop alone; not a runner)

Wall ms per step (median over repeats of STEPS steps), and under
`ncu --kernel-name regex:gather` the lookup's device time per variant in the same order.
Usage: proto_host_read.py [B] [STEPS] [REPEATS] | --sum CSV STEPS REPEATS
"""
import statistics
import sys
import time

VARIANTS = ("tokens", "copy", "pieces", "padded", "none")

if sys.argv[1:2] == ["--sum"]:
    import csv
    rows = [r for r in csv.DictReader(l for l in open(sys.argv[2]) if l.startswith('"')) if r.get("ID", "").isdigit()]
    us = [float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3 for r in rows]
    per = int(sys.argv[3]) * int(sys.argv[4])  # lookups per variant
    for i, name in enumerate(VARIANTS):
        part = us[(i + 1) * per:(i + 2) * per]  # the first block is the warm-up
        if part:
            slow = sum(1 for u in part if u > 20)
            print(f"{name:8s} lookup device µs min / median / max {min(part):6.1f} / {statistics.median(part):6.1f} / "
                  f"{max(part):6.1f}; over 20 µs: {slow} of {len(part)}")
    sys.exit(0)

import mlx.core as mx  # noqa: E402

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
H, V = 4096, 128256
table = (mx.random.normal((V, H)) * 0.02).astype(mx.bfloat16)
head = (mx.random.normal((H, V)) * 0.02).astype(mx.bfloat16)
mx.eval(table, head)
PAD = 11 * 4096 // 4 - B  # int32 elements: the padded copy is 11 pages


def host_array(tokens, variant):
    if variant == "tokens":
        return tokens
    if variant == "copy":
        return tokens + 0
    if variant == "pieces":
        return [tokens[i:i + 2] + 0 for i in range(0, B, 2)]
    if variant == "padded":
        return mx.concatenate([tokens, mx.zeros((PAD,), mx.int32)])
    return None


def read(h):
    if h is None:
        return None
    if isinstance(h, list):
        return [t for p in h for t in p.tolist()]
    return h.tolist()[:B]


def run(variant):
    toks = mx.array([(i * 7919) % V for i in range(B)], dtype=mx.int32)
    pending = None
    ts = []
    for r in range(REPEATS):
        mx.synchronize()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            x = table[toks[:, None]].reshape(B, H)
            nxt = mx.argmax(x @ head, axis=-1).astype(mx.int32)
            h = host_array(nxt, variant)
            mx.async_eval(nxt, *(h if isinstance(h, list) else [h] if h is not None else []))
            if pending is not None:
                read(pending)
            pending, toks = h, nxt
        mx.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3 / STEPS)
    return ts


run("none")  # warm-up: kernels built (its lookups are the first block under ncu)
for v in VARIANTS:
    ts = run(v)
    print(f"B={B} {v:8s} ms/step min / median / max {min(ts):6.3f} / {statistics.median(ts):6.3f} / {max(ts):6.3f}",
          flush=True)
