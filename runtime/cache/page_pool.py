"""The page pool behind the `paged` cache policy (runtime/cache/paged.py): one layer's keys and
values in fixed-size pages, handed out and taken back by reference count.

The pool's arrays grow by copying when pages run out and keep their peak (freed pages are
reused, not returned to MLX): how much they grow at a time bounds the KV held beyond the live
tokens' (docs/cache-policies.md, "Paged KV")."""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np

GROWTH = 1.125  # the pool grows by an eighth of its pages (at least MIN_GROWTH) when they run out
MIN_GROWTH = 64


class PagePool:
    """One layer's pages: `keys` [pages * page_tokens, H, D] and `values` likewise (a position's
    slot is page * page_tokens + its offset in the page). Page 0 is never handed out: its zeros
    are what the gather reads past a row's end. Arrays are made at the first write (which shows
    the heads, dims and dtype) and grow by copying."""

    def __init__(self, page_tokens: int):
        self.page_tokens = page_tokens
        self.keys = self.values = None
        self.refs = np.zeros(1, np.int32)  # per page: how many rows hold it (page 0: never)
        self.free: list[int] = []
        self.grows = 0
        # The page counts are changed on the engine's thread, and by a dropped cache's finalizer,
        # which runs on whichever thread let the cache go (the garbage collector's, at times).
        self._lock = threading.Lock()

    @property
    def pages(self) -> int:
        return len(self.refs)

    def alloc(self, n: int) -> list[int]:
        with self._lock:
            if len(self.free) < n:
                self._grow(n - len(self.free))
            out = [self.free.pop() for _ in range(n)]
            self.refs[out] = 1
            return out

    def retain(self, pages) -> None:
        with self._lock:
            np.add.at(self.refs, np.asarray(pages, np.int64), 1)

    def release(self, pages) -> None:
        if not len(pages):
            return
        idx = np.asarray(pages, np.int64)
        with self._lock:
            np.subtract.at(self.refs, idx, 1)
            self.free.extend(int(p) for p in np.unique(idx) if self.refs[p] == 0)

    def _grow(self, at_least: int) -> None:
        extra = max(at_least, MIN_GROWTH, int(self.pages * (GROWTH - 1)))
        old = self.pages
        self.refs = np.concatenate([self.refs, np.zeros(extra, np.int32)])
        self.free.extend(range(self.pages - 1, old - 1, -1))  # lowest first out of pop()
        if self.keys is not None:
            pad = [(0, extra * self.page_tokens), (0, 0), (0, 0)]
            self.keys, self.values = mx.pad(self.keys, pad), mx.pad(self.values, pad)
        self.grows += 1

    def write(self, slots: mx.array, keys: mx.array, values: mx.array) -> None:
        """Scatter `keys` / `values` [n, H, D] into `slots` [n]."""
        if self.keys is None:
            n = self.pages * self.page_tokens
            self.keys = mx.zeros((n,) + keys.shape[1:], keys.dtype)
            self.values = mx.zeros((n,) + values.shape[1:], values.dtype)
        self.keys[slots] = keys.astype(self.keys.dtype)
        self.values[slots] = values.astype(self.values.dtype)

    @property
    def bytes_per_slot(self) -> int:
        if self.keys is None:
            return 0
        return (self.keys.nbytes + self.values.nbytes) // self.keys.shape[0]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def release_rows(pool: PagePool, rows: list) -> None:
    """Give back every page of `rows` (lists of page ids): a dropped cache's finalizer."""
    pool.release([p for row in rows for p in row])
