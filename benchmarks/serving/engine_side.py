"""The engine's own side of a run's latencies, from two scrapes of graphc's /metrics.

`graphc serve` exports per-request histograms on the engine's clock (runtime/latency_histograms.py:
queue, ttft, tpot, latency from the request's arrival at the engine; itl, every gap between a
stream's deltas; handover, the engine-to-event-loop wait) and its steps' wall times by kind. The counts one run added are
the difference of a scrape after it and one before; their quantiles, next to the client's, say
how much of a TTFT is the engine's (queueing plus prefill) and how much the door's (HTTP,
tokenizing, thread hand-offs, the stream back). mlx_lm.server exports nothing like it.
"""

from __future__ import annotations

import re

from graphc.runtime.latency_histograms import BUCKETS, quantile

from .http import httpx

NAMES = ("queue", "ttft", "tpot", "latency", "itl", "handover")
STEPS = ("step_decode", "step_mixed", "step_prefill")  # graphc_step_seconds{kind=...}
_LINE = re.compile(r'^graphc_request_(\w+?)_seconds_bucket\{.*le="([^"]+)"\} (\d+)$')
_STEP = re.compile(r'^graphc_step_seconds_bucket\{.*kind="(\w+)".*le="([^"]+)"\} (\d+)$')
# The server process's Python garbage collections (runtime/gc_pauses.py): full ones, and seconds
# paused over every generation.
# Prompt chunks that rode a decode step's forward (--mixed-step on): how many of the run's steps
# with prompt work were fused ones.
_FUSED = re.compile(r'^graphc_fused_prompt_chunks_total\{.*\} (\S+)$')
_GC = re.compile(r'^graphc_gc_(collections_total|pause_seconds_total)\{generation="(\d)"\} (\S+)$')


def parse(text: str) -> dict[str, list[int]]:
    """name -> non-cumulative bucket counts (BUCKETS then +Inf), summed over the server's models;
    "gc" -> [full collections, seconds paused] of the server process, where it exports them;
    "fused_chunks" -> prompt chunks that rode decode forwards so far (a count, not buckets)."""
    cum: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        name = m.group(1) if m and m.group(1) in NAMES else None
        if m is None and (m := _STEP.match(line)):
            name = f"step_{m.group(1)}"
        if name is not None:
            per = cum.setdefault(name, {})
            per[m.group(2)] = per.get(m.group(2), 0) + int(m.group(3))
    out = {}
    for m in filter(None, map(_GC.match, text.splitlines())):
        gc_ = out.setdefault("gc", [0.0, 0.0])  # full collections, pause seconds (all generations)
        if m.group(1) == "pause_seconds_total":
            gc_[1] += float(m.group(3))
        elif m.group(2) == "2":
            gc_[0] += float(m.group(3))
    for m in filter(None, map(_FUSED.match, text.splitlines())):
        out["fused_chunks"] = out.get("fused_chunks", 0.0) + float(m.group(1))
    bounds = [repr(b) for b in BUCKETS] + ["+Inf"]
    for name, per in cum.items():
        c = [per.get(b, 0) for b in bounds]
        out[name] = [c[0]] + [c[i] - c[i - 1] for i in range(1, len(c))]
    return out


def scrape(base_url: str) -> dict[str, list[int]] | None:
    """The server's histograms now, or None when it has none (not graphc, or an older one)."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    return (parse(r.text) or None) if r.status_code == 200 else None


def run_quantiles(before: dict | None, after: dict | None) -> dict:
    """engine_<name>_p50/_p99 (seconds) of what the run between the two scrapes added; {} without both."""
    if not before or not after:
        return {}
    out = {}
    if "gc" in after and "gc" in before:  # what the run's share of Python's garbage collection was
        out["engine_gc_full_collections"] = after["gc"][0] - before["gc"][0]
        out["engine_gc_pause_s"] = after["gc"][1] - before["gc"][1]
    if "fused_chunks" in after:
        out["engine_fused_chunks"] = after["fused_chunks"] - before.get("fused_chunks", 0.0)
    for name in NAMES + STEPS:
        a, b = after.get(name), before.get(name, [0] * (len(BUCKETS) + 1))
        if a is None:
            continue
        delta = [x - y for x, y in zip(a, b)]
        out[f"engine_{name}_p50"] = quantile(delta, 0.50)
        out[f"engine_{name}_p99"] = quantile(delta, 0.99)
        if name in STEPS:  # how many: more steps with prompt work is itself an answer
            out[f"engine_{name}_count"] = sum(delta)
    return out


__all__ = ["NAMES", "parse", "run_quantiles", "scrape"]
