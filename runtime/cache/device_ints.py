"""Small per-row int arrays that a decode step reads, kept on the device.

On MLX's CUDA backend an array made on the host (``mx.array(list)``) lives in managed memory,
and the first GPU kernel that reads it after the CPU wrote it migrates its page: ~100 µs for 64
int32s, while an array made once and reused costs nothing more than a device-made one (H200,
benchmarks/probes/host_arrays.py; arrays of at most 8 bytes come from a pool the GPU reads in
place, so batch 1 never pays). The caches' per-row values (left padding, position bases) change
only when the batch's rows do, so each value is made once here and every layer shares it.
"""

from __future__ import annotations

import threading

import mlx.core as mx


def on_device(ints: list[int]) -> mx.array:
    """int32 [len(ints)] holding `ints`: the same array for the same values (a few kept), so a
    step that needs a batch's per-row values reads one made when the rows last changed."""
    key = tuple(ints)
    hit = _MADE.get(key)
    if hit is None:
        if len(_MADE) >= 16:  # a few compositions alive at once (the batch, a verify, a joiner)
            try:  # the oldest; engines on other threads may be dropping one too
                _MADE.pop(next(iter(_MADE)), None)
            except (StopIteration, RuntimeError):
                pass
        hit = _MADE[key] = mx.array(ints, dtype=mx.int32)
    return hit


_MADE: dict[tuple, mx.array] = {}


def offsets(arr: mx.array, base: int, sign: int) -> mx.array:
    """``base + sign * arr``: a step's per-row offsets from a per-row device array. Every layer's
    cache asks for the same one in a step (they share ``arr``), so it is built once and the
    layers get that lazy array, not one op each.

    Remembered per thread: the lazy sum belongs to the stream of the thread that built it, and
    MLX evaluates it only there ("There is no Stream(gpu, N) in current thread"), while ``arr``
    (from `on_device`) is shared by every engine of the process."""
    key = (id(arr), base, sign)
    last = getattr(_last, "entry", None)
    if last is not None and last[0] == key:
        return last[2]
    out = base + arr if sign > 0 else base - arr
    _last.entry = (key, arr, out)  # arr held: its id is not reused while it is part of the key
    return out


_last = threading.local()
