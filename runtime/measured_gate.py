"""The measured gate: per batch-size bucket, the arm whose decode cycles have been producing
tokens fastest on this machine, for this model and this traffic. Two users:

- the speculator (runtime/speculative/speculator.py): arms "plain", "verify", "pipelined";
- `compile="measured"` (runtime/compiled_decode.py): arms "compiled", "eager".

Whether speculation pays depends on numbers no static rule knows: the device's cost of a
k + 1-position forward against a one-position step (on the H200 a quantized model's verify
cost 2.0–2.4 plain steps, on a 2-core CPU about k + 1), the acceptance the traffic gets
(grounded prompts accept 60–95 % of drafts, random ones ~0), the batch size, and for
pipelining how often every row accepts everything. Whether compiling pays moves with the
model and the batch (docs/performance.md). So the gate measures instead of predicting.

Each *cycle* is one `ModelRunner.decode` call; its wall time runs to the next call. The
speculator credits it with its rows times the tokens its slowest row got
(Speculator.end_cycle), not the total: in a batch where some rows accept long drafts and one
accepts none, verifying raises the total while that one row gets a token per (dearer) verify
step instead of per plain step — on the H200 a fixed batch of 16 grounded prompts finished
0.57–0.81x slower that way, its stragglers setting the time. Crediting the slowest row
means speculation runs only where no request is slowed by it; at batch 1 it is the token
rate. The compile gate credits every token (both arms emit one per row).

Arms run in stretches of `RUN` cycles; the first cycle of a stretch is not measured (it pays
the switch: the first plain step after a verify is unchained, the first pipelined verify has
nothing queued yet), and neither is a cycle in which a prompt was prefilled, the batch changed,
(for the speculator) no row had a draft — a plain step whichever arm runs, and counting it
made the verify arm look as slow as the new text it ran on — or (for the compile gate) a verify
ran; the runner and the speculator mark those. Per (bucket, arm) the gate
keeps the last WINDOW cycles' tokens and seconds; an arm's rate is their ratio, leaving out
cycles that took over 3x the median (a kernel compiled for a new shape, a GC pause).

Choice: an arm with fewer than `MIN_SAMPLES` measured cycles runs first (in the order the arms
are given); after that the fastest arm runs, except for one `RUN`-cycle stretch of another arm
every `EXPLORE_EVERY` measured cycles (in turn), so a change in traffic is noticed — every
`EXPLORE_CLOSE` cycles while the explored arm's rate is within `CLOSE` of the best, where noise
can have put them in the wrong order. The gate
never changes which tokens come out, only how they are computed.
"""

from __future__ import annotations

import collections
import time

import attrs

ARMS = ("plain", "verify", "pipelined")
WINDOW = 16  # recent cycles per arm and bucket that its rate is taken over


def bucket(batch: int) -> int:
    """Batch-size bucket: 1, 2, 3-4, 5-8, 9-16, ... (the upper bound)."""
    return 1 << (max(batch, 1) - 1).bit_length()


@attrs.define
class _Arm:
    recent: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=WINDOW))  # (tokens, seconds)
    samples: int = 0

    @property
    def rate(self) -> float:
        """Tokens per second over the recent cycles, leaving out those that took over 3x the
        median (a kernel JIT for a new shape, a GC pause): one such outlier would otherwise
        decide the arm for a long time."""
        if not self.recent:
            return 0.0
        secs = sorted(s for _, s in self.recent)
        cap = 3 * secs[len(secs) // 2]
        kept = [(t, s) for t, s in self.recent if s <= cap]
        total = sum(s for _, s in kept)
        return sum(t for t, _ in kept) / total if total > 0 else 0.0


@attrs.define
class _Bucket:
    arms: dict  # name -> _Arm
    cycles: int = 0  # measured cycles in this bucket
    explored: int = 0  # exploration stretches so far (which arm is next in turn)
    last_explore: int = 0  # measured cycles when the latest exploration stretch began


class ArmGate:
    MIN_SAMPLES = 4
    RUN = 4
    EXPLORE_EVERY = 64
    # Arms whose rates are within CLOSE of the best one's are re-checked every EXPLORE_CLOSE
    # measured cycles instead: two windows of 16 noisy cycles can put them in the wrong order,
    # and a wrong order then held for 64 cycles — at batch 1 two thirds of a 96-token request
    # (H200, compile "auto": plain and verify measured 273 and 346 tok/s, and the gate gave
    # 1.02x (noise) against ungated 1.67x). Exploring a close arm costs little: it is close.
    CLOSE = 1.5
    EXPLORE_CLOSE = 16

    def __init__(self, clock=time.perf_counter, arms: tuple = ARMS):
        # `arms`: the choices, in the order untried ones are explored (compiled_decode.py's
        # measured compile uses ("compiled", "eager")).
        self.clock = clock
        self.arm_names = tuple(arms)
        self._buckets: dict[int, _Bucket] = {}
        self._cur: tuple | None = None  # (arm, bucket, first of its stretch) of the running cycle
        self._next: tuple | None = None  # the same, decided during this cycle for the next one
        self._last: tuple | None = None  # (arm, bucket) of the latest choice
        self._left = 0  # cycles left in the latest choice's stretch
        self._start: float | None = None
        self._clean = False
        self._tokens = 0
        self._in_use: dict[int, str] = {}  # bucket -> the arm its latest cycle was given (Engine.describe)

    # -- the runner's cycle ----------------------------------------------------------------
    def begin(self) -> None:
        """ModelRunner.decode was entered: the previous cycle ends (and is recorded), this one starts."""
        now = self.clock()
        if self._start is not None and self._cur is not None and self._clean and not self._cur[2]:
            seconds = now - self._start
            if seconds > 0:
                st = self._buckets[self._cur[1]]
                a = st.arms[self._cur[0]]
                a.recent.append((self._tokens, seconds))
                a.samples += 1
                st.cycles += 1
        self._start, self._clean, self._tokens = now, True, 0
        self._cur, self._next = self._next, None

    def dirty(self) -> None:
        """This cycle also did other work (a prefill, rows joining or leaving): not a sample."""
        self._clean = False

    @property
    def measuring(self) -> bool:
        """Whether the running cycle can become a sample (an arm was chosen for it and it is not
        the first of its stretch): callers skip counting its tokens otherwise."""
        return self._cur is not None and not self._cur[2]

    def tokens(self, n: int) -> None:
        """The tokens this cycle's decode returned."""
        self._tokens += n

    # -- choosing ------------------------------------------------------------------------
    def current(self, batch: int, available: tuple) -> str:
        """This cycle's arm (decided during the previous cycle, or now)."""
        if self._cur is None or self._cur[0] not in available:
            self._cur = self._choose(batch, available)
        return self._cur[0]

    def decide(self, batch: int, available: tuple) -> str:
        """The next cycle's arm, decided once per cycle (a plain step chains into it or not)."""
        if self._next is None or self._next[0] not in available:
            self._next = self._choose(batch, available)
        return self._next[0]

    def _choose(self, batch: int, available: tuple) -> tuple:
        b = bucket(batch)
        if self._last is not None and self._last[1] == b and self._last[0] in available and self._left > 0:
            self._left -= 1  # the stretch goes on
            return self._last[0], b, False
        if b not in self._buckets:
            self._buckets[b] = _Bucket({a: _Arm() for a in self.arm_names})
        st = self._buckets[b]
        arms = [a for a in self.arm_names if a in available]
        arm = next((a for a in arms if st.arms[a].samples < self.MIN_SAMPLES), None)
        if arm is None:
            arm = max(arms, key=lambda a: st.arms[a].rate)
            others = [a for a in arms if a != arm]
            if others:
                nxt = others[st.explored % len(others)]  # the next arm to re-check, in turn
                close = st.arms[nxt].rate * self.CLOSE >= st.arms[arm].rate
                if st.cycles >= st.last_explore + (self.EXPLORE_CLOSE if close else self.EXPLORE_EVERY):
                    arm, st.last_explore = nxt, st.cycles
                    st.explored += 1
        first = self._last != (arm, b)
        self._last, self._left = (arm, b), self.RUN - 1
        self._in_use[b] = arm
        return arm, b, first

    def in_use(self) -> dict:
        """{"latest": (arm, bucket) of the latest choice or None, "by_bucket": {bucket: arm}}: which
        arm of this measured plan choice runs now (the plan declares the arms, the gate picks)."""
        return {"latest": self._last, "by_bucket": dict(sorted(self._in_use.items()))}

    def rates(self) -> dict:
        """{bucket: {arm: (tokens/s, samples)}}: what the gate has measured (stats, docs)."""
        return {b: {a: (round(x.rate, 2), x.samples) for a, x in st.arms.items() if x.samples}
                for b, st in sorted(self._buckets.items()) if st.cycles}
