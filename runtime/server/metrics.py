"""/metrics in the Prometheus text format (written by hand: no client library needed).

Engine numbers come from `AsyncEngine.snapshot`, copied on the engine thread after each
step, so a scrape never touches the engine. HTTP and finish-reason counters live here and
are only touched from the event loop thread.
"""

from __future__ import annotations

import collections

from graphc.runtime import gc_pauses
from graphc.runtime.async_engine import EngineSnapshot
from graphc.runtime.latency_histograms import BUCKETS, HELP, STEP_HELP, STEP_KINDS, Histogram
from graphc.runtime.scheduler import Scheduler


class ServerMetrics:
    def __init__(self):
        self.http = collections.Counter()  # (path, status) -> count
        self.rejected = collections.Counter()  # why a request was refused before it ran -> count

    def render(self, snap: EngineSnapshot | None, *, ready: bool, engine_alive: bool, model: str) -> str:
        lines: list[str] = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lab = "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}" if labels else ""
                lines.append(f"{name}{lab} {_num(value)}")

        m = {"model": model}
        metric("graphc_model_loaded", "gauge", "1 once the model is loaded and the engine thread runs.",
               [(m, int(ready and engine_alive))])
        s = snap or EngineSnapshot()
        st = s.stats
        metric("graphc_requests_running", "gauge", "Requests in the decode batch.", [(m, s.running)])
        metric("graphc_requests_waiting", "gauge", "Requests queued for prefill or a batch slot.", [(m, s.waiting)])
        metric("graphc_requests_inflight", "gauge", "Requests submitted and not finished (incl. not yet scheduled).",
               [(m, s.inflight)])
        metric("graphc_generation_tokens_per_second", "gauge",
               "Generated tokens per second over the last ~10 s.", [(m, s.generation_tps)])
        metric("graphc_generation_tokens_total", "counter", "Tokens generated.", [(m, st.get("generated_tokens", 0))])
        metric("graphc_prompt_tokens_total", "counter", "Prompt tokens received.", [(m, st.get("prompt_tokens", 0))])
        metric("graphc_prompt_tokens_computed_total", "counter", "Prompt tokens run through prefill.",
               [(m, st.get("computed_prompt_tokens", 0))])
        cached, prompt = st.get("cached_tokens", 0), st.get("prompt_tokens", 0)
        metric("graphc_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
               [(m, cached)])
        metric("graphc_prefix_cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens, since start.",
               [(m, cached / prompt if prompt else 0.0)])
        metric("graphc_kv_cache_bytes", "gauge", "Bytes held by the decode batch's KV caches.", [(m, s.kv_bytes)])
        metric("graphc_kv_cache_live_bytes", "gauge",
               "Of those, bytes holding the running rows' own tokens (not left padding or spare capacity).",
               [(m, s.kv_live_bytes)])
        metric("graphc_kv_cache_bytes_per_live_byte", "gauge",
               "KV bytes allocated per byte the live tokens need (1.0 = no waste; 0 with no live tokens).",
               [(m, s.kv_bytes / s.kv_live_bytes if s.kv_live_bytes else 0.0)])
        c = s.cache
        if c.get("enabled"):
            used, total = c.get("pool_used", 0), c.get("pool_slots", 0)
            metric("graphc_kv_pool_used_slots", "gauge", "Token slots in use in the shared KV pool.", [(m, used)])
            metric("graphc_kv_pool_total_slots", "gauge", "Token slots in the shared KV pool.", [(m, total)])
            metric("graphc_kv_pool_usage_ratio", "gauge", "Fraction of the KV pool in use.",
                   [(m, used / total if total else 0.0)])
            metric("graphc_kv_pool_bytes", "gauge", "Bytes allocated for the KV pool.", [(m, c.get("pool_bytes", 0))])
            metric("graphc_kv_pool_capacity_bytes", "gauge", "Bytes the KV pool may grow to (its hard cap).",
                   [(m, c.get("pool_capacity_bytes", 0))])
            metric("graphc_prefix_cache_tree_tokens", "gauge", "Tokens held by the radix prefix tree.",
                   [(m, c.get("tree_tokens", 0))])
            metric("graphc_prefix_cache_held_requests", "gauge", "Requests holding locks on tree nodes.",
                   [(m, c.get("held_requests", 0))])
            metric("graphc_prefix_cache_queries_total", "counter", "Prefix lookups.", [(m, c.get("queries", 0))])
            metric("graphc_prefix_cache_hits_total", "counter", "Prefix lookups that matched something.",
                   [(m, c.get("hits", 0))])
            metric("graphc_prefix_cache_declined_hits_total", "counter",
                   f"Hits declined: shorter than {Scheduler.SHORT_HIT} tokens so that a burst's prompt joins a "
                   f"batched prefill, or (GPU) than the {Scheduler.CHUNK_ALIGN}-token chunk alignment.",
                   [(m, c.get("declined_hits", 0))])
            metric("graphc_prefix_cache_evicted_tokens_total", "counter", "Tokens evicted from the tree (LRU).",
                   [(m, c.get("evicted_tokens", 0))])
            metric("graphc_prefix_cache_tier_hits_total", "counter",
                   "Prefix hits by tier: memory (the tree alone) or disk (blocks read back made the hit longer).",
                   [({**m, "tier": "memory"}, c.get("memory_hits", 0)), ({**m, "tier": "disk"}, c.get("disk_hits", 0))])
            metric("graphc_prefix_cache_disk_hit_tokens_total", "counter", "Prompt tokens of hits read back from disk.",
                   [(m, c.get("disk_hit_tokens", 0))])
            if "snapshots" in c:  # hybrid models: recurrent-state snapshots (docs/cache-policies.md)
                metric("graphc_prefix_cache_snapshots", "gauge",
                       "Recurrent-state snapshots kept (message ends, intervals, prompt and request ends).",
                       [(m, c["snapshots"])])
                metric("graphc_prefix_cache_snapshot_evictions_total", "counter",
                       "Snapshots evicted by the snapshot limit (LRU).", [(m, c.get("snapshot_evictions", 0))])
            if c.get("disk_enabled"):
                metric("graphc_prefix_cache_disk_bytes", "gauge", "Bytes of KV block files in --kv-cache-dir.",
                       [(m, c.get("disk_bytes", 0))])
                metric("graphc_prefix_cache_disk_files", "gauge", "KV block files in --kv-cache-dir.",
                       [(m, c.get("disk_files", 0))])
                metric("graphc_prefix_cache_disk_written_blocks_total", "counter", "KV blocks written to disk.",
                       [(m, c.get("disk_written_blocks", 0))])
                metric("graphc_prefix_cache_disk_rejected_files_total", "counter",
                       "Block files skipped as corrupt, truncated or another model's (never served).",
                       [(m, c.get("disk_rejected_files", 0))])
                metric("graphc_prefix_cache_disk_removed_files_total", "counter",
                       "Block files removed by the size cap (--kv-cache-disk-gb).", [(m, c.get("disk_removed_files", 0))])
                metric("graphc_prefix_cache_disk_tails_total", "counter",
                       "Tail files (a sequence's positions past its last full block) written to / read back from "
                       "--kv-cache-dir.", [({**m, "op": "written"}, c.get("disk_spilled_tails", 0)),
                                           ({**m, "op": "read"}, c.get("disk_loaded_tails", 0))])
                # read a hit's blocks or compute them again (--kv-cache-disk-read; runtime/cache/disk_choice.py)
                metric("graphc_prefix_cache_disk_choices_total", "counter",
                       "Hits on --kv-cache-dir blocks by what was done: read back, or recomputed (computing them "
                       "was estimated faster, or --kv-cache-disk-read never).",
                       [({**m, "choice": "read"}, c.get("disk_read_choices", 0)),
                        ({**m, "choice": "recompute"}, c.get("disk_recompute_choices", 0))])
                metric("graphc_prefix_cache_disk_recomputed_tokens_total", "counter",
                       "Prompt tokens on disk that were computed instead of read (whole hits, and the rest of "
                       "reads stopped as slower than computing).", [(m, c.get("disk_recomputed_tokens", 0))])
                metric("graphc_prefix_cache_disk_read_bytes_per_second", "gauge",
                       "The disk tier's estimate of its block read rate (0: not measured yet).",
                       [(m, c.get("disk_read_bytes_per_s", 0.0))])
                metric("graphc_prefix_cache_disk_prefill_tokens_per_second", "gauge",
                       "The prefill rate the disk tier weighs reads against (0: not measured yet).",
                       [(m, c.get("disk_prefill_tokens_per_s", 0.0))])
                if "snapshots" in c:  # hybrid models: recurrent state at block ends, beside the blocks
                    metric("graphc_prefix_cache_disk_states_total", "counter",
                           "Recurrent-state files written to / read back from --kv-cache-dir.",
                           [({**m, "op": "written"}, c.get("disk_spilled_states", 0)),
                            ({**m, "op": "read"}, c.get("disk_loaded_states", 0))])
        if s.kv_budget is not None:
            metric("graphc_kv_budget_tokens", "gauge", "The scheduler's KV token budget.", [(m, s.kv_budget)])
            metric("graphc_kv_budget_used_tokens", "gauge", "KV tokens counted against the budget.", [(m, s.kv_tokens)])
            metric("graphc_kv_budget_peak_tokens", "gauge", "Most KV tokens counted against the budget after any step.",
                   [(m, s.kv_peak)])
        metric("graphc_preemptions_total", "counter", "Running requests preempted to fit the KV budget.",
               [(m, st.get("preemptions", 0))])
        metric("graphc_engine_steps_total", "counter", "Decode steps launched.", [(m, s.steps)])
        metric("graphc_fused_prompt_chunks_total", "counter",
               "Prompt chunks that rode a decode step's forward (--mixed-step on; docs/scheduling.md).",
               [(m, s.fused_chunks)])
        # Speculative decoding (docs/speculative.md): acceptance = accepted / drafted.
        drafted, accepted = st.get("spec_drafted_tokens", 0), st.get("spec_accepted_tokens", 0)
        metric("graphc_spec_verify_steps_total", "counter", "Speculative verify steps (one forward each).",
               [(m, st.get("spec_steps", 0))])
        metric("graphc_spec_draft_tokens_total", "counter", "Draft tokens proposed for verification.", [(m, drafted)])
        metric("graphc_spec_accepted_tokens_total", "counter", "Draft tokens the target model accepted.",
               [(m, accepted)])
        metric("graphc_spec_pipelined_verify_steps_total", "counter",
               "Verify steps that were queued behind the previous one (it accepted every draft).",
               [(m, st.get("spec_pipelined_steps", 0))])
        metric("graphc_spec_pipeline_discards_total", "counter",
               "Pipelined verify steps discarded (a draft before them was rejected, or the batch changed).",
               [(m, st.get("spec_pipeline_discards", 0))])
        metric("graphc_spec_acceptance_rate", "gauge", "Accepted / drafted tokens since start (0 before any draft).",
               [(m, accepted / drafted if drafted else 0.0)])
        metric("graphc_requests_finished_total", "counter", "Finished engine requests by finish reason.",
               [({**m, "reason": r}, s.finished.get(r, 0)) for r in sorted({"stop", "length", "abort", *s.finished})])
        metric("graphc_step_faults_total", "counter",
               "Engine steps that raised and were recovered (only the request(s) responsible ended).",
               [(m, st.get("step_faults", 0))])
        for name, help_ in HELP.items():  # engine-side latencies of finished requests (latency_histograms.py)
            self._histogram(lines, f"graphc_request_{name}_seconds", help_, s.latency.get(name, Histogram()), m)
        self._histogram(lines, "graphc_step_seconds", STEP_HELP,
                        *[(s.latency.get(k, Histogram()), {**m, "kind": kind}) for k, kind in STEP_KINDS.items()])
        metric("graphc_requests_rejected_total", "counter", "Requests refused before they ran, by cause.",
               [({**m, "cause": c}, n) for c, n in sorted(self.rejected.items())] or [({**m, "cause": "overloaded"}, 0)])
        metric("graphc_http_requests_total", "counter", "HTTP responses by path and status.",
               [({"path": p, "status": str(c)}, n) for (p, c), n in sorted(self.http.items())])
        gc_ = gc_pauses.install().snapshot()  # process-wide (runtime/gc_pauses.py)
        gens = [({"generation": str(g)}, g) for g in gc_pauses.GENERATIONS]
        metric("graphc_gc_collections_total", "counter", "Python garbage collections by generation.",
               [(lab, gc_["collections"][g]) for lab, g in gens])
        metric("graphc_gc_pause_seconds_total", "counter",
               "Seconds every thread waited on Python garbage collections, by generation.",
               [(lab, gc_["seconds"][g]) for lab, g in gens])
        metric("graphc_gc_pause_seconds_max", "gauge", "The longest Python garbage collection, by generation.",
               [(lab, gc_["longest"][g]) for lab, g in gens])
        metric("graphc_gc_frozen_objects", "gauge",
               "Objects frozen out of Python's collections after startup (--gc-freeze).", [({}, gc_["frozen"])])
        return "\n".join(lines) + "\n"

    @staticmethod
    def _histogram(lines: list, name: str, help_: str, *series) -> None:
        """One histogram family: `series` is (Histogram, labels) pairs, or one Histogram, labels."""
        if series and isinstance(series[0], Histogram):
            series = [series]
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} histogram")
        for h, labels in series:
            lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
            cum = 0
            for bound, c in zip((*BUCKETS, float("inf")), h.counts):
                cum += c
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'{name}_bucket{{{lab},le="{le}"}} {cum}')
            lines.append(f"{name}_sum{{{lab}}} {_num(float(h.total))}")
            lines.append(f"{name}_count{{{lab}}} {cum}")


def _num(v) -> str:
    if isinstance(v, float):
        return repr(v) if v == v else "NaN"
    return str(int(v))


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class HTTPCounter:
    """Pure ASGI middleware counting responses by path and status (BaseHTTPMiddleware would
    wrap `receive` and break disconnect detection on streams)."""

    KNOWN = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        # Bound the label set: unknown paths (scanners) share one label.
        label = path if path in self.KNOWN or path.startswith("/v1/models/") else "other"
        if label.startswith("/v1/models/"):
            label = "/v1/models/{id}"
        status = {"code": 500}

        async def counting_send(msg):
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.http[(label, status["code"])] += 1
