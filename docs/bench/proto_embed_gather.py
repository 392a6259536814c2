"""The embedding lookup at Llama shapes on the device: is MLX's gather the 218-301 µs kernel of run
14's ncu profiles (`mlx::gather<bf16, int, 1, 2, int>`, one launch per decode step at 8B batch 64,
docs/bench/h200-run14*-k8b64-*.txt)?

Times 32 lookups per evaluated graph (distinct token arrays, one table) in µs per lookup, for
the forms a step could use: the model's `embed_tokens` on [B, 1] tokens (what a decode step
runs), the same on [B] tokens, `mx.take` on flat tokens, and a one-hot-free row copy
(`mx.take` of rows through `reshape`); then the same through `mx.compile`. If a lookup costs
~250 µs here while its 512 KB of rows need ~1 µs, the step has a cheap win.
Usage: proto_embed_gather.py [VOCAB] [HIDDEN] [BATCHES]   (default 128256 4096 1,64)"""
import sys

import mlx.core as mx
import mlx.nn as nn
from kernel_bench import timed  # docs/bench/kernel_bench.py

V = int(sys.argv[1]) if len(sys.argv) > 1 else 128256
Hd = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
batches = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,64").split(",")]
emb = nn.Embedding(V, Hd)
emb.weight = (0.02 * mx.random.normal((V, Hd))).astype(mx.bfloat16)
mx.eval(emb.weight)



for B in batches:
    toks = [mx.random.randint(0, V, (B, 1), key=mx.random.key(i)).astype(mx.int32) for i in range(32)]
    mx.eval(toks)
    forms = {
        "embed_tokens([B, 1])": lambda t: emb(t),
        "embed_tokens([B])": lambda t: emb(t.reshape(-1)),
        "take(flat, axis=0)": lambda t: mx.take(emb.weight, t.reshape(-1), axis=0),
    }
    want = emb(toks[0]).reshape(B, Hd)
    for name, f in forms.items():
        assert mx.array_equal(f(toks[0]).reshape(B, Hd), want).item()
        eager = timed(lambda: [f(t) for t in toks])
        cf = mx.compile(f)
        compiled = timed(lambda: [cf(t) for t in toks])
        print(f"V={V} H={Hd} B={B:3d} {name:24s} eager {eager:8.1f} µs  compiled {compiled:8.1f} µs per lookup",
              flush=True)
    ref = timed(lambda: [t + 1 for t in toks])
    print(f"V={V} H={Hd} B={B:3d} {'(an add on the tokens)':24s} eager {ref:8.1f} µs: the per-op floor", flush=True)
