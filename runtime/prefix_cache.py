"""The prefix cache's bookkeeping: radix tree, slot allocators, LRU eviction, per-request holds.

Plain Python (numpy for slot lists): it decides *which* slots hold what; the array side
(runtime/prefix_io.py, runtime/cache/pool.py) gathers and scatters.

What is kept, per layer kind (a policy's `prefix_kind`, runtime/cache/prefix_state.py):

- TOKENS (full attention, `pool_backed`, the int8 example): every cached token's rows in a
  pool slot. A hit may end at any matched position.
- TAIL (sliding attention, `windowed`): only the last `window` positions before a
  *boundary* are kept, in a second, window pool. Boundaries sit at multiples of
  `interval` inside a prompt, at the chat's message boundaries (SamplingParams.prefix_boundaries:
  where the server's chat template ended each message), at the prompt's end and at the end
  of a finished request (the next turn of a chat resumes there). A hit may end at m when positions
  m-window+1..m-1 are all kept: at a boundary b, or at b-1. Window slots are reference
  counted by the boundaries that cover them, so sliding KV that no boundary needs is
  freed as soon as its last boundary goes.
- SNAPSHOT (linear attention / SSM, `ssm_state`): the recurrent state after a boundary
  (message boundaries, prompt and request ends as above, plus prompt end - 1 so a repeated
  prompt recomputes one token; multiples of `snapshot_interval`, sparser than `interval` as
  a snapshot is the whole state). A hit must end exactly at a snapshot, else it falls back
  to a shorter one or to none. A chat that grows by one turn resumes at the message boundary
  where its previous prompt and this one part (docs/cache-policies.md, "Hybrid models").

Window bookkeeping lives in runtime/cache/prefix_windows.py, the records it hands out in
runtime/cache/prefix_records.py, the sizing in runtime/prefix_sizing.py.

A full-prefix hit still recomputes the last prompt token (its logits start decoding).

Holds. A request admitted with a hit locks the node holding its last matched token (so
its pool slots cannot be evicted before they are gathered) and pins the window slots it
will restore. It re-locks its prompt's end once its prompt is inserted, and releases
everything when it finishes or is aborted — at any point. Nothing else is held: slots
are allocated and written in the same call.

Eviction. Pool slots: least recently used unreferenced leaves first (their boundary
marks and snapshots go with them). Window slots: least recently used boundaries of
unreferenced nodes lose their window ("tombstones": the tokens stay for full layers).
Snapshots: a count limit, evicted the same way. If nothing can be evicted, the insert
keeps what fits; a request never waits on the cache.
"""

from __future__ import annotations

import heapq

import numpy as np

# The rule over the policies' prefix protocol is a neutral contract (the plan's inspect note reads it too).
from graphc.contracts.policies import prefix_unsupported_reason  # noqa: F401 - re-exported
from .cache.prefix_records import Capture, Hit, Hold, WritePlan  # noqa: F401 - re-exported
from .cache.prefix_windows import WindowBookkeeping
from .cache.radix import Node, RadixTree, common_prefix, tick
from .cache.slots import SlotAllocator


class PrefixCache(WindowBookkeeping):
    MIN_GAIN = 32  # prompt tokens a request must gain to wait a step for a request ahead of it
    def __init__(self, *, capacity: int, window: int | None = None, window_capacity: int = 0,
                 snapshots: bool = False, max_snapshots: int = 0, interval: int = 512,
                 snapshot_interval: int | None = None):
        if interval < 1:
            raise ValueError(f"prefix boundary interval must be >= 1, got {interval}")
        if snapshot_interval is not None and snapshot_interval < 1:
            raise ValueError(f"snapshot interval must be >= 1 token, got {snapshot_interval}")
        self.window = window
        self.snapshots = snapshots
        self.interval = interval
        self.snapshot_interval = interval if snapshot_interval is None else snapshot_interval
        self.tree = RadixTree(windowed=window is not None)
        self.slots = SlotAllocator(capacity)
        self.window_slots = SlotAllocator(window_capacity) if window is not None else None
        self.max_snapshots = max_snapshots
        self.n_snapshots = 0
        self.n_boundaries = 0  # nodes whose window is kept
        self.holds: dict[str, Hold] = {}
        self.counters = {"queries": 0, "hits": 0, "hit_tokens": 0, "declined_hits": 0, "inserted_tokens": 0,
                         "evicted_tokens": 0, "window_tombstones": 0, "snapshot_evictions": 0,
                         "disk_hits": 0, "disk_hit_tokens": 0}
        # The disk tier (runtime/cache/disk_tier.py), attached by the engine with kv_cache_dir: blocks
        # are read back before a match (promote) and written before a leaf's slots are reused.
        self.disk = None
        self.disk_off: str | None = None  # why a disk tier was asked for and is off

    @property
    def needs_boundaries(self) -> bool:
        return self.window is not None or self.snapshots

    # -- admission ----------------------------------------------------------------
    def admitted(self, req) -> bool:
        return req.id in self.holds

    def admit(self, req, min_hit: int = 1, align: int = 0) -> int:
        """Match the longest usable cached prefix of `req`'s prompt and lock it. Returns the prompt
        tokens the hit restores (the scheduler records them in req.prefilled / cached_tokens).
        A hit shorter than `min_hit` tokens is declined (0: the prompt is computed whole; the
        scheduler asks for that when the request can join a batched prefill instead).
        `align` > 1 cuts a hit down to a multiple of it where every layer keeps plain tokens (a
        window's or a snapshot's hit must end where it ends): the rest of the prompt then starts
        on an aligned offset, so its chunks' attention shapes are the ones warmed (a GPU builds a
        plan per new shape, ~40-100 ms; text prompts share a first token or two, and hits of 1-4
        tokens gave every such request shapes of its own: docs/scheduling.md)."""
        if req.id in self.holds:
            raise ValueError(f"request '{req.id}' was admitted already; release it before admitting it again")
        hold = self.holds[req.id] = Hold()
        self.counters["queries"] += 1
        if getattr(req.params, "prompt_logprobs", None) is not None:
            return 0  # it needs logits at every prompt position: compute them all
        tokens = np.asarray(req.context_ids, dtype=np.int32)
        # The disk's blocks past the tree's match join the tree first; then the match sees them.
        from_disk = self.disk.promote(tokens) if self.disk is not None else 0
        path, m0 = self.tree.match(tokens)
        m = self._usable(path, min(m0, len(tokens) - 1))
        if align > 1 and not self.needs_boundaries:
            if 0 < m < align:
                self.counters["declined_hits"] += 1
            m -= m % align
        if m <= 0:
            return 0
        if m < min_hit:
            self.counters["declined_hits"] += 1
            return 0
        node = next(n for n in path if n.end >= m)  # holds position m-1
        self.tree.lock(node)
        hold.node = node
        for n in path:
            n.last_access = tick()
        slots = np.concatenate([n.slots for n in path])[:m]
        hit = Hit(m, slots)
        if self.window is not None:
            start = max(0, m - (self.window - 1))
            self._add_cover(node, start, m, +1)  # pin: no tombstone may free them before restore
            hold.pinned = (node, start, m)
            hit.window_slots = np.concatenate(
                [n.sw[lo:hi] for n, lo, hi in reversed(list(self.tree.ancestors_over(node, start, m)))])
        if self.snapshots:
            hit.snapshot = next(n.snapshot for n in path if n.end == m)
        hold.hit = hit
        self.counters["hits"] += 1
        self.counters["hit_tokens"] += m
        if from_disk:  # a hit by tier: what the disk added is what made it longer
            self.counters["disk_hits"] += 1
            self.counters["disk_hit_tokens"] += min(from_disk, m)
        return m

    def should_wait(self, req, ahead: list, align: int = 0) -> bool:
        """Whether `req` should wait a step: requests scheduled ahead of it share at least
        MIN_GAIN more prompt tokens with it than the cache can give now, and will have
        stored them by the next step (in-batch prefix sharing, for bursts of one system prompt).
        With `align` (admit's) both are counted as the hits admit would cut them to: a shared
        prefix shorter than the alignment gains nothing by waiting."""
        if not ahead or req.id in self.holds or getattr(req.params, "prompt_logprobs", None) is not None:
            return False
        tokens = np.asarray(req.context_ids, dtype=np.int32)
        shared = max(common_prefix(np.asarray(r.context_ids, dtype=np.int32), tokens) for r in ahead)
        shared = min(shared, len(tokens) - 1)
        if shared < self.MIN_GAIN:
            return False
        path, m0 = self.tree.match(tokens)
        have = self._usable(path, min(m0, len(tokens) - 1))
        if align > 1 and not self.needs_boundaries:
            shared, have = shared - shared % align, have - have % align
        return shared - have >= self.MIN_GAIN

    def _usable(self, path: list[Node], limit: int) -> int:
        """The longest m <= limit a hit can resume at (see the module docstring)."""
        if limit <= 0:
            return 0
        if not self.needs_boundaries:
            return limit
        if self.snapshots:
            cands = sorted((n.end for n in path if n.snapshot is not None and n.end <= limit), reverse=True)
        else:
            cands = None
        cov = None
        if self.window is not None:
            cov = np.concatenate([n.sw >= 0 for n in path])[:limit]
            bad = np.flatnonzero(~cov)
        if cands is None:  # window only: scan down from limit, jumping over uncovered tokens
            m = limit
            while m > 0:
                ok, m2 = self._window_ok(bad, m)
                if ok:
                    return m
                m = m2
            return 0
        for m in cands:
            if cov is None or self._window_ok(bad, m)[0]:
                return m
        return 0

    def take_hit(self, req) -> Hit | None:
        """The admitted hit, handed to the array side once (unpins its window slots)."""
        hold = self.holds.get(req.id)
        if hold is None or hold.hit is None:
            return None
        hit, hold.hit = hold.hit, None
        self._unpin(hold)
        return hit

    # -- boundaries (where the array side captures state during prefill) ---------------
    def capture_points(self, req) -> set[int]:
        """Prompt positions after which the array side captures windows / snapshots: every
        `interval` tokens (window layers), every `snapshot_interval` tokens (recurrent layers),
        the message boundaries the request carries (where the chat template ends each message:
        the next turn of a growing chat shares the prompt up to one of them), and the prompt's end."""
        if not self.needs_boundaries:
            return set()
        L = len(req.context_ids)
        pts = {L}
        if self.window is not None:
            pts.update(range(self.interval, L + 1, self.interval))
        if self.snapshots:
            pts.update(range(self.snapshot_interval, L + 1, self.snapshot_interval))
            if L > 1:
                pts.add(L - 1)
        pts.update(b for b in getattr(req.params, "prefix_boundaries", ()) if 0 < b < L)
        if self.snapshots and self.disk is not None and L > self.disk.block:
            # the state the disk tier writes beside the blocks: the last block end a hit can resume at
            pts.add((L - 1) // self.disk.block * self.disk.block)
        return pts

    def add_capture(self, req, pos: int, capture: Capture) -> None:
        hold = self.holds.get(req.id)
        if hold is not None:
            hold.captures[pos] = capture

    # -- insertion --------------------------------------------------------------------
    def insert_prompt(self, req, upto: int | None = None) -> WritePlan:
        """Prompt tokens [0, upto) are in the working cache: store what the tree lacks and keep
        its end locked. Called after every chunk, so a request admitted while this one is
        still prefilling already hits the part computed so far."""
        hold = self.holds.setdefault(req.id, Hold())
        n = len(req.context_ids) if upto is None else upto
        caps = {p: c for p, c in hold.captures.items() if p <= n}
        plan, end = self._insert(req.context_ids[:n], caps)
        hold.captures = {p: c for p, c in hold.captures.items() if p > n}
        old, hold.node = hold.node, end
        if end is not None:
            self.tree.lock(end)
        if old is not None:
            self.tree.unlock(old)
        return plan

    def insert_finished(self, req, seq: list[int], capture: Capture | None) -> WritePlan:
        """A finished request's whole sequence (prompt + output whose KV exists)."""
        caps = {len(seq): capture} if capture is not None else {}
        plan, _ = self._insert(seq, caps)
        return plan

    def insert_tokens(self, seq) -> WritePlan:
        """Tokens whose KV comes from outside any request (the disk tier): store what the tree lacks."""
        plan, _ = self._insert(seq, {})
        return plan

    def insert_snapshot(self, seq, states: list) -> None:
        """Recurrent state after `seq` from outside any request (the disk tier), once `seq` is stored."""
        self._insert(seq, {len(seq): Capture(snapshot=states)})

    def _insert(self, seq: list[int], captures: dict) -> tuple[WritePlan, Node | None]:
        plan = WritePlan()
        tokens = np.asarray(seq, dtype=np.int32)
        n = len(tokens)
        if n == 0:
            return plan, None
        path, e = self.tree.match(tokens)
        if path:
            self.tree.lock(path[-1])  # nothing on our path may be evicted while we allocate
        try:
            if e < n:
                slots = self._alloc_pool(n - e)
                n = e + len(slots)
                if len(slots):
                    parent = self.tree.node_ending_at(tokens, e)
                    self.tree.add_leaf(parent, tokens[e:n], slots)
                    plan.pool.append((slots, e, n))
                    self.counters["inserted_tokens"] += len(slots)
            for b in sorted(p for p in captures if 0 < p <= n):
                self._mark_boundary(tokens, b, captures[b], plan)
            end = self.tree.node_ending_at(tokens, n) if n > 0 else None
        finally:
            if path:
                self.tree.unlock(path[-1])
        for node in (end,) if end is not None else ():
            node.last_access = tick()
        return plan, end

    def _mark_boundary(self, tokens: np.ndarray, b: int, cap: Capture, plan: WritePlan) -> None:
        node = self.tree.node_ending_at(tokens, b)
        node.last_access = tick()
        if self.window is not None and not node.covered and cap.window is not None:
            start = max(0, b - self.window)
            if cap.window_start <= start:
                self._cover_boundary(node, start, b, cap, plan)
        if self.snapshots and node.snapshot is None and cap.snapshot is not None:
            if self.n_snapshots >= self.max_snapshots:
                self._evict_snapshot()
            if self.n_snapshots < self.max_snapshots:
                node.snapshot = cap.snapshot
                self.n_snapshots += 1

    # -- eviction -----------------------------------------------------------------------
    def _alloc_pool(self, n: int) -> np.ndarray:
        if n > self.slots.free:
            self._evict_leaves(n - self.slots.free)
        return self.slots.alloc(min(n, self.slots.free))

    def _evict_leaves(self, need: int) -> int:
        heap = [(n.last_access, id(n), n) for n in self.tree.nodes()
                if not n.children and n.ref == 0 and n is not self.tree.root]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < need:
            _, _, leaf = heapq.heappop(heap)
            freed += self._drop(leaf)
            parent = leaf.parent
            if parent is not self.tree.root and not parent.children and parent.ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def _drop(self, leaf: Node) -> int:
        if self.window is not None:
            self._uncover(leaf)
        if leaf.snapshot is not None:
            leaf.snapshot = None
            self.n_snapshots -= 1
        if self.disk is not None:
            self.disk.spill_leaf(leaf)  # before its slots are released and reused
        self.tree.remove_leaf(leaf)
        self.slots.release(leaf.slots)
        self.counters["evicted_tokens"] += len(leaf.slots)
        return len(leaf.slots)

    def _evict_snapshot(self) -> None:
        cands = [n for n in self.tree.nodes() if n.snapshot is not None and n.ref == 0]
        if cands:
            victim = min(cands, key=lambda n: n.last_access)
            victim.snapshot = None
            self.n_snapshots -= 1
            self.counters["snapshot_evictions"] += 1

    # -- release / admin ---------------------------------------------------------------
    def release(self, req) -> None:
        """Return every tree reference and pin `req` holds (finished or aborted, at any point)."""
        hold = self.holds.pop(req.id, None)
        if hold is None:
            return
        self._unpin(hold)
        if hold.node is not None:
            self.tree.unlock(hold.node)

    def flush(self) -> int:
        """Evict everything no live request holds; returns the tokens freed."""
        freed = self._evict_leaves(self.tree.tokens + 1)
        if self.window is not None:
            self._evict_windows(self.window_slots.capacity + 1)
        return freed

    def stats(self) -> dict:
        out = {
            "pool_slots": self.slots.capacity,
            "pool_used": self.slots.used,
            "pool_free": self.slots.free,
            "tree_tokens": self.tree.tokens,
            "tree_nodes": self.tree.size,
            "held_requests": len(self.holds),
            **self.counters,
        }
        if self.window is not None:
            out.update(window_slots=self.window_slots.capacity, window_used=self.window_slots.used,
                       boundaries=self.n_boundaries)
        if self.snapshots:
            out.update(snapshots=self.n_snapshots, max_snapshots=self.max_snapshots)
        disk = self.disk.stats() if self.disk is not None else {"disk_enabled": False}
        if self.disk_off:
            disk["disk_off"] = self.disk_off
        out.update(disk, memory_hits=self.counters["hits"] - self.counters["disk_hits"])
        return out

    def check(self) -> None:
        """Assert the bookkeeping invariants (tests call this after every scenario)."""
        nodes = [n for n in self.tree.nodes() if n is not self.tree.root]
        assert self.tree.tokens == sum(len(n.key) for n in nodes) and self.tree.size == len(nodes)
        assert self.n_boundaries == sum(1 for n in nodes if n.covered)
        assert self.slots.used == self.tree.tokens, (self.slots.used, self.tree.tokens)
        all_slots = np.concatenate([n.slots for n in nodes]) if nodes else np.zeros(0)
        assert len(np.unique(all_slots)) == len(all_slots), "a pool slot is used twice"
        for n in nodes:
            assert n.ref >= sum(c.ref for c in n.children.values())
            assert n.end == n.parent.end + len(n.key)
        if self.window is not None:
            kept = np.concatenate([n.sw[n.sw >= 0] for n in nodes]) if nodes else np.zeros(0)
            assert self.window_slots.used == len(kept), (self.window_slots.used, len(kept))
            assert len(np.unique(kept)) == len(kept), "a window slot is used twice"
            for n in nodes:
                assert ((n.sw >= 0) == (n.sw_ref > 0)).all(), n
        if self.snapshots:
            assert self.n_snapshots == sum(1 for n in nodes if n.snapshot is not None)
