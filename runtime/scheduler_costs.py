"""What a step costs, measured online: the time-aware prompt budget of `Scheduler(step_tokens="auto")`.

A step that prefills while rows decode costs about `d + a + b*n`: the decode forward of the running
rows (`d`), the fixed cost of running a prefill forward at all (`a`: its launches and host work),
and `b` per prompt token. Every running stream waits the whole step for its next token; every
waiting request waits for the prompt tokens to get through. When the fixed part dominates (a small
model on a GPU: a 256-token forward costs about what a decode step does) a small budget buys little
ITL and costs a lot of TTFT: at saturation the queue drains in (total prompt tokens / n) steps, each
paying `d + a`. When the per-token part dominates (the CPU), a bigger budget only lengthens the stall.

So the budget is the n whose prompt work costs as much as the step's fixed part, `F = d + a`:
`(factor - 1) * F / b` with STEP_TIME_FACTOR 2, so the step stays within twice its fixed cost;
never below the floor (STEP_TOKENS_FLOOR) nor above one prefill chunk.

`F` and `b` come from a least-squares fit, with forgetting, of the wall time of recent steps that
prefilled while rows decoded against their prompt tokens (once more than 3 steps' weight is in
it), with `b` at the upper end of its two-sigma interval: noisy step times (a shared CPU) give
the smaller budget, never one that chance made large. Under saturation every step spends its
whole budget, so the sizes would not vary and `F` could not be told from `b`: while they vary by
less than 10%, every PROBE_EVERY-th step spends two thirds of the budget (never more), a few
percent of prefill rate at most. Between spreads the last separating fit holds; before the
first, `F` is the running mean of pure decode steps (a = 0: the smaller budget).

Plain numbers, no arrays: the scheduler times the interval between its own calls, which under
load is the step's wall time (chained decode included).
"""

from __future__ import annotations

DECAY = 0.95  # weight of the past at each new observation: about the last 20 steps count
PROBE_EVERY = 4


class StepCosts:
    def __init__(self, decay: float = DECAY):
        self.decay = decay
        self.decode_s: float | None = None  # running mean of pure decode steps
        self._sums = [0.0] * 6  # weighted sums of 1, n, n^2, t, n * t, t^2 over prefill-and-decode steps
        self.observed = 0  # prefill-and-decode steps in the fit
        self._asked = 0  # budgets handed out (every PROBE_EVERY-th is the smaller probe)
        self._separated: tuple[float, float] | None = None  # the last (F, b) fitted from varied sizes

    def observe(self, seconds: float, prompt_tokens: int, decoded: bool) -> None:
        """One finished step: its wall time, the prompt tokens it prefilled, whether rows decoded."""
        if not decoded or seconds <= 0:
            return  # a burst step (prefill alone) says nothing about the stall a decode row sees
        if prompt_tokens == 0:
            d = self.decode_s
            self.decode_s = seconds if d is None else self.decay * d + (1 - self.decay) * seconds
            return
        n, t = float(prompt_tokens), seconds
        self._sums = [self.decay * s + x for s, x in zip(self._sums, (1.0, n, n * n, t, n * t, t * t))]
        self.observed += 1

    def spread(self) -> bool:
        """Whether the prompt sizes of the steps that count vary enough (> 10%) to separate F from b."""
        w, sn, snn = self._sums[:3]
        return self.observed >= 2 and w * snn - sn * sn > 0.01 * sn * sn

    def fit(self) -> tuple[float, float] | None:
        """(F, b): a prefill-and-decode step's fixed seconds and its seconds per prompt token, or None."""
        w, sn, snn, st, snt, stt = self._sums
        if self.observed < 1 or sn <= 0:
            return None
        var = w * snn - sn * sn
        if self.spread() and w > 3:
            b = (w * snt - sn * st) / var
            f = (st - b * sn) / w
            # b's upper two-sigma bound: noisy step times (a shared CPU) give the smaller budget
            rss = max(0.0, stt - f * st - b * snt)
            b = b + 2.0 * (rss / (w - 2) * w / var) ** 0.5
            if b > 0:  # F at that b; nothing left for it (F <= 0) means the floor
                self._separated = (max(0.0, (st - b * sn) / w), b)
                return self._separated
        if self._separated is not None:  # the sizes stopped varying: the last fit that told F from b
            return self._separated
        if self.decode_s is None:
            return None
        b = (st - self.decode_s * w) / sn  # one size only: F is the decode step alone
        return (self.decode_s, b) if b > 0 else None

    def budget(self, floor: int, ceil: int, factor: float) -> int:
        """Prompt tokens for the next step while rows decode: the step within `factor` x its fixed cost."""
        self._asked += 1
        fit = self.fit()
        n = floor if fit is None else max(floor, int((factor - 1.0) * fit[0] / fit[1]))
        n = max(1, min(ceil, n))
        probe = self._asked % PROBE_EVERY == 0 and not self.spread()
        return max(1, 2 * n // 3) if probe else n
