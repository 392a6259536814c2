"""The timer the kernel protos share: µs per op of a graph of `per` ops (the protos build 32, as
a 32-layer step has), median over `reps` evaluated graphs after one warm-up, synchronized on
both sides so each sample is the device time of one graph plus its launch."""
import statistics
import time

import mlx.core as mx


def timed(fn, reps: int = 15, per: int = 32) -> float:
    mx.eval(fn())
    ts = []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6 / per
