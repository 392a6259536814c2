"""The shared KV pool: per layer K and V of shape (slots, kv_heads, head_dim). Arrays only.

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
    def __init__(self, layers: list[int], capacity: int):
        self.layers = list(layers)
        self.capacity = int(capacity)
        self.k: dict[int, mx.array] = {}
        self.v: dict[int, mx.array] = {}
        self.rows = 0
        self.grows = 0

    def _ensure(self, layer: int, rows: int, like_k: mx.array, like_v: mx.array) -> None:
        """Make every layer's arrays hold at least `rows` rows (shapes/dtype from a [H, n, D] source)."""
        if layer not in self.k:
            H, _, D = like_k.shape
            self.k[layer] = mx.zeros((max(self.rows, 1), H, D), like_k.dtype)
            self.v[layer] = mx.zeros((max(self.rows, 1), H, like_v.shape[2]), like_v.dtype)
        if rows <= self.rows and self.k[layer].shape[0] >= rows:
            return
        new = max(self.rows, INITIAL_ROWS)
        while new < rows:
            new *= 2
        new = max(rows, min(new, self.capacity + 1))
        for i in self.k:
            extra = new - self.k[i].shape[0]
            if extra > 0:
                self.k[i] = mx.pad(self.k[i], [(0, extra), (0, 0), (0, 0)])
                self.v[i] = mx.pad(self.v[i], [(0, extra), (0, 0), (0, 0)])
        if new > self.rows:
            self.grows += 1
        self.rows = new

    def write(self, layer: int, slots: np.ndarray, keys: mx.array, values: mx.array) -> None:
        """Scatter keys/values [H, n, D] (positions in order) into `slots` [n]."""
        if len(slots) == 0:
            return
        self._ensure(layer, int(slots.max()) + 1, keys, values)
        idx = mx.array(slots, dtype=mx.int32)
        self.k[layer][idx] = keys.swapaxes(0, 1).astype(self.k[layer].dtype)
        self.v[layer][idx] = values.swapaxes(0, 1).astype(self.v[layer].dtype)

    def gather(self, layer: int, slots: np.ndarray) -> tuple[mx.array, mx.array]:
        """keys/values [H, n, D] of `slots` [n], in order."""
        idx = mx.array(slots, dtype=mx.int32)
        return self.k[layer][idx].swapaxes(0, 1), self.v[layer][idx].swapaxes(0, 1)

    def flush(self) -> None:
        """Queue the pending writes (see the module docstring for why now)."""
        if self.k:
            mx.async_eval(list(self.k.values()) + list(self.v.values()))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k.values()) + sum(a.nbytes for a in self.v.values())
