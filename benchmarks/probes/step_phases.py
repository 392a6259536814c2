"""Where a serving step's time goes, phase by phase: the serving mix through `Engine.step()` with
every runner / prefix-cache / compiled-step phase wrapped in a synchronized timer.

Synchronizing around each phase removes the chain's overlap, so the totals are larger than an
unprobed run's; what it shows is each phase's own cost (device and host), e.g. what a prompt's
last chunk costs beyond its forward. Wrappers are set on the objects from outside.

    python benchmarks/probes/step_phases.py --model /tmp/serving-models/llama-3.2-1b --requests 64
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import argparse
import json
import math
import statistics
import time
from collections import defaultdict

import mlx.core as mx

from graphc.benchmarks.step_timeline import make_mix
from graphc.compiler.lower import cache_arrays
from graphc.runtime import Engine, SamplingParams


class Phases:
    def __init__(self):
        self.calls = defaultdict(list)  # label -> [(wait ms, own ms, extra)]
        self.depth = 0

    def wrap(self, obj, name: str, label: str | None = None, classify=None, evaluate=None):
        """Time obj.name; `evaluate(result) -> arrays` are evaluated inside the timer (the phases
        build lazy work that would otherwise run at the next phase's evaluation)."""
        f = getattr(obj, name, None)
        if f is None:
            return
        label = label or name

        def timed(*a, **k):
            t0 = time.perf_counter()
            mx.synchronize()
            t1 = time.perf_counter()
            out = f(*a, **k)
            if evaluate is not None:
                mx.eval(evaluate(out))
            mx.synchronize()
            t2 = time.perf_counter()
            lab = label + (classify(*a, **k) if classify else "")
            self.calls[lab].append(((t1 - t0) * 1e3, (t2 - t1) * 1e3))
            return out

        setattr(obj, name, timed)

    def summary(self) -> dict:
        out = {}
        for lab, xs in sorted(self.calls.items()):
            own = [o for _, o in xs]
            out[lab] = {"n": len(xs), "own_ms_total": round(sum(own), 1), "own_ms_p50": round(statistics.median(own), 2),
                        "own_ms_max": round(max(own), 2), "wait_ms_total": round(sum(w for w, _ in xs), 1)}
        return out


def instrument(engine) -> Phases:
    ph = Phases()
    r, s = engine.runner, engine.scheduler

    def batch_arrays(_=None):
        return cache_arrays(r.caches or [])

    def pool_arrays(_=None):
        pools = [r.prefix_io.pool] + ([r.prefix_io.window_pool] if r.prefix_io.window_pool is not None else [])
        return [a for p in pools for a in p.arrays()]

    def step_values(ctx):
        return [v for v in ctx.values.values() if isinstance(v, mx.array)] + cache_arrays(ctx.inputs.caches)

    ph.wrap(s, "schedule", "scheduler.schedule")
    ph.wrap(r, "run_chunk", "runner.prefill_chunk",  # a prepared chunk's own forward (the label predates the split)
            classify=lambda prep: " (final)" if prep.final else " (mid)")
    ph.wrap(r, "prefill_batches", "runner.prefill_batch")
    ph.wrap(r, "_join_rows", "runner.join_rows", evaluate=batch_arrays)
    ph.wrap(r, "leave", "runner.leave", evaluate=batch_arrays)
    ph.wrap(r, "decode", "runner.decode")
    ph.wrap(r.sampler, "tensors", "sampler.tensors")
    ph.wrap(r.sampler, "host_state", "sampler.host_state")
    pre = r.compiled.prefill
    ph.wrap(pre, "forward", "prefill.forward", classify=lambda inp: " (final)" if inp.final else " (mid)",
            evaluate=step_values)
    ph.wrap(pre, "head", "prefill.head")
    if r.prefix_io is not None:
        for n in ("restore", "after_chunk", "prefill_pieces", "store_prompt", "store_prompt_rows", "store_rows"):
            ph.wrap(r.prefix_io, n, "prefix_io." + n, evaluate=pool_arrays)
    ph.wrap(engine, "_postprocess_prefill", "engine.postprocess_prefill")
    ph.wrap(engine, "_postprocess_decode", "engine.postprocess_decode")
    ph.wrap(engine, "_delta", "engine.delta")
    return ph


def drive(engine, mix) -> dict:
    pending = list(mix)
    t0 = time.perf_counter()
    steps, first = [], {}
    while pending or engine.has_unfinished():
        now = time.perf_counter() - t0
        while pending and pending[0][0] <= now:
            _, ids, n_out = pending.pop(0)
            engine.add_request(ids, SamplingParams(max_tokens=n_out, ignore_eos=True))
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - t0)))
            continue
        ts = time.perf_counter()
        outs = engine.step()
        steps.append((time.perf_counter() - ts) * 1e3)
        for o in outs:
            first.setdefault(o.request_id, time.perf_counter() - t0)
    return {"wall_s": round(time.perf_counter() - t0, 2), "steps": len(steps),
            "step_ms_p50": round(statistics.median(steps), 2), "step_ms_max": round(max(steps), 2),
            "ttft_s_p50": round(statistics.median(first.values()), 2),
            "active_mib": round(mx.get_active_memory() / 2**20), "cache_mib": round(mx.get_cache_memory() / 2**20),
            "peak_mib": round(mx.get_peak_memory() / 2**20)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/step_phases.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input", default="64,4096")
    p.add_argument("--output", default="32,512")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--unprobed", action="store_true", help="also run each repeat once without the wrappers first")
    p.add_argument("--json")
    a = p.parse_args(argv)
    engine = Engine.load(a.model, max_batch=a.max_batch)
    vocab = int(engine.config["vocab_size"])
    lo_i, hi_i = map(int, a.input.split(","))
    lo_o, hi_o = map(int, a.output.split(","))
    engine.warm_up()
    drive(engine, make_mix(4, vocab, (lo_i, hi_i), (4, 8), math.inf, 999))
    res = []
    for rep in range(a.repeats):
        if a.unprobed:
            u = drive(engine, make_mix(a.requests, vocab, (lo_i, hi_i), (lo_o, hi_o), math.inf, 100 + rep))
            print(json.dumps({"repeat": rep, "unprobed": u}), flush=True)
            res.append({"repeat": rep, "unprobed": u})
    ph = instrument(engine)
    for rep in range(a.repeats):
        d = drive(engine, make_mix(a.requests, vocab, (lo_i, hi_i), (lo_o, hi_o), math.inf, rep))
        print(json.dumps({"repeat": rep, "probed": d}), flush=True)
        res.append({"repeat": rep, "probed": d})
    summ = ph.summary()
    for lab, v in sorted(summ.items(), key=lambda kv: -kv[1]["own_ms_total"]):
        print(f"{lab:36s} n={v['n']:5d} own total {v['own_ms_total']:9.1f} ms  p50 {v['own_ms_p50']:8.2f}  max {v['own_ms_max']:8.2f}"
              f"  wait {v['wait_ms_total']:8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": res, "phases": summ}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
