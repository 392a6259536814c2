"""In-process A/B of FullKV.left_pad_array: the compiled step with the rows' padding kept on the
device (now) against a fresh host-made array every step (before run 19), alternated per repeat;
steady ms/step = (T(48 new) - T(16 new)) / 32 on 64 fresh 128-token prompts.
Usage: proto_left_pad_ab.py [SHAPE] [B] [REPEATS]"""
import sys
import time

import mlx.core as mx

from graphc.benchmarks.contestants import graphc_params, make_engine
from graphc.benchmarks.shapes import load_shape
from graphc.runtime.cache.full import FullKV

shape = sys.argv[1] if len(sys.argv) > 1 else "llama-3.1-8b"
B = int(sys.argv[2]) if len(sys.argv) > 2 else 64
R = int(sys.argv[3]) if len(sys.argv) > 3 else 3
model, tok, cfg, label = load_shape(shape, "bfloat16")
eng = make_engine(model, tok, cfg, compile=True)
now = FullKV.left_pad_array
arms = {"device (now)": now, "host every step": lambda self: mx.array(self.left_pad, dtype=mx.int32)}
seed = [0]


def call(n):
    seed[0] += 1
    ps = [[3 + (seed[0] * 7919 + i * 131 + j * 7) % (eng.vocab_size - 3) for j in range(128)] for i in range(B)]
    t = time.perf_counter()
    eng.generate(ps, graphc_params(n))
    return time.perf_counter() - t


call(48)
res = {k: [] for k in arms}
for r in range(R):
    for name, fn in arms.items():
        FullKV.left_pad_array = fn
        res[name].append((call(48) - call(16)) * 1e3 / 32)
FullKV.left_pad_array = now
for name, v in res.items():
    print(f"{label} B={B} {name:18s} ms/step " + " ".join(f"{x:.2f}" for x in v), flush=True)
