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

import mlx.core as mx

from .base import CachePolicy
from .full import MIN_CAPACITY, FullKV
from .registry import register_policy


@register_policy("pool_backed")
class PoolBackedPolicy(CachePolicy):
    """Full-attention KV with prefix reuse through the shared slot pool and radix tree."""

    LAYER_KINDS = ("full_attention",)
    prefix_role = "pool"  # every token's KV goes to a pool slot

    def new_cache(self) -> FullKV:
        return FullKV(1)

    # -- prefix cache hooks (arrays; called by runtime/prefix_io.py) ---------------
    @staticmethod
    def positions(cache: FullKV, row: int, start: int, end: int) -> tuple[mx.array, mx.array]:
        """KV of absolute positions start..end-1 of `row`: (keys [H, n, D], values)."""
        p = cache.left_pad[row]
        return cache.keys[row, :, p + start:p + end], cache.values[row, :, p + start:p + end]

    @staticmethod
    def restore(keys: mx.array, values: mx.array) -> FullKV:
        """A batch-of-one working cache holding a gathered prefix (keys [H, m, D])."""
        m = keys.shape[1]
        cap = MIN_CAPACITY
        while cap < m + 1:
            cap *= 2
        pad = [(0, 0), (0, 0), (0, cap - m), (0, 0)]
        cache = FullKV(1)
        cache.keys = mx.pad(keys[None], pad)
        cache.values = mx.pad(values[None], pad)
        cache.idx = m
        return cache
