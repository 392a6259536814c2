"""Run 21: what the runner's 8-byte-piece read of the tokens (runtime/host_read.py) saves per decode
step through the public API.

One compile="auto" Engine, B fresh prompts of 128 tokens, 144 new tokens; calls alternate the
runner's `host_read` between "tokens" (before run 21) and "pieces", the order flipping every
repeat, and each call starts from an emptied MLX buffer cache (`mx.clear_cache()`), so neither
inherits the other's managed buffers. Per call: the median steady step (ms, the first 16 steps left
out), timed as `python -m graphc.benchmarks.step_profile` times them; per pair: tokens / pieces.

Usage: proto_host_read_api.py SHAPE B [REPEATS]
"""
import gc
import random
import sys
from statistics import median

import mlx.core as mx

from graphc.benchmarks.contestants import graphc_params, make_engine
from graphc.benchmarks.shapes import load_shape
from graphc.benchmarks.step_profile import instrument, summarize, uninstrument

shape, B = sys.argv[1], int(sys.argv[2])
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 7
model, tok, cfg, label = load_shape(shape, "bfloat16")
eng = make_engine(model, tok, cfg, compile="auto")
rng = random.Random(0)
vocab = eng.vocab_size


def call(how):
    eng.runner.host_read = how
    gc.collect()
    mx.clear_cache()
    eng.generate([[rng.randrange(3, vocab) for _ in range(128)] for _ in range(B)], graphc_params(144))


for how in ("tokens", "pieces"):
    call(how)  # warm-up
timer = instrument(eng)
res = {"tokens": [], "pieces": [], "ratio": []}
for r in range(repeats):
    for how in (("tokens", "pieces") if r % 2 == 0 else ("pieces", "tokens")):
        timer.steps = []
        call(how)
        res[how].append(summarize(timer.steps[16:])["step"])
    res["ratio"].append(res["tokens"][-1] / res["pieces"][-1])
    print(f"{label} B={B} pair {r}: tokens {res['tokens'][-1]:.3f} ms/step, pieces {res['pieces'][-1]:.3f}, "
          f"tokens / pieces {res['ratio'][-1]:.3f}", flush=True)
uninstrument(eng)
rs = sorted(res["ratio"])
print(f"{label} B={B} ms/step tokens {min(res['tokens']):.3f} / {median(res['tokens']):.3f} / {max(res['tokens']):.3f}, "
      f"pieces {min(res['pieces']):.3f} / {median(res['pieces']):.3f} / {max(res['pieces']):.3f} (min / median / max)")
print(f"{label} B={B} tokens / pieces per pair over {len(rs)} pairs: min {rs[0]:.3f} / median {median(rs):.3f} / "
      f"max {rs[-1]:.3f}", flush=True)
