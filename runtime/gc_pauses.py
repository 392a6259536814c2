"""Python's cyclic garbage collector in a serving process: its pauses, timed, and the objects that
startup made, frozen out of its full collections.

A full (generation 2) collection walks every tracked container object of the process, and every
thread waits while it runs. A server's startup leaves ~10^5 of them (the model's modules, the
tokenizer's and the web framework's modules and classes) that live until exit: with the Llama
demo model loaded and warmed up and the server app built, one full collection over ~134,000
objects took 73-86 ms on a shared 2-core CPU, against ~0 ms once they were frozen
(`gc.freeze()`: moved to a generation the collector no longer walks). The collector starts a
full collection by itself as long-lived objects accumulate, so those pauses
land inside running streams' inter-token gaps. `graphc serve` therefore freezes what startup made
once the model is loaded and warmed up (`--no-gc-freeze` keeps Python's default), after a
collection so that no garbage is frozen with it; a model unloaded from a multi-model server is
unfrozen first, so its cycles can still be collected. The collector keeps running on everything
made after that point.

`GcPauses` times every collection by generation through `gc.callbacks` (one process-wide
instance, `install()`), for /metrics: collections, seconds paused, the longest pause.
"""

from __future__ import annotations

import gc
import threading
import time

GENERATIONS = (0, 1, 2)


class GcPauses:
    """Counts and durations of the collector's runs, per generation, since install."""

    def __init__(self):
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._t0: float | None = None

    def callback(self, phase: str, info: dict) -> None:
        """gc.callbacks hook: time from a collection's "start" to its "stop"."""
        # The collector holds the GIL from "start" to "stop", so no other thread's collection
        # interleaves with this one.
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        dt, self._t0 = time.perf_counter() - self._t0, None
        g = min(int(info.get("generation", 2)), 2)
        self.collections[g] += 1
        self.seconds[g] += dt
        self.longest[g] = max(self.longest[g], dt)

    def snapshot(self) -> dict:
        return {"collections": list(self.collections), "seconds": list(self.seconds),
                "longest": list(self.longest), "frozen": gc.get_freeze_count()}


_installed: GcPauses | None = None
_lock = threading.Lock()


def install() -> GcPauses:
    """The process's GcPauses, its callback registered on first call."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = GcPauses()
            gc.callbacks.append(_installed.callback)
        return _installed


def freeze_startup() -> int:
    """Collect, then freeze every object left (they are startup's: the model, the modules); how
    many objects the collector no longer walks."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze() -> None:
    """Hand the frozen objects back to the collector (before unloading a model, whose cycles must
    be collectable)."""
    gc.unfreeze()
