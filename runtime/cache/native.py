"""`native`: a layer keeps mlx-lm's own cache object (one request at a time).

For caches graphc has no batched equivalent of — ChunkedKVCache (llama4's chunked
attention), QuantizedKVCache, RotatingKVCache with `keep`, a model's private cache class —
the layer gets a fresh copy of exactly the cache mlx-lm's `make_cache` gives it, so the
model's own forward runs on its own cache and is exact by construction. What it cannot
do is join other requests' rows or share prefixes: binding serves such a model with
max_batch 1 and no prefix reuse (compiler/compile.py, `graphc inspect` says so).
"""

from __future__ import annotations

import copy

from .base import CachePolicy
from .registry import register_policy


@register_policy("native")
class NativePolicy(CachePolicy):
    """mlx-lm's own cache for the layer (batch of one; no batching, no prefix reuse)."""

    LAYER_KINDS = ("native",)
    batchable = False

    def bytes_per_token(self) -> int:
        return 0  # unknown layout; graphc's KV budget does not count it

    def describe(self) -> str:
        return f"{self.name}({self.layer.cache_type})"

    def prefix_unsupported(self) -> str:
        return (f"policy '{self.name}' runs mlx-lm's own {self.layer.cache_type}, which graphc cannot "
                "capture or restore a prefix of")

    def new_cache(self):
        # The prototype is an empty cache straight from make_prompt_cache: copying it is cheap.
        return copy.deepcopy(self.layer.native)
