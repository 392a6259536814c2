"""What a cache policy hands the prefix cache, and what the prefix cache keeps of it.

Every policy speaks one prefix protocol (runtime/cache/base.py, `CachePolicy`):

    prefix_kind                              what the pool keeps for this layer (PrefixKind, or None)
    prefix_unsupported()                     why this policy cannot share prefixes (None when it can)
    prefix_tail()                            TAIL only: how many positions before a boundary are kept
    prefix_capture(cache, row, start, end)   -> PrefixState of positions start..end-1 of `row`
    prefix_capture_rows(cache, spans)        -> TOKENS, optional: several rows' planes at once
                                                (default: prefix_capture's, concatenated)
    prefix_restore(state)                    -> a fresh batch-of-one LayerCache holding `state`

The three kinds differ only in *which* positions the prefix cache asks for and where it
keeps them; the calls are the same, so runtime/prefix_io.py never looks at a policy's class:

- TOKENS: every position's rows (full attention: K and V, plus whatever else the cache
  stores per token, e.g. int8 scales). Captured for any start..end the tree lacks, kept in
  the shared pool one slot per token, restored as positions 0..m-1 of a hit of length m.
- TAIL: the last `prefix_tail()` positions before a boundary (sliding attention: the
  window). Captured at boundaries, kept in the window pool, restored as start..m-1.
- SNAPSHOT: the state after position `end` (recurrent / SSM layers). It cannot be sliced
  by position: captured at boundaries with start == end, kept as is, restored exactly there.
"""

from __future__ import annotations

import enum

import attrs
import mlx.core as mx


class PrefixKind(str, enum.Enum):
    TOKENS = "tokens"
    TAIL = "tail"
    SNAPSHOT = "snapshot"


@attrs.define
class PrefixState:
    """One layer's share of a prefix: positions start..end-1 of one request.

    `arrays` are per-token *planes* for TOKENS / TAIL — each shaped [heads, n, ...] with the
    token axis second (n == end - start) — and opaque for SNAPSHOT (the prefix cache only
    keeps references to them)."""

    kind: PrefixKind
    start: int
    end: int
    arrays: tuple

    def __attrs_post_init__(self):
        if self.kind is not PrefixKind.SNAPSHOT:
            n = self.end - self.start
            bad = [a.shape for a in self.arrays if a.shape[1] != n]
            if bad:
                raise ValueError(f"a {self.kind.value} prefix state of positions {self.start}..{self.end - 1} "
                                 f"needs planes with {n} tokens on axis 1, got shapes {bad}")

    @property
    def length(self) -> int:
        return self.end - self.start

    def rows(self, offsets) -> tuple:
        """The planes at these token offsets (0 = position `start`), for a pool write."""
        idx = mx.array(offsets, dtype=mx.int32)
        return tuple(a[:, idx] for a in self.arrays)
