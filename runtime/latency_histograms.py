"""Per-request latencies measured inside the engine, as cumulative histograms for /metrics.

A client's time to first token is the engine's plus the door's (HTTP, tokenizing, the thread
hand-offs, the stream back): exporting the engine's own side lets a load test split the two
(`graphc bench --serving` does, from two scrapes). What each histogram observes, per finished
request (engine clock, `Request` fields):

    queue   arrival (add_request) -> the first step that ran a chunk of its prompt
    ttft    arrival -> its first output token (queueing plus prefill)
    tpot    (finish - first token) / (output tokens - 1): its decode time per token
    latency arrival -> finish

Two more observe every token gap and every hand-over rather than finished requests, so that a
client's inter-token latency can be split into the engine's part and the door's:

    itl      the gap between two consecutive deltas of one stream, on the engine thread as each
             step's outputs are routed (a stream's token cadence before anything of the door)
    handover the engine thread's hand-over of an iteration's events -> the event loop running it
             (AsyncEngine._send -> async_streams.deliver_all: a busy loop or the GIL shows here)

and every engine step's wall time by what it did (`step_kind`, STEP_KINDS): whether the door's
gaps come from slower steps or from more steps with prompt work in them.

Buckets are seconds from 0.25 ms, dense enough (about 1.3x apart from 1 ms up to 10 s) that a p99 read back from two
scrapes lands within a bucket's width of the true one; the names follow Prometheus' and vLLM's
(`*_seconds` with `_bucket{le=...}`, `_sum`, `_count`).
"""

from __future__ import annotations

import bisect
import threading

import attrs

BUCKETS: tuple[float, ...] = (
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.13, 0.17, 0.22,
    0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 1.3, 1.7, 2.2, 3.0, 4.0, 5.0, 6.5, 8.0, 10.0, 13.0, 17.0, 22.0, 30.0,
    45.0, 60.0, 120.0, 300.0, 600.0)

# name -> the help line /metrics prints
HELP = {
    "queue": "Seconds from a request's arrival at the engine to the first step that ran its prompt.",
    "ttft": "Seconds from a request's arrival at the engine to its first output token (queue plus prefill).",
    "tpot": "Seconds per output token after the first, per finished request with at least two.",
    "latency": "Seconds from a request's arrival at the engine to its finish.",
    "itl": "Seconds between two consecutive deltas of one stream as the engine hands them out (every gap).",
    "handover": "Seconds from the engine thread's hand-over of a step's stream events to the event loop running them.",
}


@attrs.frozen
class Histogram:
    """One histogram's state as a value: counts per bucket (not cumulative; the last is +Inf)."""

    counts: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, x: float) -> "Histogram":
        i = bisect.bisect_left(BUCKETS, x)  # the first bound >= x: Prometheus' le is inclusive
        counts = list(self.counts)
        counts[i] += 1
        return Histogram(tuple(counts), self.total + x)


def observations(req) -> dict[str, float]:
    """What one finished Request contributes (a field it never reached contributes nothing)."""
    out = {}
    if req.scheduled_time is not None:
        out["queue"] = req.scheduled_time - req.arrival
    if req.first_token_time is not None:
        out["ttft"] = req.first_token_time - req.arrival
        n = len(req.output_ids)
        if req.finish_time is not None and n >= 2:
            out["tpot"] = (req.finish_time - req.first_token_time) / (n - 1)
    if req.finish_time is not None:
        out["latency"] = req.finish_time - req.arrival
    return out


def observe(hists: dict[str, Histogram], req) -> dict[str, Histogram]:
    """The histograms with one finished request added (a new dict: snapshots keep the old one)."""
    new = dict(hists)
    for name, x in observations(req).items():
        new[name] = new.get(name, Histogram()).observe(max(0.0, x))
    return new


# Engine steps by what they did: prompt work while rows decode ("mixed"), decode only, prompt only.
STEP_KINDS = {"step_decode": "decode", "step_mixed": "mixed", "step_prefill": "prefill"}
STEP_HELP = ("Seconds per engine step, by kind: decode (no prompt work), mixed (prompt work while rows decode), "
             "prefill (prompt work, no row decoding).")


def step_kind(prompt_tokens: int, decoding_rows: int) -> str:
    """The step histogram a step that ran `prompt_tokens` with `decoding_rows` running goes to."""
    if not prompt_tokens:
        return "step_decode"
    return "step_mixed" if decoding_rows else "step_prefill"


def observe_all(hists: dict[str, Histogram], name: str, xs: list[float]) -> dict[str, Histogram]:
    """The histograms with every x of `xs` added to `name` (a new dict; unchanged when xs is empty)."""
    if not xs:
        return hists
    counts, total = list(hists.get(name, Histogram()).counts), hists.get(name, Histogram()).total
    for x in xs:
        x = max(0.0, x)
        counts[bisect.bisect_left(BUCKETS, x)] += 1
        total += x
    return {**hists, name: Histogram(tuple(counts), total)}


class SharedHistogram:
    """One histogram observed from other threads (event loops): a lock around the update, a
    value to read (`Histogram` is immutable, so a reader needs no lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.value = Histogram()

    def observe(self, x: float) -> None:
        with self._lock:
            self.value = self.value.observe(max(0.0, x))


def quantile(counts: list[int], q: float) -> float | None:
    """The q-quantile (0..1) of a histogram's non-cumulative bucket counts, interpolated linearly
    inside its bucket (as Prometheus' histogram_quantile does); None when empty. A quantile that
    falls in the +Inf bucket reads as the last finite bound."""
    n = sum(counts)
    if n == 0:
        return None
    rank = q * n
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i == len(BUCKETS):
                return BUCKETS[-1]
            lo = BUCKETS[i - 1] if i else 0.0
            return lo + (BUCKETS[i] - lo) * (rank - seen) / c
        seen += c
    return BUCKETS[-1]


__all__ = ["BUCKETS", "HELP", "STEP_HELP", "STEP_KINDS", "Histogram", "SharedHistogram", "observations", "observe",
           "observe_all", "quantile", "step_kind"]
