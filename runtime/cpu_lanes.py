"""How many prefill forwards run at once on this CPU: the device fact behind the prefill plan's
`prefill lanes` choice (compiler/passes/prefill_choices.py).

MLX runs each stream's ops on a thread of its own. The Linux `mlx[cpu]` wheels bundle the
reference BLAS, whose matmul uses one thread: one batched forward leaves every other core idle,
so independent forwards on two streams finish together in about the time of one. On the 2-core
development machine two forwards of 4 prompts x 384 tokens (small-32k shape, float32) on two
streams took 11.5-12.1 s against 22.2-23.1 s for one forward of all 8 prompts and 22.0-23.7 s for
the two one after the other (docs/cpu-prefill.md). Where the BLAS is threaded (Accelerate,
OpenBLAS) one matmul already takes the cores and a second stream only competes for them.

So it is measured, once per process: the same matmul twice on one stream, and once on each of
two streams, alternately, the fastest of each kept. Two lanes when the pair on two streams takes
under LANE_GAIN of the time of the pair on one, else one. Off CPU: one lane (a GPU runs one
forward's kernels across the device).
"""

from __future__ import annotations

import os
import time

import attrs
import mlx.core as mx

# Two streams must finish the pair in under this share of the time one stream takes for it.
LANE_GAIN = 0.75
# The probe's matmul: ~134 MFLOP, ~40 ms with the reference BLAS on one core, ~1-2 ms with a fast one.
PROBE_SHAPE = (256, 512, 512)
REPEATS = 5
MAX_LANES = 2  # measured up to two (the development machine's cores)


@attrs.frozen
class Lanes:
    count: int
    why: str


_measured: Lanes | None = None


def cpu_lanes() -> Lanes:
    """The prefill lanes of this process's CPU, measured on first use."""
    global _measured
    if _measured is None:
        _measured = _measure()
    return _measured


def _measure() -> Lanes:
    cores = os.cpu_count() or 1
    if cores < 2:
        return Lanes(1, f"{cores} CPU core")
    m, k, n = PROBE_SHAPE
    a = mx.random.normal((m, k), key=mx.random.key(0))
    b = mx.random.normal((k, n), key=mx.random.key(1))
    one = mx.default_stream(mx.cpu)
    pair = (mx.new_stream(mx.cpu), mx.new_stream(mx.cpu))
    mx.eval(a, b)

    def timed(streams) -> float:
        outs = []
        for s in streams:
            with mx.stream(s):
                outs.append(a @ b + 0)  # + 0: two distinct outputs even on one stream
        t0 = time.perf_counter()
        mx.eval(*outs)
        return time.perf_counter() - t0

    timed(pair)  # first use of the BLAS and the streams' threads, not timed
    # Interleaved, the fastest of each: a moment of load from another process hits both sides.
    serial = parallel = float("inf")
    for _ in range(REPEATS):
        serial, parallel = min(serial, timed((one, one))), min(parallel, timed(pair))
    return lanes_for(serial, parallel, cores)


def lanes_for(serial: float, parallel: float, cores: int) -> Lanes:
    """The lanes a measurement gives: the probe's pair took `serial` seconds on one stream and
    `parallel` on two."""
    m, k, n = PROBE_SHAPE
    ratio = parallel / serial if serial > 0 else 1.0
    measured = f"a {m}x{k}x{n} matmul twice on two CPU streams took {ratio:.2f} of the time on one"
    if cores >= 2 and ratio < LANE_GAIN:
        return Lanes(min(MAX_LANES, cores), f"{measured} (BLAS on one thread a matmul, {cores} cores)")
    return Lanes(1, f"{measured}: the BLAS already uses the cores")


__all__ = ["LANE_GAIN", "Lanes", "cpu_lanes", "lanes_for"]
