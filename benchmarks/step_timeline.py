"""Where a served step's time goes under load: the serving mix replayed in-process, one line per
engine step (prompt tokens computed, decode rows, wall time, memory), so that a stall the serving
bench shows as an inter-token-latency p99 can be pinned on the step that caused it.

    python -m graphc.benchmarks.step_timeline --model DIR --requests 48 --rate 4 --json out.json

Requests arrive as Poisson arrivals on the wall clock (the workload of `graphc bench --serving`,
benchmarks/serving/workload.py); the loop adds the arrived ones and calls `Engine.step()` like
the server's engine thread does. It prints the slowest steps and a summary per step kind.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import mlx.core as mx

from graphc.runtime.params import SamplingParams
from graphc.runtime.engine import Engine

from .serving.workload import make_workload

_GB = 1 << 30


def replay(engine: Engine, workload, rate: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for _ in workload:
        arrivals.append(t)
        t += rng.expovariate(rate) if rate != float("inf") else 0.0
    start = time.perf_counter()
    pending = list(zip(arrivals, workload))
    steps, first, last = [], {}, {}
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            _, w = pending.pop(0)
            rid = engine.add_request(w.prompt, SamplingParams(max_tokens=w.max_tokens, temperature=0.0,
                                                              ignore_eos=True))
            first[rid] = None
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        before = dict(engine.stats)
        sched = engine.scheduler
        running, waiting = len(sched.running), len(sched.waiting)
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        tnow = time.perf_counter() - start
        for o in outs:
            if first.get(o.request_id) is None:
                first[o.request_id] = tnow
            last[o.request_id] = tnow
        steps.append(dict(
            t=round(tnow, 4), ms=round(dt * 1e3, 2), running_before=running, waiting_before=waiting,
            prompt_tokens=engine.stats["computed_prompt_tokens"] - before["computed_prompt_tokens"],
            generated=engine.stats["generated_tokens"] - before["generated_tokens"],
            active_gb=round(mx.get_active_memory() / _GB, 2), cache_gb=round(mx.get_cache_memory() / _GB, 2)))
    return steps


def summarize(steps: list[dict], top: int = 15) -> str:
    lines = [f"{len(steps)} steps, {sum(s['ms'] for s in steps) / 1e3:.1f} s in step()"]
    kinds = {"decode only": [s for s in steps if not s["prompt_tokens"]],
             "prefill+decode": [s for s in steps if s["prompt_tokens"] and s["running_before"]],
             "prefill only": [s for s in steps if s["prompt_tokens"] and not s["running_before"]]}
    for k, ss in kinds.items():
        if ss:
            ms = sorted(s["ms"] for s in ss)
            lines.append(f"  {k:15s} n={len(ss):5d} median {statistics.median(ms):8.1f} ms  p99 "
                         f"{ms[min(len(ms) - 1, int(0.99 * len(ms)))]:8.1f} ms  max {ms[-1]:8.1f} ms  "
                         f"prompt tokens/step median {statistics.median([s['prompt_tokens'] for s in ss]):.0f}")
    lines.append(f"slowest {top} steps:")
    for s in sorted(steps, key=lambda s: -s["ms"])[:top]:
        lines.append("  " + " ".join(f"{k}={v}" for k, v in s.items()))
    peak = max(s["active_gb"] + s["cache_gb"] for s in steps)
    lines.append(f"peak active+cache {peak:.1f} GB; mx peak {mx.get_peak_memory() / _GB:.1f} GB")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m graphc.benchmarks.step_timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=4.0, help="req/s (inf: all at once)")
    ap.add_argument("--min-input", type=int, default=64)
    ap.add_argument("--max-input", type=int, default=4096)
    ap.add_argument("--min-output", type=int, default=32)
    ap.add_argument("--max-output", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--engine-args", default="{}", help="more Engine.load keywords, as JSON")
    ap.add_argument("--no-warmup", action="store_true", help="skip Engine.warm_up (the replay's first requests warm up anyway)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    engine = Engine.load(a.model, max_batch=a.max_batch, **json.loads(a.engine_args))
    if not a.no_warmup:
        print(f"warm-up {engine.warm_up():.1f} s", file=sys.stderr)
    work = make_workload(a.model, a.requests, a.min_input, a.max_input, a.min_output, a.max_output)
    replay(engine, work[:4], float("inf"), seed=1)  # first shapes of each kind, outside the timeline
    steps = replay(engine, work, a.rate)
    print(summarize(steps))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "steps": steps}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
