"""What a step with prompt work costs the running streams, by prompt length: the bound behind the
serving goal "ITL p99 <= 1.5x the decode step" (docs/performance.md).

`--rows` requests decode steadily; then, one at a time and `--repeats` times per length, a fresh
prompt of n tokens arrives (max_tokens 1, so it ends at its prefill and no row joins) with the step
budget fixed at the largest n, so its whole prompt runs in one step beside the decode. Each step's
wall time is the gap every running stream sees between two tokens. Printed per n: the step that
carried the prompt (p50, max) against the plain decode step's p50, and their ratio.

    python benchmarks/probes/mixed_step.py --model /tmp/serving-models/llama-3.2-1b --rows 64
    python benchmarks/probes/mixed_step.py --model /tmp/serving-models/llama-3.2-1b --rows 64 --mixed-step
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import argparse
import json
import logging
import random
import statistics
import time
from pathlib import Path

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.request import Status


def timed_step(engine) -> tuple[float, list]:
    t = time.perf_counter()
    outs = engine.step()
    return (time.perf_counter() - t) * 1e3, outs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/mixed_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--context", type=int, default=512, help="prompt tokens of each decoding row")
    p.add_argument("--lengths", default="128,256,512,1024,2048")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--no-warmup", action="store_true", help="skip warm_up(): every shape is run once before timing anyway")
    p.add_argument("--mixed-step", action="store_true",
                   help="decode: {mixed_step: true}: the prompt rides the decode step's forward (runtime/mixed_step.py)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # the load's progress
    ns = [int(x) for x in a.lengths.split(",")]
    engine = Engine.load(a.model, max_batch=a.rows + 1, step_tokens=max(ns), prefill_chunk=max(ns),
                         decode_options={"mixed_step": True} if a.mixed_step else None)
    print(f"mixed step: {engine.runner.compiled.decode.plan.choice('mixed step').choice}", flush=True)
    if not a.no_warmup:
        engine.warm_up()
    vocab = int(engine.config["vocab_size"])
    rng = random.Random(0)

    def ids(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    for _ in range(a.rows):
        engine.add_request(ids(a.context), SamplingParams(max_tokens=100_000, ignore_eos=True))
    while engine.scheduler.waiting or any(r.status is not Status.RUNNING for r in engine.scheduler.running):
        engine.step()
    for _ in range(20):  # settle into plain decode
        engine.step()
    out = {"args": vars(a), "lengths": {}}
    # every length once first: a shape's first use (a plan build) is not the steady cost asked for
    for n in ns:
        engine.add_request(ids(n), SamplingParams(max_tokens=1, ignore_eos=True))
        for _ in range(4):
            engine.step()
    decode = [timed_step(engine)[0] for _ in range(40)]
    d50 = statistics.median(decode)
    out["decode_ms"] = {"p50": round(d50, 2), "max": round(max(decode), 2)}
    print(f"decode step, {a.rows} rows: p50 {d50:.2f} ms, max {max(decode):.2f} ms", flush=True)
    for n in ns:
        carried = []
        for _ in range(a.repeats):
            rid = engine.add_request(ids(n), SamplingParams(max_tokens=1, ignore_eos=True))
            walls = []
            for _ in range(4):  # the step that takes the prompt, and the chained steps after it
                ms, outs = timed_step(engine)
                walls.append(ms)
                if any(o.request_id == rid for o in outs):
                    break
            carried.append(max(walls))
            for _ in range(3):
                engine.step()
        c50 = statistics.median(carried)
        out["lengths"][n] = {"step_ms_p50": round(c50, 2), "step_ms_max": round(max(carried), 2),
                             "ratio_to_decode": round(c50 / d50, 2)}
        print(f"prompt {n:5d} tokens: step with it p50 {c50:7.2f} ms, max {max(carried):7.2f} ms, "
              f"{c50 / d50:5.2f}x the decode step", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
