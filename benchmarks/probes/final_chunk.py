"""A prompt's final chunk, whole (one forward over its L positions) against split (L-1 positions,
then the last alone): which is faster on this device, by chunk length (the prefill plan's
"final chunk" choice, compiler/passes/prefill_choices.py).

Two engines on one model folder, forced `final_chunk="whole"` and `"split"`; each measurement
is one final chunk through the compiled prefill step (forward, head, the sampled token read),
on fresh caches that already hold `--context` tokens (0: a prompt's only chunk), the arms
alternated and the median kept. The prior context is evaluated before the timer starts.

    python benchmarks/probes/final_chunk.py --model DIR [--lengths 64,128,256,512,1024]
        [--context 0,1024] [--repeats 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import mlx.core as mx

from graphc.benchmarks.env import environment
from graphc.compiler.lower import StepInputs, cache_arrays
from graphc.runtime import Engine

ARMS = ("whole", "split")


def chunk_ms(engine, prior: list, chunk: list) -> float:
    step, caches = engine.compiled.prefill, engine.runner.new_caches()
    if prior:
        ctx = step.forward(StepInputs(mx.array(prior, dtype=mx.int32)[None], caches, final=False))
        mx.eval(step.fill_targets(ctx))
    t = time.perf_counter()
    out = step.head(step.forward(StepInputs(mx.array(chunk, dtype=mx.int32)[None], caches, final=True)))
    mx.eval(out.next_tokens, *cache_arrays(caches))
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="64,128,256,512,1024")
    ap.add_argument("--context", default="0,1024", help="tokens already in the cache before the chunk")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    engines = {arm: Engine.load(a.model, final_chunk=arm, prefix_cache=False) for arm in ARMS}
    for arm, eng in engines.items():
        assert eng.compiled.prefill.plan.choice("final chunk").choice == arm
    vocab = next(iter(engines.values())).vocab_size
    rng = random.Random(0)
    rows = []
    for context in map(int, a.context.split(",")):
        for n in map(int, a.lengths.split(",")):
            prior, chunk = [rng.randrange(3, vocab) for _ in range(context)], [rng.randrange(3, vocab) for _ in range(n)]
            for eng in engines.values():  # warm: first shapes
                chunk_ms(eng, prior, chunk)
            times = {arm: [] for arm in ARMS}
            for r in range(a.repeats):
                for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                    times[arm].append(chunk_ms(engines[arm], prior, chunk))
            med = {arm: statistics.median(v) for arm, v in times.items()}
            rows.append({"context": context, "chunk": n, **{f"{arm}_ms": round(med[arm], 2) for arm in ARMS},
                         "split_over_whole": round(med["split"] / med["whole"], 3),
                         "ranges": {arm: [round(min(v), 2), round(max(v), 2)] for arm, v in times.items()}})
            print(f"context {context:5d}  chunk {n:5d}  whole {med['whole']:8.2f} ms  split {med['split']:8.2f} ms"
                  f"  split/whole {med['split'] / med['whole']:.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": environment(), "model": a.model, "repeats": a.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
