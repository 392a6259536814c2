"""The engine's prefill throughput, measured on the prompt forwards it runs.

The disk tier (runtime/cache/disk_choice.py) weighs reading a long prefix hit's blocks from disk
against computing those tokens again; the second half of that comparison is what this meter
says. The runner (runtime/runner.py) times each prefill chunk and batched prefill forward it
runs (each ends in an `mx.eval`, so the wall time is the device's) and hands (tokens, seconds)
here; nobody else writes it.

The estimate is a decayed ratio, sum of tokens over sum of seconds with each earlier
observation weighted DECAY times less, so a long chunk counts for its tokens and a one-token
forward (mostly fixed cost) barely moves it. It is a flat rate: the attention part of a
chunk grows with its offset, so chunks at long offsets lower it, and a hit at long context
costs more to recompute than a short one per token; the choice only needs the order of the
two costs, not their exact values.

The warm-up's forwards are not counted (`paused()`): each is the first of its shape, paying for
kernel builds, and would make recomputing look dearer than it is. `seed()` starts the meter at
a rate from elsewhere (the disk tier's folder keeps the last one, so a restarted server has it
for its first hit; tests hand one in).
"""

from __future__ import annotations

from contextlib import contextmanager

DECAY = 0.9  # weight of the past at each new observation: about the last 10 forwards count


class PrefillRate:
    def __init__(self, decay: float = DECAY):
        self.decay = decay
        self.tokens = 0.0  # decayed sums
        self.seconds = 0.0
        self.observed = 0  # forwards counted since start (seeded ones aside)
        self.seeded = False
        self.paused_depth = 0

    def observe(self, tokens: int, seconds: float) -> None:
        """A prefill forward of `tokens` prompt tokens took `seconds` of wall time."""
        if self.paused_depth or tokens <= 0 or seconds <= 0:
            return
        self.tokens = self.decay * self.tokens + tokens
        self.seconds = self.decay * self.seconds + seconds
        self.observed += 1

    def seed(self, tokens_per_s: float, weight_tokens: float = 2048.0) -> None:
        """Start from `tokens_per_s` as if one forward of `weight_tokens` had run at that rate
        (replaces what was measured: a test, or a restarted process before its first prefill)."""
        if tokens_per_s <= 0:
            raise ValueError(f"a prefill rate must be > 0 tokens/s, got {tokens_per_s!r}")
        self.tokens, self.seconds, self.seeded = weight_tokens, weight_tokens / tokens_per_s, True

    def tokens_per_s(self) -> float | None:
        """The estimate, or None before any forward was counted or seeded."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    @contextmanager
    def paused(self):
        """Forwards run inside are not counted (the warm-up)."""
        self.paused_depth += 1
        try:
            yield self
        finally:
            self.paused_depth -= 1

    def stats(self) -> dict:
        r = self.tokens_per_s()
        return {"prefill_tokens_per_s": 0.0 if r is None else r, "prefill_rate_observed": self.observed}
