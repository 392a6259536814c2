"""Engine's warm-up (a mixin of Engine): `warm_up()` before traffic, and `warm_idle()`, which
builds what the warm-up's time caps left while no request is in the engine (runtime/warmup.py,
runtime/warmup_plans.py).

Both run on the thread that steps the engine: MLX's CUDA backend keeps its cuDNN attention plans,
handles and command encoders per thread (`AsyncEngine.warm_up()` runs the warm-up on its engine
thread and calls `warm_idle()` between commands while idle).
"""

from __future__ import annotations

import logging
import threading
import time

from .warmup import warm_up

log = logging.getLogger("graphc.server")


class EngineWarmUp:
    def warm_up(self, shapes: bool | None = None, agent: bool | None = None) -> float:
        """Run a short greedy and a short sampled request (batch 1) so that a first real request
        does not pay for kernel builds and the compiled step's trace; `stats` is left as it
        was before. `shapes`: also the serving shapes, `agent`: with a disk tier, a turn read
        back from disk (None: on a GPU only); a disk tier's folder is left as it was. Seconds
        taken. Run it on the thread that will step the engine: MLX's CUDA backend keeps its
        attention plans per thread (`AsyncEngine.warm_up()` runs it on the engine thread, as
        `graphc serve` does before it reports ready; runtime/warmup.py)."""
        took = warm_up(self, shapes, agent)
        self.warmed_on_thread = threading.get_ident()
        return took

    def warm_idle(self, seconds: float = 0.0) -> int:
        """Build warm-up shapes left over by `warm_up()`'s time caps while no request is in the
        engine: at least one if any is left, then more until `seconds` have passed; how many.
        Call it from the thread that steps the engine, when it has nothing else to do
        (`AsyncEngine` does, between commands while idle)."""
        if not self.idle_warm or self.has_unfinished():
            return 0
        t0, done = time.perf_counter(), 0
        while self.idle_warm and (not done or time.perf_counter() - t0 < seconds):
            run = self.idle_warm.popleft()
            try:
                run()
            except Exception as e:  # a warm-up shape is an optimization: never a reason to stop serving
                log.warning("idle warm-up stopped: %s: %s", type(e).__name__, e)
                self.idle_warm.clear()
                return done
            done += 1
        self._idle_warmed[0] += done
        self._idle_warmed[1] += time.perf_counter() - t0
        if not self.idle_warm:  # once at info; later drains (a conversation's next turn) at debug
            log.log(logging.DEBUG if self._idle_logged else logging.INFO,
                    "warm-up: %d more shapes built while idle in %.1f s", *self._idle_warmed)
            self._idle_logged = True
        return done
