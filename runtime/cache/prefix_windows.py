"""The prefix cache's TAIL bookkeeping (sliding-attention windows before boundaries), a mixin of
runtime/prefix_cache.py's PrefixCache: which window-pool slots each boundary keeps, their
reference counts, and their eviction ("tombstones"). Plain Python and numpy, like the rest of
the bookkeeping; it reads and writes the PrefixCache's `tree`, `window`, `window_slots`,
`n_boundaries` and `counters`."""

from __future__ import annotations

import heapq

import numpy as np

from .radix import Node


class WindowBookkeeping:
    def _window_ok(self, bad: np.ndarray, m: int) -> tuple[bool, int]:
        """Whether positions m-window+1..m-1 are all kept; else the next m worth trying."""
        i = np.searchsorted(bad, m) - 1  # last uncovered position < m
        if i < 0:
            return True, m
        last_bad = int(bad[i])
        if last_bad < m - (self.window - 1):
            return True, m
        return False, last_bad  # any m' in (last_bad, m) still needs last_bad

    def _unpin(self, hold) -> None:
        if hold.pinned is not None:
            node, start, end = hold.pinned
            self._add_cover(node, start, end, -1)
            hold.pinned = None

    def _cover_boundary(self, node: Node, start: int, b: int, cap, plan) -> None:
        parts = list(self.tree.ancestors_over(node, start, b))
        for n, lo, hi in parts:  # count this boundary first, so evicting others cannot free what it reuses
            n.sw_ref[lo:hi] += 1
        need = sum(int((n.sw[lo:hi] < 0).sum()) for n, lo, hi in parts)
        if need > self.window_slots.free:
            self._evict_windows(need - self.window_slots.free, keep=node)
        new = self.window_slots.alloc(need)
        if new is None:  # no room: this boundary stays a plain prefix point
            self._add_cover(node, start, b, -1)
            return
        taken, offsets = 0, []
        for n, lo, hi in parts:
            miss = np.flatnonzero(n.sw[lo:hi] < 0) + lo
            n.sw[miss] = new[taken:taken + len(miss)]
            taken += len(miss)
            offsets.append(miss + n.start - cap.window_start)
        node.covered = True
        self.n_boundaries += 1
        if need:
            plan.window.append((new, cap, np.concatenate(offsets)))

    def _add_cover(self, node: Node, start: int, end: int, delta: int) -> None:
        """Count (or uncount) one holder of the window slots of positions start..end-1."""
        for n, lo, hi in self.tree.ancestors_over(node, start, end):
            n.sw_ref[lo:hi] += delta
            if delta < 0:
                dead = np.flatnonzero((n.sw_ref[lo:hi] == 0) & (n.sw[lo:hi] >= 0)) + lo
                if len(dead):
                    self.window_slots.release(n.sw[dead])
                    n.sw[dead] = -1

    def _uncover(self, node: Node) -> None:
        if node.covered:
            node.covered = False
            self.n_boundaries -= 1
            self._add_cover(node, max(0, node.end - self.window), node.end, -1)

    def _evict_windows(self, need: int, keep: Node | None = None) -> None:
        start = self.window_slots.free
        heap = [(n.last_access, id(n), n) for n in self.tree.nodes() if n.covered and n.ref == 0 and n is not keep]
        heapq.heapify(heap)
        while heap and self.window_slots.free - start < need:
            _, _, node = heapq.heappop(heap)
            self._uncover(node)
            self.counters["window_tombstones"] += 1
