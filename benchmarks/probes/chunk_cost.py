"""Where a serving step's time goes: the prompt chunk's forward vs the decode step vs the rest.

Wraps the runner's prefill_chunk / prefill_batches / run_decode with wall timers (each of them
ends in a host read, so the times are device-inclusive) while a few rows decode and long
prompts arrive.

    python benchmarks/probes/chunk_cost.py --model DIR [--rows 8] [--prompt 4096] [--load JSON]
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import argparse
import json
import random
import statistics
import time

import mlx.core as mx

from graphc.runtime import Engine, SamplingParams


def _timed(obj, name, log):
    fn = getattr(obj, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        log.append((name, (time.perf_counter() - t) * 1e3))
        return out

    setattr(obj, name, wrapper)


def decoding_rows(engine, rows: int, seed: int):
    """`rows` requests of 64 random tokens that decode until aborted, stepped into the decode batch;
    (a function making n random prompt ids, their request ids)."""
    rng = random.Random(seed)
    vocab = int(engine.config["vocab_size"])
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]
    bg = [engine.add_request(ids(64), SamplingParams(max_tokens=100000, ignore_eos=True)) for _ in range(rows)]
    while len(engine.runner.rows) < rows:
        engine.step()
    return ids, bg


def run(engine, rows: int, prompt: int, longs: int, seed: int) -> dict:
    ids, bg = decoding_rows(engine, rows, seed)
    for _ in range(5):
        engine.step()
    log: list = []
    r = engine.runner
    for n in ("prefill_chunk", "prefill_batches", "run_decode"):
        _timed(r, n, log)
    steps = []
    for _ in range(longs):
        engine.add_request(ids(prompt), SamplingParams(max_tokens=4, ignore_eos=True))
    for _ in range(200):
        log.clear()
        t = time.perf_counter()
        engine.step()
        steps.append({"ms": (time.perf_counter() - t) * 1e3, "parts": list(log)})
        if len(r.rows) >= rows + longs:
            break
    for n in ("prefill_chunk", "prefill_batches", "run_decode"):
        delattr(r, n)
    for rid in bg:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    summary = {}
    for n in ("prefill_chunk", "prefill_batches", "run_decode"):
        xs = [ms for s in steps for (k, ms) in s["parts"] if k == n]
        if xs:
            summary[n] = {"n": len(xs), "median_ms": round(statistics.median(xs), 2), "max_ms": round(max(xs), 2)}
    summary["step"] = {"n": len(steps), "median_ms": round(statistics.median(s["ms"] for s in steps), 2),
                       "max_ms": round(max(s["ms"] for s in steps), 2)}
    return {"summary": summary, "steps": [{"ms": round(s["ms"], 2), "parts": [(k, round(v, 2)) for k, v in s["parts"]]} for s in steps]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=4096)
    p.add_argument("--longs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--load", default="{}", help="Engine.load keywords as JSON")
    a = p.parse_args(argv)
    t = time.perf_counter()
    engine = Engine.load(a.model, max_batch=64, **json.loads(a.load))
    print(f"load {time.perf_counter() - t:.1f}s", flush=True)
    out = []
    for rep in range(a.repeats):
        res = run(engine, a.rows, a.prompt, a.longs, rep)
        print(json.dumps({"repeat": rep, **res["summary"]}), flush=True)
        print("  first steps:", [(s["ms"], s["parts"]) for s in res["steps"][:4]], flush=True)
        out.append(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
