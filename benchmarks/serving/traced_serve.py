"""`graphc serve` with every engine step recorded: the door's stalls, step by step.

The serving bench reads the door from outside (client timings, /metrics histograms); this runs
the same server with step_timeline's probes installed from the outside (class wrappers on the
scheduler, the engine and FullKV for the process's life; the runtime has no probe code), so a
stream's long gap at the door can be read as the steps it spanned: their wall time, prompt
work, forwards' shapes, KV copies and the engine thread's time between steps.

    GRAPHC_STEP_TRACE=steps.jsonl python -m graphc.benchmarks.serving.traced_serve --model DIR ...
    python -m graphc.benchmarks.serving.traced_serve --summarize steps.jsonl [--top 8] [--requests 64 [--skip K]]

`graphc bench --serving --trace-steps` runs graphc this way and writes the trace beside the
server's log. Each line is one record: {"add": id, "t"} when a request reaches the engine, or a
step: {"t", "ms", "idle_ms" (engine thread between the last step's end and this one's start),
"prefill", "budget", "decode", "rows", "waiting", "groups": [[rows, tokens, offset], ..],
"chunked": [ids given prompt work], "phases_ms": {runner phase: host ms}, "copies_mib",
"capacity", "tokens": [an id per token it got]}. `--summarize` splits the trace into runs (by
request count with --requests, else at idle gaps) and prints for each step_timeline's summary: ITL p99, the worst gaps and the steps they spanned, the worst TTFTs,
and the steps by what they did (`step_classes`: decode, mixed, +join, +batched) with their
wall-time spread and the runner phases' median host time.
GRAPHC_SWITCH_INTERVAL=S sets the server's GIL switch interval (sys.setswitchinterval).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import threading
import time

from graphc.benchmarks.step_timeline import Copies, watch_caches, summarize
from graphc.runtime.engine import Engine
from graphc.runtime.runner import ModelRunner
from graphc.runtime.scheduler import Scheduler
from graphc.runtime.server.cli import add_parser  # `graphc serve`'s parser (benchmarks do not import the CLI)

RUN_GAP_S = 1.0  # no record for this long: an idle engine, which separates two runs
# The runner's parts of a step, each timed on the host (inclusive: `leave` runs inside the
# others' callers too; on a GPU a phase's time is where the host waited, not where the device worked).
PHASES = ("run_prefill", "_join_rows", "decode", "leave")


class StepTrace:
    """Writes one JSON line per engine step and per request added (thread-safe, line-buffered)."""

    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()
        self.ids: dict[str, int] = {}  # request id -> a short int in the trace
        self.last_end: float | None = None
        self.cur: dict = {}

    def short(self, rid: str) -> int:
        return self.ids.setdefault(rid, len(self.ids))

    def write(self, rec: dict) -> None:
        with self.lock:
            self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def install(path: str):
    """Wrap Engine.add_request / Engine.step and Scheduler.schedule / step_budget for every engine
    in this process; FullKV's copies are counted as step_timeline counts them. Returns (the
    trace, a function that takes the wrappers off again)."""
    trace, copies = StepTrace(path), Copies()
    add, step, schedule, budget = Engine.add_request, Engine.step, Scheduler.schedule, Scheduler.step_budget
    phased = [(ModelRunner, name, getattr(ModelRunner, name)) for name in PHASES]

    def timed(name, fn):
        def wrapper(self, *a, **kw):
            t = time.perf_counter()
            try:
                return fn(self, *a, **kw)
            finally:
                ph = trace.cur.setdefault("phases", {})
                ph[name] = round(ph.get(name, 0.0) + (time.perf_counter() - t) * 1e3, 2)
        return wrapper

    def add_request(self, *a, **kw):
        rid = add(self, *a, **kw)
        trace.write({"add": trace.short(rid), "t": round(time.perf_counter() - trace.t0, 4),
                     "prompt": len(self.request(rid).prompt_ids)})
        return rid

    def step_budget(self):
        trace.cur["budget"] = budget(self)
        return trace.cur["budget"]

    def sched(self):
        s = schedule(self)
        trace.cur.update(prefill=sum(n for _, n in s.prefill), decode=s.decode, waiting=len(self.waiting),
                         groups=[[len(g), max(n for _, n in g), min(r.prefilled for r, _ in g)] for g in s.groups],
                         chunked=[trace.short(r.id) for r, _ in s.prefill])
        return s

    def traced_step(self):
        copies.step = {"grow": 0, "join": 0, "leave": 0}
        trace.cur = {}
        rows = len(self.runner.rows)
        ts = time.perf_counter()
        outs = step(self)
        te = time.perf_counter()
        cur = trace.cur
        trace.write({"t": round(ts - trace.t0, 4), "ms": round((te - ts) * 1e3, 2),
                     "idle_ms": round((ts - trace.last_end) * 1e3, 2) if trace.last_end is not None else None,
                     "prefill": cur.get("prefill", 0), "budget": cur.get("budget"), "decode": cur.get("decode", True),
                     "rows": rows, "waiting": cur.get("waiting", 0), "groups": cur.get("groups", []),
                     "copies_mib": {k: round(v / 2**20, 2) for k, v in copies.step.items()},
                     "capacity": self.runner.caches[0].capacity if self.runner.caches else 0,
                     "chunked": cur.get("chunked", []), "phases_ms": cur.get("phases", {}),
                     "tokens": [trace.short(o.request_id) for o in outs for _ in o.new_token_ids]})
        trace.last_end = te if self.has_unfinished() else None
        return outs

    Engine.add_request, Engine.step = add_request, traced_step
    Scheduler.schedule, Scheduler.step_budget = sched, step_budget
    for cls, name, fn in phased:
        setattr(cls, name, timed(name, fn))
    watching = watch_caches(copies)
    watching.__enter__()  # until uninstall(): a server keeps it for its life

    def uninstall():
        Engine.add_request, Engine.step = add, step
        Scheduler.schedule, Scheduler.step_budget = schedule, budget
        for cls, name, fn in phased:
            setattr(cls, name, fn)
        watching.__exit__(None, None, None)
        trace.f.close()

    return trace, uninstall


def runs(lines: list[dict], requests: int | None = None, skip: int | None = None) -> list[dict]:
    """The trace as step_timeline results (run_timeline's shape), one per run. With `requests`:
    the first `skip` requests are one run (the server's and the bench's warm-up; None: the
    requests past a whole number of runs, fewer than `requests`), then every `requests` start
    the next (a run's steps are those before the next run's first request reaches the engine:
    the bench waits for a run to finish). Without: split where no record came for RUN_GAP_S
    (steps run back to back while any request is live, so that is an idle engine)."""
    out, cur, last, added = [], None, None, 0
    if requests is not None and skip is None:
        skip = sum("add" in rec for rec in lines) % requests
    for rec in lines:
        t = rec["t"]
        if requests is not None:
            new = "add" in rec and (added == 0 or added == skip or (added > skip and (added - skip) % requests == 0))
        else:
            new = cur is None or t - last >= RUN_GAP_S
        if new or cur is None:
            cur = {"steps": [], "times": {}, "arrival": {}, "first_chunk": {}, "chunk_steps": {}, "prompt_len": {},
                   "t0": t}
            out.append(cur)
        if "add" in rec:
            r = rec["add"]
            cur["arrival"][r], cur["times"][r], cur["prompt_len"][r] = t - cur["t0"], [], rec["prompt"]
            last, added = t, added + 1
            continue
        step = {**rec, "t": round(t - cur["t0"], 4), "i": len(cur["steps"]), "first_tokens": 0}
        end = step["t"] + rec["ms"] / 1e3
        for r in rec.get("chunked", []):
            cur["first_chunk"].setdefault(r, step["t"])
            cur["chunk_steps"][r] = cur["chunk_steps"].get(r, 0) + 1
        for r in rec["tokens"]:
            if r in cur["times"]:
                step["first_tokens"] += not cur["times"][r]
                cur["times"][r].append(end)
        cur["steps"].append(step)
        last = t + rec["ms"] / 1e3
    return out


def step_class(step: dict) -> str:
    """What a step did, for step_classes: decode only; prompt work while rows decode ("mixed"),
    with a row joining the batch ("+join") or a batched prefill of several prompts ("+batched");
    prompt work with no row decoding ("prefill")."""
    if not step["prefill"]:
        return "decode"
    kind = "mixed" if step["rows"] else "prefill"
    if any(g[0] > 1 for g in step.get("groups", [])):
        kind += "+batched"
    if "_join_rows" in step.get("phases_ms", {}):
        kind += "+join"
    return kind


def step_classes(steps: list[dict]) -> dict:
    """Per step_class: count, wall ms p50 / p90 / max, and each runner phase's median host ms."""
    by: dict[str, list] = {}
    for x in steps:
        by.setdefault(step_class(x), []).append(x)
    out = {}
    for name, xs in sorted(by.items()):
        ms = sorted(x["ms"] for x in xs)
        out[name] = {"n": len(xs), "ms_p50": ms[len(ms) // 2], "ms_p90": ms[int(0.9 * len(ms))], "ms_max": ms[-1],
                     "phases_ms_p50": {p: sorted(x.get("phases_ms", {}).get(p, 0.0) for x in xs)[len(xs) // 2]
                                       for p in PHASES}}
    return out


def summarize_file(path: str, top: int = 8, requests: int | None = None, skip: int | None = None) -> list[dict]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    results = []
    for res in runs(lines, requests, skip):
        if not res["steps"]:
            continue
        s = summarize(res, top=top)
        steps = res["steps"]
        idle = sorted(x["idle_ms"] for x in steps if x.get("idle_ms") is not None)
        s["requests"] = len(res["arrival"])
        s["engine_idle_between_steps_ms_p99"] = idle[min(len(idle) - 1, int(0.99 * len(idle)))] if idle else None
        s["step_classes"] = step_classes(steps)
        s["slowest_steps"] = [{k: x.get(k) for k in ("i", "t", "ms", "idle_ms", "prefill", "decode", "rows", "groups",
                                                     "phases_ms", "copies_mib", "capacity")}
                              for x in sorted(steps, key=lambda x: -x["ms"])[:top]]
        results.append(s)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--summarize":
        p = argparse.ArgumentParser(prog="python -m graphc.benchmarks.serving.traced_serve --summarize")
        p.add_argument("path")
        p.add_argument("--top", type=int, default=8)
        p.add_argument("--requests", type=int, default=None,
                       help="requests per run (a serving bench's --requests): split runs by request count")
        p.add_argument("--skip", type=int, default=None,
                       help="requests before the first run (default: what is left over past whole runs)")
        a = p.parse_args(argv[1:])
        for i, s in enumerate(summarize_file(a.path, a.top, a.requests, a.skip)):
            print(json.dumps({"run": i, **s}))
        return 0
    path = os.environ.get("GRAPHC_STEP_TRACE")
    if not path:
        print("set GRAPHC_STEP_TRACE=FILE (where the step records go), or pass --summarize FILE", file=sys.stderr)
        return 2
    install(path)
    interval = os.environ.get("GRAPHC_SWITCH_INTERVAL")  # seconds: the GIL's switch interval, to test its share
    if interval:
        sys.setswitchinterval(float(interval))
    parser = argparse.ArgumentParser(prog="python -m graphc.benchmarks.serving.traced_serve")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", *argv])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
