"""Slot allocator for the shared KV pool: plain Python, no arrays.

Slot ids run 1..capacity; id 0 is the pool's reserved padding slot (a gather over a
padded index list reads zeros there, and a stray write lands somewhere harmless).
Fresh ids are handed out in increasing order, so the pool's arrays only need to be as
large as the highest id ever used (`high_water`) and can grow by doubling.
"""

from __future__ import annotations

import numpy as np

PAD_SLOT = 0


class SlotAllocator:
    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self._free: list[int] = []  # released ids, reused first
        self._next = 1  # ids >= _next were never handed out

    @property
    def free(self) -> int:
        return len(self._free) + (self.capacity + 1 - self._next)

    @property
    def used(self) -> int:
        return self.capacity - self.free

    @property
    def high_water(self) -> int:
        """Rows the pool arrays need (padding slot included)."""
        return self._next

    def alloc(self, n: int) -> np.ndarray | None:
        """n slot ids, or None when fewer than n are free (nothing is taken then)."""
        if n > self.free:
            return None
        reuse = min(n, len(self._free))
        out = self._free[len(self._free) - reuse:]
        del self._free[len(self._free) - reuse:]
        fresh = n - reuse
        ids = np.empty(n, dtype=np.int32)
        ids[:reuse] = out
        ids[reuse:] = np.arange(self._next, self._next + fresh, dtype=np.int32)
        self._next += fresh
        return ids

    def release(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int32)
        if ids.size and (ids.min() < 1 or ids.max() >= self._next):
            raise ValueError("releasing a slot id that was never allocated")
        self._free.extend(ids.tolist())
