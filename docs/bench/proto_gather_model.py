"""The embedding lookup inside an 8B batch-64 decode step costs ~250 µs of device time (runs 19a,
20b, and 20e with warm caches and free clocks) but 4 µs on its own in every condition
proto_gather_cause.py tried (20e). What is left that differs in the step: the table is the
model's own weight, the index is a [B, 1] view of the previous step's tokens, and the lookup runs
inside the step's compiled graph. Each case below changes one of those; run it under ncu with
the gather kernels only and read their device time in order:

  ncu --cache-control none --clock-control none --kernel-name regex:gather \
      --metrics gpu__time_duration.sum --csv --page raw --log-file g.csv \
      python3 docs/bench/proto_gather_model.py llama-3.1-8b 64
  python3 docs/bench/proto_gather_model.py --sum g.csv

Cases (N lookups each, in this order): model table + fresh [B] index; model table + [B, 1] view;
the model's own embed_tokens module on the [B, 1] view; the same under mx.compile; a copy of the
model's table + [B] index; the [B] index made from an argmax over [B, V] logits (a step's
tokens). After run 21's first look, four cases on where the index and table live, since MLX's CUDA
allocator moves a buffer the host reads (`tolist`, numpy) into managed memory: an argmax index the
host read before the lookup; one the host reads while the lookup is queued (the runner's chained
decode reads step N's tokens after queueing step N + 1 on them); an index made on the host from a
list; a table copy the host read (numpy) before the lookups. Without ncu it prints wall µs per
case (launch and sync included)."""
import csv
import statistics
import sys
import time

N = 20
CASES = ("model table, [B] index", "model table, [B, 1] view", "embed_tokens module, [B, 1] view",
         "embed_tokens under mx.compile", "copy of the table, [B] index", "index from an argmax",
         "argmax index, host read it first", "argmax index, host reads it while queued",
         "index made on the host from a list", "table copy the host read (numpy)")

if sys.argv[1] == "--sum":
    rows = [r for r in csv.DictReader(l for l in open(sys.argv[2]) if l.startswith('"')) if r.get("ID", "").isdigit()]
    us = [float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3 for r in rows]
    for i, name in enumerate(CASES):
        part = us[i * N:(i + 1) * N][3:]
        if part:
            print(f"{name:36s} device µs min / median / max {min(part):6.1f} / {statistics.median(part):6.1f} / {max(part):6.1f}")
    sys.exit(0)

import mlx.core as mx  # noqa: E402

from graphc.benchmarks.shapes import load_shape  # noqa: E402

model, _, cfg, _ = load_shape(sys.argv[1], "bfloat16")
B = int(sys.argv[2]) if len(sys.argv) > 2 else 64
V = int(cfg["vocab_size"])
emb = model.model.embed_tokens
table = emb.weight
copy = table * 1  # a fresh device buffer with the same values
mx.eval(copy)
idx = [mx.random.randint(0, V, (B,), key=mx.random.key(i)).astype(mx.int32) for i in range(N)]
logits = [mx.random.normal((B, V), key=mx.random.key(100 + i)).astype(mx.bfloat16) for i in range(N)]
from_argmax = [mx.argmax(x, axis=-1).astype(mx.int32) for x in logits]
mx.eval(idx, logits, from_argmax)
read_first = [mx.argmax(x, axis=-1).astype(mx.int32) for x in logits]
mx.eval(read_first)
for a in read_first:
    a.tolist()  # the host read: MLX moves the buffer into managed memory
host_made = [mx.array(a.tolist(), dtype=mx.int32) for a in idx]
host_table = table * 1
mx.eval(host_table)
import numpy as np  # noqa: E402
np.array(host_table.view(mx.uint16))  # the host reads the table's buffer: MLX moves it into managed memory


def queued(i):
    """The runner's chain: the lookup queued on a lazy argmax, then the host reads the argmax."""
    t = mx.argmax(logits[i], axis=-1).astype(mx.int32)
    out = emb(t[:, None])
    mx.async_eval(out, t)
    t.tolist()
    return out

compiled = mx.compile(lambda t: emb(t))
cases = {
    CASES[0]: lambda i: table[idx[i]],
    CASES[1]: lambda i: table[idx[i][:, None]],
    CASES[2]: lambda i: emb(idx[i][:, None]),
    CASES[3]: lambda i: compiled(idx[i][:, None]),
    CASES[4]: lambda i: copy[idx[i]],
    CASES[5]: lambda i: emb(from_argmax[i][:, None]),
    CASES[6]: lambda i: emb(read_first[i][:, None]),
    CASES[7]: queued,
    CASES[8]: lambda i: emb(host_made[i][:, None]),
    CASES[9]: lambda i: host_table[idx[i][:, None]],
}
for name, f in cases.items():
    ts = []
    for i in range(N):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(f(i))
        mx.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
    print(f"B={B} {name:36s} wall µs median {statistics.median(ts[3:]):7.1f}", flush=True)
