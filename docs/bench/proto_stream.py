"""A/B in one process: mlx-lm's plain decode loop on the default stream vs on a stream of its own
(as mlx-lm's generate and BatchGenerator run), interleaved. Usage: proto_stream.py SHAPE B [STEPS]"""
import random
import sys
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from graphc.benchmarks.shapes import load_shape

now = time.perf_counter
model = load_shape(sys.argv[1])[0]
B, N = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 128
V = model.args.vocab_size
rng = random.Random(0)


def loop(stream):
    with mx.stream(stream):
        cache = make_prompt_cache(model)
        x = mx.array([[rng.randrange(3, V) for _ in range(128)] for _ in range(B)])
        y = mx.argmax(model(x, cache=cache)[:, -1, :], axis=-1)
        mx.eval(y)
        nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
        mx.async_eval(nxt)
        t0 = now()
        for _ in range(N):
            cur = nxt
            nxt = mx.argmax(model(cur[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.async_eval(nxt)
            cur.tolist()
        mx.eval(nxt)
        return (now() - t0) / N * 1e3


own = mx.new_thread_local_stream(mx.default_device())
res = {"default": [], "own": []}
loop(mx.default_stream(mx.default_device())); loop(own)  # warm-up
for r in range(4):
    res["default"].append(loop(mx.default_stream(mx.default_device())))
    res["own"].append(loop(own))
print(sys.argv[1], f"B={B}", {k: [round(v, 2) for v in vs] for k, vs in res.items()}, flush=True)
