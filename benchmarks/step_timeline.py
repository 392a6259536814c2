"""Per-step timeline of the Engine under Poisson arrivals: why running streams stall.

Drives `Engine.step()` directly (no HTTP) with requests arriving over wall-clock time, mixed
prompt and output lengths, and records for every step: its wall time, the prompt tokens it
prefilled, whether it decoded (a burst holds decode back), the decode rows, the requests that
finished their prompt, and the KV copies the batch caches made (capacity growth, a joining row's
concatenate, a leaving row's filter) in bytes. Then it pools every request's inter-token gaps and
says which steps the longest gaps spanned.

The probe instruments from the outside (wrappers on the engine's scheduler and runner objects and
on the FullKV class for the duration of the run); the runtime has no probe code.

    python -m graphc.benchmarks.step_timeline --model /tmp/small --requests 48 --rate 20
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from contextlib import contextmanager

import mlx.core as mx

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache import full as full_cache
from graphc.runtime.scheduler_costs import StepCosts


def _lognormal(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    if lo >= hi:
        return [lo] * n
    mu, sigma = (math.log(lo) + math.log(hi)) / 2, (math.log(hi) - math.log(lo)) / 4
    return [min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def make_mix(n: int, vocab: int, inputs: tuple[int, int], outputs: tuple[int, int], rate: float, seed: int):
    """(arrival s, prompt ids, max_tokens) per request; rate inf: all at t=0."""
    rng = random.Random(seed)
    ins, outs = _lognormal(rng, n, *inputs), _lognormal(rng, n, *outputs)
    t, out = 0.0, []
    for n_in, n_out in zip(ins, outs):
        out.append((t, [rng.randrange(3, vocab) for _ in range(n_in)], n_out))
        t += 0.0 if math.isinf(rate) else rng.expovariate(rate)
    return out


class Copies:
    """Bytes the batch caches copied during the current step, by cause."""

    def __init__(self):
        self.step = {"grow": 0, "join": 0, "leave": 0}


def _nbytes(c) -> int:
    return sum(getattr(c, n).nbytes for n in c.PLANES if getattr(c, n) is not None)


@contextmanager
def watch_caches(copies: Copies):
    """Count the bytes FullKV's growth (vacant rows dropped in it included), extend_all (rows
    joining, vacant rows dropped on the way) and filter (rows leaving) write."""
    cls = full_cache.FullKV
    grow, extend_all, filt, fill = cls._grow, cls.extend_all, cls.filter, cls.fill_rows

    def _grow(self, new, need):
        grow(self, new, need)
        copies.step["grow"] += _nbytes(self)

    def _extend_all(self, others, keep=None):
        extend_all(self, others, keep)
        # nothing joining: vacant rows dropped in a growing step's copy (runtime/batch_rows.py)
        copies.step["join" if others else "grow"] += _nbytes(self)

    def _filter(self, rows):
        filt(self, rows)
        copies.step["leave"] += _nbytes(self)

    def _fill_rows(self, slots, others):
        fill(self, slots, others)  # joining rows written into vacant ones: their own bytes only
        copies.step["join"] += sum(_nbytes(o) * sum(o.idx - p for p in o.left_pad) // (o.batch * o.capacity)
                                   for o in others)

    cls._grow, cls.extend_all, cls.filter, cls.fill_rows = _grow, _extend_all, _filter, _fill_rows
    try:
        yield
    finally:
        cls._grow, cls.extend_all, cls.filter, cls.fill_rows = grow, extend_all, filt, fill


def run_timeline(engine, mix, *, log=None) -> dict:
    """Run `mix` (make_mix) through `engine`; the per-step records and per-request token times."""
    sched, runner = engine.scheduler, engine.runner
    copies = Copies()
    steps: list[dict] = []
    cur: dict = {}
    plain_schedule, plain_budget = sched.schedule, sched.step_budget

    def step_budget():
        cur["budget"] = plain_budget()  # what the scheduler allowed this step ("auto": measured)
        return cur["budget"]

    def schedule():
        s = plain_schedule()
        now = time.perf_counter() - t0
        for req, n in s.prefill:  # when each request's prompt first got budget, and in how many steps
            first_chunk.setdefault(req.id, now)
            chunk_steps[req.id] = chunk_steps.get(req.id, 0) + 1
        cur.update(prefill=sum(n for _, n in s.prefill), decode_flag=s.decode,
                   bursting=sched._burst_left > 0 or not s.decode, running_before=len(sched.running))
        return s

    sched.schedule, sched.step_budget = schedule, step_budget
    pending = list(mix)
    first_chunk: dict[str, float] = {}
    chunk_steps: dict[str, int] = {}
    prompt_len: dict[str, int] = {}
    t0 = time.perf_counter()
    times: dict[str, list[float]] = {}
    arrival: dict[str, float] = {}
    with watch_caches(copies):
        while pending or engine.has_unfinished():
            now = time.perf_counter() - t0
            while pending and pending[0][0] <= now:
                at, ids, n_out = pending.pop(0)
                rid = engine.add_request(ids, SamplingParams(max_tokens=n_out, ignore_eos=True))
                arrival[rid], times[rid], prompt_len[rid] = at, [], len(ids)
            if not engine.has_unfinished():
                time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - t0)))
                continue
            copies.step = {"grow": 0, "join": 0, "leave": 0}
            cur.clear()
            rows_before = len(runner.rows)
            ts = time.perf_counter()
            outs = engine.step()
            te = time.perf_counter()
            firsts = [o.request_id for o in outs if o.new_token_ids and not times[o.request_id]]
            for o in outs:
                times[o.request_id] += [te - t0] * len(o.new_token_ids)
            steps.append({"i": len(steps), "t": round(ts - t0, 4), "ms": round((te - ts) * 1e3, 2),
                          "prefill": cur.get("prefill", 0), "budget": cur.get("budget"), "decode": cur.get("decode_flag", True),
                          "rows": rows_before, "first_tokens": len(firsts),
                          "waiting": len(sched.waiting), "copies_mib": {k: round(v / 2**20, 2)
                                                                       for k, v in copies.step.items()},
                          "capacity": runner.caches[0].capacity if runner.caches else 0})
    sched.schedule, sched.step_budget = plain_schedule, plain_budget
    return {"steps": steps, "times": times, "arrival": arrival, "first_chunk": first_chunk,
            "chunk_steps": chunk_steps, "prompt_len": prompt_len}


def _pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(res: dict, top: int = 5) -> dict:
    steps, times = res["steps"], res["times"]
    ends = [s["t"] + s["ms"] / 1e3 for s in steps]
    gaps = []  # (gap s, request, index of the step that ended it)
    for rid, ts in times.items():
        for a, b in zip(ts, ts[1:]):
            if b > a:
                gaps.append((b - a, rid, a, b))
    ttft = [ts[0] - res["arrival"][r] for r, ts in times.items() if ts]
    plain = [s["ms"] for s in steps if s["decode"] and not s["prefill"] and not any(s["copies_mib"].values())]
    worst = []
    for g, rid, a, b in sorted(gaps, reverse=True)[:top]:
        spanned = [s for s, e in zip(steps, ends) if a + 1e-3 < e <= b + 1e-3]  # records are rounded
        worst.append({"gap_ms": round(g * 1e3, 1), "steps": len(spanned),
                      "no_decode_steps": sum(not s["decode"] for s in spanned),
                      "prefill_tokens": sum(s["prefill"] for s in spanned),
                      "step_ms": [s["ms"] for s in spanned],
                      "copies_mib": round(sum(sum(s["copies_mib"].values()) for s in spanned), 2)})
    g_ms = [g * 1e3 for g, *_ in gaps]
    # The longest waits for a first token, split into queueing (arrival to the prompt's first chunk)
    # and prefill (first chunk to first token, over how many steps): which requests and why.
    slow = sorted(((ts[0] - res["arrival"][r], r) for r, ts in times.items() if ts), reverse=True)[:top]
    worst_ttft = [{"ttft_ms": round(t * 1e3, 1), "prompt": res["prompt_len"][r],
                   "queue_ms": round((res["first_chunk"][r] - res["arrival"][r]) * 1e3, 1),
                   "prefill_ms": round((times[r][0] - res["first_chunk"][r]) * 1e3, 1),
                   "prefill_steps": res["chunk_steps"][r]} for t, r in slow if r in res.get("first_chunk", {})]
    return {"steps": len(steps), "wall_s": round(ends[-1], 2) if ends else 0.0, "no_decode_steps_with_rows": sum(1 for s in steps if not s["decode"] and s["rows"]),
            "plain_decode_ms_p50": _pct(plain, 0.5), "max_step_ms": max((s["ms"] for s in steps), default=None),
            "max_prefill_in_a_step_with_rows": max((s["prefill"] for s in steps if s["rows"]), default=0),
            "itl_ms_p50": _pct(g_ms, 0.5), "itl_ms_p99": _pct(g_ms, 0.99), "itl_ms_max": max(g_ms, default=None),
            "ttft_ms_p50": _pct([t * 1e3 for t in ttft], 0.5), "ttft_ms_p99": _pct([t * 1e3 for t in ttft], 0.99),
            "budget_p50_with_rows": _pct([s["budget"] for s in steps if s["rows"] and s["budget"]], 0.5),
            "first_ttft_ms": round(min(((ts[0] - res["arrival"][r], r) for r, ts in times.items() if ts),
                                       key=lambda x: res["arrival"][x[1]])[0] * 1e3, 1) if ttft else None,
            "copies_mib_total": {k: round(sum(s["copies_mib"][k] for s in steps), 1) for k in ("grow", "join", "leave")},
            "worst_gaps": worst, "worst_ttft": worst_ttft}


TABLE_KEYS = (("itl_ms_p99", "ITL p99 ms"), ("itl_ms_max", "ITL max ms"), ("plain_decode_ms_p50", "plain decode step ms"),
              ("ttft_ms_p50", "TTFT p50 ms"), ("ttft_ms_p99", "TTFT p99 ms"), ("wall_s", "wall s"))


def table(paths: list[str]) -> str:
    """A markdown table of --json files: per file, each metric's median [min-max] over repeats."""
    rows = ["| run | " + " | ".join(h for _, h in TABLE_KEYS) + " |", "|---" * (len(TABLE_KEYS) + 1) + "|"]
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        cells = []
        for k, _ in TABLE_KEYS:
            xs = [r["summary"][k] for r in d["runs"]]
            cells.append(f"{statistics.median(xs):.0f} [{min(xs):.0f}-{max(xs):.0f}]")
        a = d["args"]
        name = f"step_tokens={a['step_tokens'] or 'engine default'} rate={a['rate']:g}"
        if a.get("burst_tokens") is not None:
            name += f" burst={a['burst_tokens']}"
        rows.append(f"| {name} ({path.rsplit('/', 1)[-1]}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _step_tokens(v: str):
    return v if v == "auto" else int(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m graphc.benchmarks.step_timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder (graphc make-model)")
    p.add_argument("--table", nargs="+", metavar="JSON", help="print a table of earlier --json files and exit")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--rate", type=float, default=20.0, help="requests/s (Poisson); inf: all at t=0")
    p.add_argument("--input", default="16,1024", help="prompt tokens lo,hi (lognormal)")
    p.add_argument("--output", default="16,128", help="output tokens lo,hi (lognormal)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--step-tokens", type=_step_tokens, default=None,
                   help="Engine(step_tokens=): prompt tokens per step while rows decode, or 'auto' "
                        "(default: the engine's)")
    p.add_argument("--step-time-factor", type=float, default=None,
                   help="Scheduler.STEP_TIME_FACTOR for step_tokens='auto' (default: the scheduler's)")
    p.add_argument("--burst-tokens", type=int, default=None,
                   help="Scheduler.BURST_TOKENS for this engine: prompt tokens an idle engine's burst may admit "
                        "before decoding (default: the scheduler's)")
    p.add_argument("--pad-final-chunk", choices=("auto", "on", "off"), default="auto",
                   help="Engine(pad_final_chunk=): a prompt's last chunk padded to 128 tokens (docs/scheduling.md)")
    p.add_argument("--final-chunk", choices=("auto", "whole", "split"), default="auto",
                   help="Engine(final_chunk=): a prompt's last chunk as one forward or L-1 then 1 (docs/scheduling.md)")
    p.add_argument("--start", choices=("probe", "serve", "none"), default="probe",
                   help="before repeat 0: probe = 4 requests of the mix (first-call costs left out), serve = "
                        "Engine.warm_up() as `graphc serve` runs it (repeat 0 = a fresh server's first traffic), "
                        "none = nothing")
    p.add_argument("--sweep-step-tokens", default=None, metavar="N,N,...",
                   help="on one engine, the repeats once per step_tokens value (ints or 'auto'), in this order; "
                        "each value starts with a fresh cost model")
    p.add_argument("--compile", choices=("eager", "auto", "on", "measured"), default=None,
                   help="Engine(compile=) (default: the engine's)")
    p.add_argument("--vacant-rows", choices=("auto", "quarter", "copies", "reuse"), default=None,
                   help="decode: {vacant_rows: ...}: when the rows of ended requests are dropped "
                        "(docs/scheduling.md \"Rows left vacant\"; default: the graph's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", help="write every step record and the summaries here")
    p.add_argument("--top", type=int, default=5, help="longest gaps to explain")
    a = p.parse_args(argv)
    if a.table:
        print(table(a.table))
        return 0
    if not a.model:
        p.error("--model is required (or --table)")
    lo_i, hi_i = map(int, a.input.split(","))
    lo_o, hi_o = map(int, a.output.split(","))
    kw = {"max_batch": a.max_batch, "prefill_chunk": a.prefill_chunk,
          "pad_final_chunk": {"on": True, "off": False}.get(a.pad_final_chunk, "auto"), "final_chunk": a.final_chunk}
    if a.step_tokens is not None:
        kw["step_tokens"] = a.step_tokens
    if a.compile is not None:
        kw["compile"] = {"eager": False, "on": True}.get(a.compile, a.compile)
    if a.vacant_rows is not None:
        kw["decode_options"] = {"vacant_rows": a.vacant_rows}
    engine = Engine.load(a.model, **kw)
    if a.burst_tokens is not None:
        engine.scheduler.BURST_TOKENS = a.burst_tokens
    if a.step_time_factor is not None:
        engine.scheduler.STEP_TIME_FACTOR = a.step_time_factor
    vocab = int(engine.config["vocab_size"])
    if a.start == "probe":  # first-call costs (kernel builds, lazy loads) out of the timeline
        run_timeline(engine, make_mix(4, vocab, (lo_i, hi_i), (4, 8), math.inf, a.seed + 999))
    elif a.start == "serve":  # what `graphc serve` runs before ready: repeat 0 is its first traffic
        print(json.dumps({"warm_up_s": round(engine.warm_up(), 3)}), flush=True)
    out = []
    sweep = [_step_tokens(v) for v in a.sweep_step_tokens.split(",")] if a.sweep_step_tokens else [None]
    for i, budget in enumerate(sweep):
        if budget is not None:  # the lab sets the engine's own knob between runs (one load for the sweep)
            engine.scheduler.step_tokens = budget
            engine.scheduler.costs = StepCosts()
        for r in range(a.repeats):
            # a fresh mix each repeat (its own seed): a repeat of the same prompts would hit the prefix cache
            seed = a.seed + r + 1000 * i
            res = run_timeline(engine, make_mix(a.requests, vocab, (lo_i, hi_i), (lo_o, hi_o), a.rate, seed))
            s = summarize(res, a.top)
            label = {"repeat": r, "step_tokens": budget if budget is not None else a.step_tokens}
            print(json.dumps({**label, **{k: v for k, v in s.items() if k not in ("worst_gaps", "worst_ttft")}}),
                  flush=True)
            print(json.dumps({**label, "worst_ttft": s["worst_ttft"]}), flush=True)
            out.append({"summary": s, **label, **res})
            mx.clear_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": out}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
