"""EngineSnapshot: the engine's counters, copied on the engine thread after each step into an
immutable value that any thread reads without locking (/metrics, /health, admission)."""

from __future__ import annotations

import collections
import time

import attrs


@attrs.frozen
class EngineSnapshot:
    """Engine state copied on the engine thread after each step, safe to read from any thread."""

    waiting: int = 0
    running: int = 0
    inflight: int = 0
    steps: int = 0
    fused_chunks: int = 0  # prompt chunks that rode a decode step's forward (--mixed-step on)
    stats: dict = attrs.field(factory=dict)
    kv_bytes: int = 0
    kv_live_bytes: int = 0  # of kv_bytes, the bytes holding the rows' own tokens (no padding, no spare capacity)
    kv_tokens: int = 0  # KV tokens the scheduler counts against its budget
    kv_budget: int | None = None  # the engine's kv_budget_tokens (None = unbounded)
    kv_peak: int = 0  # the most KV tokens counted against the budget after any step so far
    cache: dict = attrs.field(factory=dict)  # Engine.cache_stats(): prefix-cache pool and tree
    finished: dict = attrs.field(factory=dict)  # finish_reason -> requests finished that way
    generation_tps: float = 0.0  # generated tokens per second over the last few seconds
    latency: dict = attrs.field(factory=dict)  # name -> latency_histograms.Histogram (queue, ttft, tpot, e2e)
    time: float = 0.0


class Snapshots:
    """Takes an engine's snapshots (engine thread only): generation tokens/s over a sliding
    window, and the prefix-cache stats refreshed at most every 0.2 s while busy (they walk the
    radix tree) and always once idle, so a scrape after the work is done sees the final state."""

    def __init__(self, tps_window_s: float = 10.0):
        self.tps_window_s = tps_window_s
        self._samples: collections.deque = collections.deque()
        self._cache_stats: dict = {}
        self._cache_time = 0.0

    def _cache(self, engine, now: float) -> dict:
        fn = getattr(engine, "cache_stats", None)
        if fn is None:
            return {}
        if now - self._cache_time >= 0.2 or not engine.has_unfinished():
            self._cache_stats, self._cache_time = fn(), now
        return self._cache_stats

    def take(self, engine, last: EngineSnapshot, inflight: int, finished: dict,
             latency: dict | None = None) -> EngineSnapshot:
        now = time.time()
        stats = dict(engine.stats)
        gen = stats.get("generated_tokens", 0)
        samples = self._samples
        if not samples or now - samples[-1][0] >= 0.25:
            samples.append((now, gen))
        while len(samples) > 2 and now - samples[0][0] > self.tps_window_s:
            samples.popleft()
        t0, g0 = samples[0]
        tps = (gen - g0) / (now - t0) if now > t0 else 0.0
        info = engine.load_info()
        return EngineSnapshot(
            kv_peak=max(last.kv_peak, info["kv_tokens"]),
            waiting=info["waiting"], running=info["running"], inflight=inflight, steps=info["steps"],
            fused_chunks=info.get("fused_chunks", 0),
            stats=stats, kv_bytes=info["kv_bytes"], kv_live_bytes=info["kv_live_bytes"],
            cache=self._cache(engine, now), kv_tokens=info["kv_tokens"], kv_budget=info["kv_budget"],
            finished=dict(finished), generation_tps=tps, latency=latency or {}, time=now)
