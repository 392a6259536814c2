"""`graphc bench --serving`: both servers on one model folder, alternated, repeated, at several
Poisson rates plus saturation; per rate per server the medians over repeats with min/max spread."""

from __future__ import annotations

import math
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..env import describe, environment
from ..report import write_json
from .client import Result, run_load
from .engine_side import run_quantiles, scrape
from .http import require
from .options import CPU_DEFAULTS, GPU_DEFAULTS
from .plot import plot_serving
from .servers import SERVERS, Server, free_port
from .workload import as_dicts, eos_token_ids, ids_without_text, make_workload, summary

# Each metric: (key, column header, scale to print, format)
METRICS = (("req_per_s", "req/s", 1, ".2f"), ("output_tok_per_s", "out tok/s", 1, ".1f"),
           ("ttft_p50", "TTFT p50 ms", 1e3, ".1f"), ("ttft_p99", "TTFT p99 ms", 1e3, ".1f"),
           ("itl_p50", "ITL p50 ms", 1e3, ".2f"), ("itl_p99", "ITL p99 ms", 1e3, ".2f"),
           ("tpot_p50", "TPOT p50 ms", 1e3, ".2f"), ("errors", "errors", 1, ".0f"))
# graphc's own side of the same runs (its /metrics histograms, engine_side.py): the TTFT from the
# request's arrival at the engine, and of that the queueing before its prompt's first chunk ran;
# the gaps between a stream's tokens as the engine hands them out (its ITL before the door), and how
# long those hand-overs waited for the server's event loop.
ENGINE_METRICS = ("engine_ttft_p50", "engine_ttft_p99", "engine_queue_p50", "engine_queue_p99", "engine_tpot_p50",
                  "engine_itl_p50", "engine_itl_p99", "engine_handover_p50", "engine_handover_p99",
                  *(f"engine_step_{k}_{q}" for k in ("decode", "mixed", "prefill") for q in ("p50", "p99", "count")),
                  "engine_fused_chunks", "engine_gc_full_collections", "engine_gc_pause_s")

@dataclass
class ServingConfig:
    model: str
    rates: tuple = ()
    requests: int = 32
    repeats: int = 3
    max_batch: int = 64
    min_input: int = 0
    max_input: int = 0
    min_output: int = 0
    max_output: int = 0
    concurrency: int | None = None
    seed: int = 0
    port: int = 0
    servers: tuple = ("graphc", "mlx_lm")
    graphc_args: list = field(default_factory=list)
    mlx_args: list = field(default_factory=list)
    log_dir: str = "serving-logs"
    progress: bool = True
    keep_servers: bool = False
    trace_steps: bool = False  # graphc under benchmarks/serving/traced_serve.py, its steps in log_dir
    settle: float = 0.0  # seconds a started server idles before its first requests
    mlx_env: dict = field(default_factory=dict)  # environment for mlx_lm.server only


def parse_rates(s: str) -> tuple:
    try:
        rates = tuple(float(x) for x in s.split(",") if x)
    except ValueError:
        raise SystemExit(f"graphc bench: --rates takes req/s values and inf, e.g. 1,4,inf; got {s!r}")
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit(f"graphc bench: --rates must be positive (inf = all requests at once), got {s!r}")
    return rates


def apply_defaults(cfg: ServingConfig, rates: str | None) -> str | None:
    """Fill unset lengths/rates from the device's defaults; returns a note when the CPU ones were used."""
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    d = CPU_DEFAULTS if on_cpu else GPU_DEFAULTS
    for k in ("min_input", "max_input", "min_output", "max_output"):
        if not getattr(cfg, k):
            setattr(cfg, k, d[k])
    cfg.rates = parse_rates(rates or d["rates"])
    if on_cpu and rates is None:
        return (f"CPU device: small defaults (input {cfg.min_input}-{cfg.max_input}, output {cfg.min_output}-"
                f"{cfg.max_output} tokens, rates {d['rates']}); the issue's mix is the GPU default "
                f"(input 64-4096, output 32-512): pass --rates and the length flags to run it here")
    return None


def _pct(xs: list, q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def run_metrics(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    return {"duration_s": duration, "req_per_s": len(ok) / duration,
            "output_tok_per_s": sum(r.output_tokens for r in ok) / duration,
            "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99), "itl_p50": _pct(itl, 50),
            "itl_p99": _pct(itl, 99), "tpot_p50": _pct(tpot, 50), "errors": len(results) - len(ok),
            "output_tokens": sum(r.output_tokens for r in ok), "target_tokens": sum(r.target_tokens for r in results),
            "exact_length": sum(r.output_tokens == r.target_tokens for r in ok),
            "text_chunks": sum(r.text_chunks for r in ok),
            "retries": sum(r.retries for r in results), "error_samples": [r.error for r in results if r.error][:3]}


def _spread(vals: list) -> dict | None:
    vals = [v for v in vals if v is not None]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None


def aggregate(runs: list[dict], servers, rates) -> dict:
    out = {}
    for rate in rates:
        per = {}
        for s in servers:
            mine = [r for r in runs if r["server"] == s and r["rate"] == rate]
            per[s] = {k: _spread([r["metrics"][k] for r in mine]) for k, *_ in METRICS}
            per[s].update({k: _spread([r["metrics"].get(k) for r in mine]) for k in ENGINE_METRICS})
            per[s]["repeats"] = len(mine)
            # The ITL goal in one number: the client's ITL p99 over the engine's own decode step
            # p50 in the same run (graphc alone exports its steps)
            per[s]["itl_p99_over_decode_step"] = _spread([
                r["metrics"]["itl_p99"] / r["metrics"]["engine_step_decode_p50"] for r in mine
                if r["metrics"].get("itl_p99") and r["metrics"].get("engine_step_decode_p50")])
        if "graphc" in servers and "mlx_lm" in servers:
            # Ratios within one repeat (the two servers ran back to back), then their spread. A repeat
            # in which either server failed requests gives none: the two did unlike work (a server
            # that dies early "wins" TTFT p99 on the few it answered).
            pairs = [(a["metrics"], b["metrics"]) for a in runs for b in runs if a["rate"] == b["rate"] == rate
                     and a["repeat"] == b["repeat"] and a["server"] == "graphc" and b["server"] == "mlx_lm"]
            clean = [(g, m) for g, m in pairs if not g["errors"] and not m["errors"]]
            per["graphc_over_mlx_lm"] = {
                k: _spread([g[k] / m[k] if g[k] and m[k] else None for g, m in clean])
                for k in ("output_tok_per_s", "ttft_p99", "itl_p99")}
            per["graphc_over_mlx_lm"]["repeats_with_errors"] = len(pairs) - len(clean)
        out[_rate_key(rate)] = per
    return out


def _rate_key(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _cell(spread: dict | None, scale: float, fmt: str) -> str:
    if spread is None:
        return "-"
    m, lo, hi = (spread[k] * scale for k in ("median", "min", "max"))
    return f"{m:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]" if lo != hi else f"{m:{fmt}}"


def rate_table(rate_key: str, per: dict, servers) -> str:
    head = [f"rate {rate_key} req/s" if rate_key != "inf" else "rate inf (saturation)"] + [h for _, h, *_ in METRICS]
    rows = [[s] + [_cell(per[s][k], sc, f) for k, _, sc, f in METRICS] for s in servers]
    g = per.get("graphc", {})
    if g.get("engine_ttft_p99"):  # the engine's share of graphc's TTFT, under the TTFT columns
        rows.append(["graphc engine", "", "", _cell(g["engine_ttft_p50"], 1e3, ".1f"),
                     _cell(g["engine_ttft_p99"], 1e3, ".1f"), _cell(g.get("engine_itl_p50"), 1e3, ".2f"),
                     _cell(g.get("engine_itl_p99"), 1e3, ".2f"), _cell(g.get("engine_tpot_p50"), 1e3, ".2f"), ""])
        rows.append(["  of it queued", "", "", _cell(g.get("engine_queue_p50"), 1e3, ".1f"),
                     _cell(g.get("engine_queue_p99"), 1e3, ".1f"), "", "", "", ""])
        for kind in ("decode", "mixed"):  # the engine's steps by kind, their times under the ITL columns
            if g.get(f"engine_step_{kind}_p99"):
                rows.append([f"  {kind} steps", _cell(g.get(f"engine_step_{kind}_count"), 1, ".0f"), "", "", "",
                             _cell(g.get(f"engine_step_{kind}_p50"), 1e3, ".2f"),
                             _cell(g.get(f"engine_step_{kind}_p99"), 1e3, ".2f"), "", ""])
        if g.get("engine_fused_chunks"):  # --mixed-step on: prompt chunks that rode a decode forward
            rows.append(["  chunks fused", _cell(g["engine_fused_chunks"], 1, ".0f"), "", "", "", "", "", "", ""])
        if g.get("itl_p99_over_decode_step"):  # the client's ITL p99 in decode steps, under ITL p99
            rows.append(["  ITL p99 / decode step", "", "", "", "", "", _cell(g["itl_p99_over_decode_step"], 1, ".2f"),
                         "", ""])
        if g.get("engine_handover_p99"):  # the engine thread -> event loop wait, under the ITL columns
            rows.append(["  loop hand-over", "", "", "", "", _cell(g.get("engine_handover_p50"), 1e3, ".2f"),
                         _cell(g.get("engine_handover_p99"), 1e3, ".2f"), "", ""])
    if "graphc_over_mlx_lm" in per:
        r = per["graphc_over_mlx_lm"]
        dropped = r.get("repeats_with_errors")
        label = f"graphc/mlx_lm ({dropped} repeats with errors left out)" if dropped else "graphc/mlx_lm"
        rows.append([label, "", _cell(r["output_tok_per_s"], 1, ".2f"), "", _cell(r["ttft_p99"], 1, ".2f"),
                     "", _cell(r["itl_p99"], 1, ".2f"), "", ""])
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(x, widths)))
                     for x in [head] + rows)


@contextmanager
def _started(cfg: ServingConfig, spec, startups: list, rep: int):
    """A ready server (its startup time recorded), warmed by two tiny requests: a server's first
    requests pay lazy loads and kernel builds, which belong to startup, not to the first rate."""
    port = cfg.port + (spec.name != "graphc") if cfg.port else free_port()
    extra = cfg.graphc_args if spec.name == "graphc" else cfg.mlx_args
    trace = Path(cfg.log_dir) / f"{spec.name}-steps-{rep}.jsonl" if cfg.trace_steps and spec.name == "graphc" else None
    srv = Server(spec, cfg.model, port, cfg.max_batch, Path(cfg.log_dir) / f"{spec.name}.log", extra, trace=trace,
                 env=cfg.mlx_env if spec.name == "mlx_lm" else None)
    with srv as url:
        startups.append({"server": spec.name, "repeat": rep, "startup_s": srv.startup_s})
        time.sleep(cfg.settle)  # a server that idles after ready, as deployed ones do before their clients
        run_load(url, make_workload(cfg.model, 2, 8, 16, 4, 4, cfg.seed + 1), math.inf,
                 extra=spec.fixed_length_body(eos_token_ids(cfg.model)))
        yield srv


# What to try when a server ran out of device memory during a run.
FAILURE_HINTS = {
    "mlx_lm": "; mlx_lm.server prefills up to --prompt-concurrency prompts in one forward: "
              "--mlx-args=--prompt-concurrency=8 (or a smaller --max-batch) fits more devices; a "
              "`cudaGraphInstantiate` out of memory is MLX's CUDA graphs: --mlx-env MLX_USE_CUDA_GRAPHS=0",
    "graphc": "; see --kv-budget-tokens and --max-batch (docs/server.md)",
}


def run_serving(cfg: ServingConfig, log=print, checkpoint=None) -> dict:
    """`checkpoint(runs)` after every measured run: a killed invocation still leaves what it measured."""
    specs = [s for s in SERVERS if s.name in cfg.servers]
    reqs = make_workload(cfg.model, cfg.requests, cfg.min_input, cfg.max_input, cfg.min_output, cfg.max_output,
                         cfg.seed)
    # Every rate of every repeat gets the same lengths with prompts cut from other places in the
    # corpus (both servers the same ones): the same prompts again would be prefix-cache hits from
    # the rate before, so only a server's first rate would measure prefill.
    fresh = [[make_workload(cfg.model, cfg.requests, cfg.min_input, cfg.max_input, cfg.min_output,
                            cfg.max_output, cfg.seed, variant=1 + rep * len(cfg.rates) + i)
              for i in range(len(cfg.rates))] for rep in range(cfg.repeats)]
    eos = eos_token_ids(cfg.model)
    env = environment()
    log(f"serving bench: {describe(env)}; {len(reqs)} requests per rate, rates "
        f"{','.join(_rate_key(r) for r in cfg.rates)}, {cfg.repeats} repeats, max batch {cfg.max_batch}")
    holes, vocab = ids_without_text(cfg.model)
    if holes:
        log(f"warning: {holes} of the model's {vocab} token ids have no token in its tokenizer.json: a random-weight "
            "model generates them, graphc streams no chunk for them and mlx_lm.server a '!', so ITL and TTFT "
            "compare chunks of different sizes (python -m graphc.benchmarks.serving.make_shape writes folders "
            "without holes; docs/serving-bench.md)")
    runs, startups = [], []
    bar = tqdm(total=cfg.repeats * len(specs) * len(cfg.rates), desc="serving", unit="run",
               disable=not cfg.progress, file=sys.stderr)
    # Repeats alternate who goes first (drift hits both), each server started afresh per repeat;
    # --keep-servers instead runs one server's repeats on one start, servers one after the other
    # (only one holds device memory at a time: an idle server's KV pool and buffer cache can leave
    # the other too little), so repeats sample the load and cost no restarts.
    if cfg.keep_servers:
        blocks = [(spec, list(range(cfg.repeats))) for spec in specs]
    else:
        blocks = [(spec, [rep]) for rep in range(cfg.repeats) for spec in (specs if rep % 2 == 0 else specs[::-1])]
    for spec, reps in blocks:
        # A server that broke during a run (out of memory, a dead generation thread: its log says so)
        # fails every request after it. It is started again for the runs left, so each of them
        # measures a live server; the broken run keeps its errors and `startup` lists the restart.
        todo = [(rep, i, rate) for rep in reps for i, rate in enumerate(cfg.rates)]
        while todo:
            with _started(cfg, spec, startups, todo[0][0]) as srv:
                while todo:
                    rep, i, rate = todo.pop(0)
                    bar.set_postfix_str(f"repeat {rep + 1} {spec.name} rate {_rate_key(rate)}")
                    m = _measure(srv, fresh[rep][i], rate, cfg.concurrency, spec.fixed_length_body(eos), cfg.seed + rep)
                    if why := m.get("server_failure"):
                        hint = FAILURE_HINTS.get(spec.name, "") if "out of memory" in why.lower() else ""
                        bar.write(f"  warning: {spec.name} broke during this run ({srv.log_path}): {why[:300]}{hint}",
                                  file=sys.stderr)
                    runs.append({"server": spec.name, "repeat": rep, "rate": rate, "metrics": m})
                    bar.update(1)
                    if checkpoint:
                        checkpoint([{**r, "rate": _rate_key(r["rate"])} for r in runs])
                    bar.write(_run_line(spec.name, rep, rate, m, len(reqs)), file=sys.stderr)
                    if m.get("server_failure") and todo:
                        bar.write(f"  restarting {spec.name} for the {len(todo)} runs left", file=sys.stderr)
                        break
    if runs:
        for rate in cfg.rates:
            per = aggregate(runs, [s.name for s in specs], [rate])[_rate_key(rate)]
            bar.write(rate_table(_rate_key(rate), per, [s.name for s in specs]), file=sys.stderr)
    bar.close()
    config = {**asdict(cfg), "rates": [_rate_key(r) for r in cfg.rates]}
    return {"kind": "serving", "environment": env, "config": config,
            "workload": {**summary(reqs), "requests_list": as_dicts(reqs), "eos_ids_biased_for_mlx_lm": eos},
            "runs": [{**r, "rate": _rate_key(r["rate"])} for r in runs], "startup": startups,
            "summary": aggregate(runs, [s.name for s in specs], cfg.rates)}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f} ms"


def _measure(srv: Server, reqs, rate: float, concurrency, body: dict, seed: int) -> dict:
    """One run's metrics: the client's, graphc's engine side (its /metrics before and after), and
    `server_failure`, the server's own reason, where requests failed and its log says it broke."""
    before = scrape(srv.url) if srv.spec.name == "graphc" else None
    logged = srv.log_size()
    results, dur = run_load(srv.url, reqs, rate, concurrency, body, seed)
    m = run_metrics(results, dur)
    m.update(run_quantiles(before, scrape(srv.url) if before else None))
    if m["errors"] and (why := srv.failure_since(logged)):
        m["server_failure"] = why
    return m


def _run_line(name: str, rep: int, rate: float, m: dict, n_requests: int) -> str:
    """The progress line a run prints."""
    return (f"  repeat {rep + 1} {name:7s} rate {_rate_key(rate):>4s}: "
            f"{m['req_per_s']:.2f} req/s, {m['output_tok_per_s']:.1f} out tok/s, "
            f"TTFT p99 {_ms(m['ttft_p99'])}"
            + (f" (engine {_ms(m['engine_ttft_p99'])})" if m.get("engine_ttft_p99") else "")
            + f", ITL p99 {_ms(m['itl_p99'])}"
            + (f" (engine {_ms(m['engine_itl_p99'])}, loop hand-over "
               f"{_ms(m['engine_handover_p99'])})" if m.get("engine_itl_p99") else "") + ", "
            + "".join(f"{k} steps {m[f'engine_step_{k}_count']:.0f} p50/p99 "
                      f"{_ms(m[f'engine_step_{k}_p50'])}/{_ms(m[f'engine_step_{k}_p99'])}, "
                      for k in ("decode", "mixed") if m.get(f"engine_step_{k}_count"))
            + (f"{m['engine_fused_chunks']:.0f} chunks fused, " if m.get("engine_fused_chunks") else "")
            + (f"Python GC paused {m['engine_gc_pause_s'] * 1e3:.0f} ms "
               f"({m['engine_gc_full_collections']:.0f} full), " if "engine_gc_pause_s" in m else "")
            + f"{m['exact_length']}/{n_requests} exact lengths, {m['errors']} errors, {m['retries']} resent")


def _env_pairs(items: list[str]) -> dict[str, str]:
    bad = [x for x in items if "=" not in x or not x.split("=", 1)[0]]
    if bad:
        raise SystemExit(f"graphc bench --serving: --mlx-env takes KEY=VALUE, got {bad[0]!r}")
    return dict(x.split("=", 1) for x in items)


def cmd_serving(args) -> int:
    require("--serving")
    if not args.model or not (Path(args.model) / "config.json").exists():
        raise SystemExit("graphc bench --serving: --model must be a model folder (config.json, weights, "
                         "tokenizer.json): both servers load it; make one with `graphc make-model`")
    if not (Path(args.model) / "tokenizer.json").exists():
        raise SystemExit(f"graphc bench --serving: {args.model} has no tokenizer.json (prompts are cut with it)")
    cfg = ServingConfig(model=args.model, requests=args.requests, repeats=args.serving_repeats,
                        max_batch=args.max_batch, min_input=args.min_input, max_input=args.max_input,
                        min_output=args.min_output, max_output=args.max_output, concurrency=args.concurrency,
                        seed=args.seed, port=args.port, servers=tuple(args.servers.split(",")),
                        graphc_args=args.graphc_args.split(), mlx_args=args.mlx_args.split(),
                        log_dir=args.log_dir, progress=args.progress,
                        keep_servers=args.keep_servers, trace_steps=args.trace_steps, settle=args.settle,
                        mlx_env=_env_pairs(args.mlx_env))
    bad = [s for s in cfg.servers if s not in ("graphc", "mlx_lm")]
    if bad or cfg.requests < 1 or cfg.repeats < 1 or cfg.settle < 0:
        raise SystemExit(f"graphc bench --serving: --servers takes graphc,mlx_lm (got {args.servers!r}); "
                         "--requests and --serving-repeats must be >= 1, --settle >= 0")
    note = apply_defaults(cfg, args.rates)
    if note:
        print(note, file=sys.stderr)
    partial = (lambda runs: write_json({"partial": True, "command": "graphc " + " ".join(sys.argv[1:]),
                                        "runs": runs}, args.json_out)) if args.json_out else None
    result = run_serving(cfg, log=lambda s: print(s, file=sys.stderr, flush=True), checkpoint=partial)
    result["command"] = "graphc " + " ".join(sys.argv[1:])
    result["note"] = note
    print("\n\n".join(rate_table(k, per, cfg.servers) for k, per in result["summary"].items()))
    if args.json_out:
        write_json(result, args.json_out)
    if args.plot:
        plot_serving(result, args.plot)
    return 0
