"""Where a verify step's time goes on this device: host build vs device run, by positions.

For L = 1, 2, 3, 5, 9 new positions on a cache of `ctx` tokens (mlx-lm's own model and
KVCache, the model's own forward — no graphc in the timed part): build = Python time to
build the lazy forward + argmax and call mx.async_eval; wait = time until the result is
on the host; median of `reps` after warm-up. Usage: benchmarks/probes/verify_cost.py MODEL [ctx] [reps]
(MODEL: a folder or .gguf; graphc only converts it).
"""

import statistics
import sys
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from graphc.compiler.gguf import resolve_model_path
from mlx_lm import load

path = resolve_model_path(sys.argv[1]) if sys.argv[1].endswith(".gguf") else sys.argv[1]
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 300
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 30
model, _ = load(str(path))
prompt = mx.array([[(i * 7919) % 1000 + 10 for i in range(ctx)]])
for L in (1, 2, 3, 5, 9):
    cache = make_prompt_cache(model)
    mx.eval(model(prompt, cache=cache))
    toks = mx.array([[11 + i for i in range(L)]])
    builds, waits = [], []
    for i in range(reps + 5):
        t0 = time.perf_counter()
        out = mx.argmax(model(toks, cache=cache), axis=-1)
        mx.async_eval(out)
        t1 = time.perf_counter()
        out.tolist()
        t2 = time.perf_counter()
        for c in cache:
            c.trim(L)
        if i >= 5:
            builds.append((t1 - t0) * 1e3)
            waits.append((t2 - t1) * 1e3)
    print(f"L={L}: build {statistics.median(builds):.2f} ms, wait {statistics.median(waits):.2f} ms, "
          f"total {statistics.median([b + w for b, w in zip(builds, waits)]):.2f} ms", flush=True)
