"""`ssm_state`: the recurrent state of linear-attention / SSM layers (qwen3_next GatedDeltaNet).

mlx-lm keeps this state in an `ArraysCache`: the layer reads and writes `cache[0]` (the
convolution's last kernel-1 inputs) and `cache[1]` (the recurrent state), reads
`cache.lengths` (per-row valid lengths, for right-padded batches), calls
`cache.advance(N)` (most do; bailing_moe_linear does not, so graphc's attention op also calls
`folded(N)` after every forward and the count is right either way), and the model builds its
mask with `create_ssm_mask` -> `cache.make_mask(N)`. `StateCache` is that protocol plus
graphc's batching.

Batching needs no padding here: every row's state is its own [1, ...] slice, whatever its
length, and graphc prefills one request at a time and decodes one token per row. So
`lengths` stays None and `make_mask` returns None (no masked positions); merge and
extract are concatenation and slicing along the batch axis.

Prefix reuse: the state after position p cannot be rebuilt from a later one, so the
prefix cache keeps *snapshots* (references to the state arrays — mx arrays are values,
and the layer replaces them rather than writing in place, so a snapshot costs no copy)
at chunk-aligned boundaries and at prompt / request ends. A hit resumes exactly at a
snapshot, or falls back to a shorter one (or to a full recompute): never a wrong state.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from .base import CachePolicy, LayerCache
from .prefix_state import PrefixKind, PrefixState
from .registry import register_policy


class StateCache(LayerCache, ArraysCache):
    # An ArraysCache too: model code checks `isinstance(cache, ArraysCache)` (mlx-lm's mamba
    # writes its new state back only then). Every method the runtime or a model uses is
    # defined here; ArraysCache is the type, not the behaviour.
    def __init__(self, size: int = 2, batch: int = 1):
        self.cache: list = [None] * size
        self.lengths = None  # never set: rows are never padded (see module docstring)
        self.left_padding = None
        self.tokens = [0] * batch  # tokens folded into each row's state (host ints)
        self._advanced = False  # the model called advance() in the forward being built

    # -- what the model sees (mlx-lm's ArraysCache protocol) -------------------------
    def __getitem__(self, i):
        return self.cache[i]

    def __setitem__(self, i, value):
        self.cache[i] = value

    def advance(self, N: int) -> None:
        self.tokens = [t + N for t in self.tokens]
        self._advanced = True

    def folded(self, N: int) -> None:
        """graphc, after every forward over N positions (compiler/ops/forward.py): counts them for
        models whose layers never call advance (mlx-lm's bailing_moe_linear); a model that did
        count them is left as it counted."""
        if not self._advanced:
            self.tokens = [t + N for t in self.tokens]
        self._advanced = False

    def make_mask(self, N: int, window_size=None, return_array: bool = False):
        return None

    @property
    def state(self):
        return self.cache

    def empty(self) -> bool:
        return self.cache[0] is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def offset(self):  # not read by state layers; uniform with the attention caches
        return self.tokens[0] if len(set(self.tokens)) == 1 else mx.array(self.tokens, dtype=mx.int32)

    def row_length(self, row: int) -> int:
        return self.tokens[row]

    @property
    def batch(self) -> int:
        return len(self.tokens)

    # -- batching ---------------------------------------------------------------
    def filter(self, rows: list[int]) -> None:
        idx = mx.array(rows, dtype=mx.int32)
        self.cache = [None if c is None else c[idx] for c in self.cache]
        self.tokens = [self.tokens[r] for r in rows]

    def extend(self, other: "StateCache") -> None:
        merged = []
        for a, b in zip(self.cache, other.cache):
            ref = a if a is not None else b
            if ref is None:
                merged.append(None)
                continue
            if a is None:
                a = mx.zeros((self.batch,) + ref.shape[1:], ref.dtype)
            if b is None:
                b = mx.zeros((other.batch,) + ref.shape[1:], ref.dtype)
            merged.append(mx.concatenate([a, b]))
        self.cache = merged
        self.tokens = self.tokens + other.tokens

    def extract(self, row: int) -> "StateCache":
        out = StateCache(len(self.cache), 1)
        out.cache = [None if c is None else c[row:row + 1] for c in self.cache]
        out.tokens = [self.tokens[row]]
        return out

    # -- prefix cache ------------------------------------------------------------
    def snapshot(self, row: int) -> tuple:
        """The state of `row` as it is now: the arrays themselves for a batch of one (no copy);
        a copy of the row otherwise (a row view would keep the whole batch's buffer alive)."""
        if self.batch == 1:
            return tuple(self.cache)
        return tuple(None if c is None else mx.array(c[row:row + 1]) for c in self.cache)

    @classmethod
    def restored(cls, snap: tuple, tokens: int) -> "StateCache":
        out = cls(len(snap), 1)
        out.cache = list(snap)
        out.tokens = [tokens]
        return out

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache if c is not None)


@register_policy("ssm_state")
class SSMStatePolicy(CachePolicy):
    """Constant-size recurrent state per request (linear-attention / SSM layers)."""

    LAYER_KINDS = ("linear_attention",)
    prefix_kind = PrefixKind.SNAPSHOT  # the prefix cache keeps state snapshots at boundaries

    def bytes_per_token(self) -> int:
        return 0

    def bytes_per_request(self, context: int) -> int:
        return self.layer.state_bytes

    def new_cache(self) -> StateCache:
        return StateCache(self.layer.state_size, 1)

    # -- the prefix protocol (runtime/cache/prefix_state.py) -----------------------------
    def prefix_capture(self, cache: StateCache, row: int, start: int, end: int) -> PrefixState:
        # The state folds every position in: only "after `end`" exists, and only while it is now.
        if end != cache.row_length(row):
            raise ValueError(f"a state snapshot exists only after the last position folded in "
                             f"({cache.row_length(row)}), not after {end}")
        return PrefixState(PrefixKind.SNAPSHOT, end, end, cache.snapshot(row))

    def prefix_restore(self, state: PrefixState) -> StateCache:
        return StateCache.restored(state.arrays, state.end)
