"""A cache policy authored outside graphc: full-attention KV stored as int8.

Each K and V vector (one token, one head) is kept as int8 codes plus one float32 scale
(absmax / 127), so a float32 model's KV takes (head_dim + 4) bytes per head and token
instead of 4 x head_dim — about 3.8x less at head_dim 64 — for a small rounding error.
The layer still gets float keys back (dequantized on fetch), so attention runs unchanged.

It is a small subclass of graphc's `FullKV` (which already does growth, left-padded
batching, filter / extend / extract over every plane in `PLANES`) plus a policy class
that also speaks the prefix protocol, so graphs using it get the radix prefix cache.
Use it from a graph with:

    plugins: [kv_int8_policy.py]
    cache:
      full_attention: {policy: kv_int8}

See docs/cache-policies.md for the walk-through.
"""

from __future__ import annotations

import mlx.core as mx

from graphc.runtime.cache import CachePolicy, PrefixKind, PrefixState, register_policy
from graphc.runtime.cache.full import FullKV


def quantize(x: mx.array) -> tuple[mx.array, mx.array]:
    """int8 codes and a float32 scale per vector along the last axis."""
    scale = mx.maximum(mx.abs(x).max(axis=-1, keepdims=True).astype(mx.float32), 1e-8) / 127
    return mx.round(x / scale).astype(mx.int8), scale


class Int8KV(FullKV):
    PLANES = ("keys", "values", "k_scale", "v_scale")

    def update_and_fetch(self, keys, values):
        kq, ks = quantize(keys)
        vq, vs = quantize(values)
        out = self.append({"keys": kq, "values": vq, "k_scale": ks, "v_scale": vs})
        dtype = keys.dtype
        return (out["keys"] * out["k_scale"]).astype(dtype), (out["values"] * out["v_scale"]).astype(dtype)


@register_policy("kv_int8")
class Int8Policy(CachePolicy):
    """Full-attention KV as int8 codes + a float32 scale per token and head."""

    LAYER_KINDS = ("full_attention",)
    # int8 rounding moves logits by about 1% of their range: the load-time self-check allows 3%.
    lossy_tolerance = 0.03

    def bytes_per_token(self) -> int:
        return 2 * self.layer.kv_heads * (self.layer.head_dim + 4)

    def new_cache(self) -> Int8KV:
        return Int8KV(1)

    # -- the prefix protocol: the prefix cache keeps every token's codes and scales -----------
    # (runtime/cache/prefix_state.py). TOKENS: the pool stores positions start..end-1 of a
    # row as they are here — int8 codes and float32 scales, 4 planes — so a hit restores
    # exactly the numbers a cold run would have computed, at the int8 pool footprint.
    prefix_kind = PrefixKind.TOKENS

    def prefix_capture(self, cache: Int8KV, row: int, start: int, end: int) -> PrefixState:
        return PrefixState(PrefixKind.TOKENS, start, end, cache.positions(row, start, end))

    def prefix_restore(self, state: PrefixState) -> Int8KV:
        return Int8KV.restored(state.arrays)
