"""`pool_backed`: full-attention KV whose prompts and outputs are kept in the shared prefix pool.

Two places hold a pool-backed layer's KV, on purpose:

- the request's *working cache*, a plain `FullKV` (contiguous, rows left-padded), which is
  what prefill and decode read and write — so a decode step stays one slice-update per
  layer, and the compiled decode path (runtime/compiled_decode.py) applies unchanged;
- the shared *pool* (runtime/cache/pool.py): per layer K and V of shape
  (slots, kv_heads, head_dim), indexed by the radix tree over token ids
  (runtime/prefix_cache.py). It is the prefix store, not the decode buffer.

At admission the longest cached prefix is gathered from the pool into a fresh working
cache (one copy); only the suffix is computed. When the prompt is in, its new KV is
scattered into free slots; when the request ends, its decode KV follows. Decode never
touches the pool.
"""

from __future__ import annotations

from .base import CachePolicy
from .full import FullKV
from .prefix_state import PrefixKind, PrefixState
from .registry import register_policy


@register_policy("pool_backed")
class PoolBackedPolicy(CachePolicy):
    """Full-attention KV with prefix reuse through the shared slot pool and radix tree."""

    LAYER_KINDS = ("full_attention",)
    prefix_kind = PrefixKind.TOKENS  # every token's KV goes to a pool slot

    def new_cache(self) -> FullKV:
        return FullKV(1)

    # -- the prefix protocol (runtime/cache/prefix_state.py) -----------------------------
    def prefix_capture(self, cache: FullKV, row: int, start: int, end: int) -> PrefixState:
        return PrefixState(PrefixKind.TOKENS, start, end, cache.positions(row, start, end))

    def prefix_capture_rows(self, cache: FullKV, spans: list) -> tuple:
        return cache.positions_rows(spans)

    def prefix_restore(self, state: PrefixState) -> FullKV:
        return FullKV.restored(state.arrays)
