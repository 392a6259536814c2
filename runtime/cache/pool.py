"""The shared KV pool: per layer K and V (and any other per-token plane) by slot. Arrays only.

Which slot holds which token is decided elsewhere (runtime/prefix_cache.py, plain
Python); this class gathers and scatters rows. Row 0 is the reserved padding slot.

The arrays grow by doubling up to `capacity + 1` rows as the allocator's high-water
mark rises, so a large memory budget costs nothing until it is used (a doubling copies
the pool once: amortized O(1) per slot). Writes are queued with `async_eval` right
away: a pending lazy write would keep the source request's cache buffers alive and
force the next decode step to copy them instead of updating in place.
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

INITIAL_ROWS = 1024


def device_memory() -> int:
    """Bytes of memory the default device can use (unified / GPU memory, else system RAM)."""
    try:
        info = mx.device_info()
        for key in ("memory_size", "total_memory"):
            if info.get(key):
                return int(info[key])
    except Exception:  # pragma: no cover - older mlx
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class KVPool:
    """Per layer, one array per *plane* of shape (slots, heads, ...): K and V for plain KV,
    more for policies that store more per token (int8 codes and their scales). Planes arrive
    as the prefix protocol hands them (runtime/cache/prefix_state.py: [heads, n, ...], token
    axis second); each keeps the dtype and trailing shape of its first write."""

    def __init__(self, layers: list[int], capacity: int):
        self.layers = list(layers)
        self.capacity = int(capacity)
        self.planes: dict[int, list[mx.array]] = {}
        self.rows = 0
        self.grows = 0

    def _ensure(self, layer: int, rows: int, like: tuple) -> None:
        """Make every layer's arrays hold at least `rows` rows (shapes/dtypes from [H, n, ...] sources)."""
        if layer not in self.planes:
            self.planes[layer] = [mx.zeros((max(self.rows, 1), x.shape[0]) + x.shape[2:], x.dtype) for x in like]
        if rows <= self.rows and self.planes[layer][0].shape[0] >= rows:
            return
        new = max(self.rows, INITIAL_ROWS)
        while new < rows:
            new *= 2
        new = max(rows, min(new, self.capacity + 1))
        for i, arrays in self.planes.items():
            extra = new - arrays[0].shape[0]
            if extra > 0:
                self.planes[i] = [mx.pad(a, [(0, extra)] + [(0, 0)] * (a.ndim - 1)) for a in arrays]
        if new > self.rows:
            self.grows += 1
        self.rows = new

    def write(self, layer: int, slots: np.ndarray, planes: tuple) -> None:
        """Scatter planes [H, n, ...] (positions in order) into `slots` [n]."""
        if len(slots) == 0:
            return
        self._ensure(layer, int(slots.max()) + 1, planes)
        mine = self.planes[layer]
        if len(planes) != len(mine):
            raise ValueError(f"layer {layer}: the policy captured {len(planes)} planes, the pool holds {len(mine)}")
        idx = mx.array(slots, dtype=mx.int32)
        for dst, x in zip(mine, planes):
            dst[idx] = x.swapaxes(0, 1).astype(dst.dtype)

    def gather(self, layer: int, slots: np.ndarray) -> tuple:
        """Every plane [H, n, ...] of `slots` [n], in order."""
        idx = mx.array(slots, dtype=mx.int32)
        return tuple(a[idx].swapaxes(0, 1) for a in self.planes[layer])

    def flush(self) -> None:
        """Queue the pending writes (see the module docstring for why now)."""
        if self.planes:
            mx.async_eval([a for arrays in self.planes.values() for a in arrays])

    def arrays(self) -> list[mx.array]:
        return [a for arrays in self.planes.values() for a in arrays]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())
