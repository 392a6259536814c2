"""Where the public API's steady ms/step and the per-step median part: the slowest decode steps.

`graphc bench --user-api` reports (T(144 new) - T(16 new)) / 128, a mean that includes every
stall; `python -m graphc.benchmarks.step_profile` reports per-step medians, which leave stalls
out. This prints both for one Engine on B fresh 128-token prompts, and the slowest steps with
their parts (build, submit, wait, engine: see step_profile). Usage:
proto_step_outliers.py SHAPE B [compile 0|1] [PAIRS]   (SHAPE: a bench shape or a model folder; PAIRS of
16- and 144-token calls, default 2). Per call also: steps that only admitted/prefilled, the engine
part of decode steps, time outside engine steps, GC passes, prefix-pool growth and MLX memory."""

import gc
import random
import statistics
import sys
import time

import mlx.core as mx

from graphc.benchmarks.contestants import graphc_params, make_engine
from graphc.benchmarks.shapes import load_shape
from graphc.benchmarks.step_profile import instrument

model, tok, cfg, label = load_shape(sys.argv[1], "bfloat16")
B = int(sys.argv[2])
comp = len(sys.argv) > 3 and sys.argv[3] == "1"
eng = make_engine(model, tok, cfg, compile=comp)
rng = random.Random(0)


def prompts():
    return [[rng.randrange(3, eng.vocab_size) for _ in range(128)] for _ in range(B)]


eng.generate(prompts(), graphc_params(144))
t = instrument(eng)
pauses = []  # (generation, seconds) of every garbage collection during a call
_gc_t0 = [0.0]


def _gc_cb(phase, info):
    if phase == "start":
        _gc_t0[0] = time.perf_counter()
    else:
        pauses.append((info["generation"], time.perf_counter() - _gc_t0[0]))


gc.callbacks.append(_gc_cb)
calls = {}
pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
for new in (16, 144) * pairs:
    t.steps, t.other = [], []
    pauses.clear()
    pio = eng.runner.prefix_io
    grows0, bytes0 = (pio.pool.grows, pio.nbytes) if pio is not None else (0, 0)
    t0 = time.perf_counter()
    eng.generate(prompts(), graphc_params(new))
    wall = time.perf_counter() - t0
    st = [s["step"] for s in t.steps]
    print(f"{label} B={B} new={new}: call {wall * 1e3:.0f} ms, {len(st)} decode steps, sum {sum(st) * 1e3:.0f} ms, "
          f"median {statistics.median(st) * 1e3:.2f} ms, max {max(st) * 1e3:.1f} ms; GC: "
          + ", ".join(f"gen{g} x{sum(1 for x, _ in pauses if x == g)} {sum(d for x, d in pauses if x == g) * 1e3:.1f} ms "
                      f"(max {max((d for x, d in pauses if x == g), default=0) * 1e3:.1f})" for g in (0, 1, 2))
          + (f"; prefix pool grew {pio.pool.grows - grows0}x, {bytes0 / 2**30:.2f} -> {pio.nbytes / 2**30:.2f} GiB"
             if pio is not None else ""), flush=True)
    eng_part = sum(s.get("engine", 0.0) for s in t.steps)
    print(f"  parts: {len(t.other)} steps without decode {sum(t.other) * 1e3:.0f} ms; engine part of decode steps "
          f"{eng_part * 1e3:.0f} ms; outside engine steps {(wall - sum(st) - sum(t.other)) * 1e3:.0f} ms; memory "
          f"active {mx.get_active_memory() / 2**30:.1f} GiB, cache {mx.get_cache_memory() / 2**30:.1f} GiB, "
          f"peak {mx.get_peak_memory() / 2**30:.1f} GiB", flush=True)
    calls.setdefault(new, []).append(wall)
steady = [(a - b) * 1e3 / 128 for a, b in zip(calls[144], calls[16])]
print(f"steady (T144 - T16) / 128: {', '.join(f'{x:.2f}' for x in steady)} ms/step")
print("slowest steps of the last call (ms):")
for s in sorted(t.steps, key=lambda s: -s["step"])[:4]:
    print("  " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in s.items() if not k.startswith("_")))
