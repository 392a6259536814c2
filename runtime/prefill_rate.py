"""The engine's prefill throughput, measured on the prompt forwards it runs.

The disk tier (runtime/cache/disk_choice.py) weighs reading a long prefix hit's blocks from disk
against computing those tokens again; the second half of that comparison is what this meter
says. The runner (runtime/runner.py) times each prefill chunk and batched prefill forward it
runs (each ends in an `mx.eval`, so the wall time is the device's) and hands (tokens, seconds)
here; nobody else writes it.

Two estimates. The flat rate (`tokens_per_s`, for /metrics) is a decayed ratio, sum of
tokens over sum of seconds with each earlier observation weighted DECAY times less, so a long
chunk counts for its tokens and a one-token forward (mostly fixed cost) barely moves it. It is
the wrong measure of what recomputing a long hit costs: a server's forwards are mostly chunks
at long offsets (a conversation's new turn over 30k tokens of context), whose attention makes
a token several times dearer than one of a cold prompt's first chunks, so a flat rate of
recent forwards prices recomputing a 32k hit from position 0 too high, and the disk tier
would read gigabytes where computing wins. So the meter also fits, by least squares with
forgetting, `seconds = a * tokens + c * pairs`, where `pairs` counts the query-key pairs the
chunk's attention scores (`attention_pairs`: n * (offset + (n + 1) / 2)): the per-token part
of the layers and the part that grows with context, told apart by chunks at different
offsets. `seconds_for(n, offset)` answers from that fit once it is sound (both terms >= 0,
enough weight), else from the flat rate.

The warm-up's forwards are not counted (`paused()`): each is the first of its shape, paying for
kernel builds, and would make recomputing look dearer than it is. `seed()` starts the meter at
a rate from elsewhere and `seed_fit()` a fit (the disk tier's folder keeps the last ones, so a
restarted server has them for its first hit; tests hand them in).
"""

from __future__ import annotations

from contextlib import contextmanager

DECAY = 0.9  # weight of the past at each new observation: about the last 10 forwards count
FIT_DECAY = 0.97  # the two-term fit's forgetting: about the last 30 forwards, enough offsets to tell a from c
FIT_MIN_WEIGHT = 3.0  # observations' weight before the fit is trusted over the flat rate


def attention_pairs(tokens: int, offset: int = 0) -> float:
    """Query-key pairs a causal forward of `tokens` positions after `offset` cached ones scores."""
    return tokens * (offset + (tokens + 1) / 2)


class PrefillRate:
    def __init__(self, decay: float = DECAY):
        self.decay = decay
        self.tokens = 0.0  # decayed sums
        self.seconds = 0.0
        self.observed = 0  # forwards counted since start (seeded ones aside)
        self.seeded = False
        self.paused_depth = 0
        self._fit_sums = [0.0] * 6  # decayed sums of x1^2, x1 x2, x2^2, x1 t, x2 t, 1 (x1 tokens, x2 pairs)
        self._kept_fit: tuple[float, float] | None = None  # (a, c) from the folder: until the live fit is sound

    def observe(self, tokens: int, seconds: float, pairs: float | None = None) -> None:
        """A prefill forward of `tokens` prompt tokens took `seconds` of wall time; `pairs`: the
        query-key pairs its attention scored (sum of `attention_pairs` over its rows; None: a
        fresh prompt's, offset 0)."""
        if self.paused_depth or tokens <= 0 or seconds <= 0:
            return
        self.tokens = self.decay * self.tokens + tokens
        self.seconds = self.decay * self.seconds + seconds
        self.observed += 1
        x1, x2, t = float(tokens), float(attention_pairs(tokens) if pairs is None else pairs), seconds
        self._fit_sums = [FIT_DECAY * s + v for s, v in
                          zip(self._fit_sums, (x1 * x1, x1 * x2, x2 * x2, x1 * t, x2 * t, 1.0))]

    def fit(self) -> tuple[float, float] | None:
        """(a, c): seconds per prompt token and per attention pair, from the forwards measured
        (or kept in the folder before any); None while unsound (too few, one offset only, a
        term < 0)."""
        s11, s12, s22, s1t, s2t, w = self._fit_sums
        det = s11 * s22 - s12 * s12
        if w >= FIT_MIN_WEIGHT and det > 1e-9 * s11 * s22:
            a, c = (s22 * s1t - s12 * s2t) / det, (s11 * s2t - s12 * s1t) / det
            if a > 0 and c >= 0:
                return a, c
        return self._kept_fit

    def seconds_for(self, tokens: int, offset: int = 0) -> float | None:
        """The estimated seconds to prefill `tokens` positions after `offset` cached ones: from the
        fit when sound, else at the flat rate; None before anything was measured or seeded."""
        fit = self.fit()
        if fit is not None:
            return fit[0] * tokens + fit[1] * attention_pairs(tokens, offset)
        r = self.tokens_per_s()
        return None if r is None else tokens / r

    def seed_fit(self, a: float, c: float) -> None:
        """The (a, c) of `fit()` kept by a previous process: used until this one's fit is sound."""
        if a <= 0 or c < 0:
            raise ValueError(f"a prefill fit needs a > 0 and c >= 0, got {a!r}, {c!r}")
        self._kept_fit = (a, c)

    def seed(self, tokens_per_s: float, weight_tokens: float = 2048.0) -> None:
        """Start from `tokens_per_s` as if one forward of `weight_tokens` had run at that rate
        (replaces what was measured: a test, or a restarted process before its first prefill)."""
        if tokens_per_s <= 0:
            raise ValueError(f"a prefill rate must be > 0 tokens/s, got {tokens_per_s!r}")
        self.tokens, self.seconds, self.seeded = weight_tokens, weight_tokens / tokens_per_s, True
        self._fit_sums, self._kept_fit = [0.0] * 6, None  # a flat rate handed in is the whole estimate

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

    def describe(self) -> dict:
        """The estimates: the flat rate, and the fit's two terms (None while unsound)."""
        fit = self.fit()
        return {"prefill_tokens_per_s": self.tokens_per_s(),
                "prefill_seconds_per_token": None if fit is None else fit[0],
                "prefill_seconds_per_pair": None if fit is None else fit[1]}
