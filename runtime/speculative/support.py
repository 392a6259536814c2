"""Can this bound model speculate? Only when every layer's cache can drop rejected positions.

Full-attention KV (`full`, `pool_backed`: `FullKV` rows) trims per row. A windowed ring buffer
has already overwritten what a rejected position displaced, recurrent state (SSM / linear
attention) has folded the rejected tokens in, and mlx-lm's own (`native`) caches are one
request at a time with no per-row trim: for those models speculation is off, with this reason
in `graphc inspect`, the server log and the 400 a request asking for it gets.
"""

from __future__ import annotations


def rollback_problem(binding) -> str | None:
    """None when every layer's cache has `trim_rows`; else why speculation is off for this model."""
    if not binding.batched:
        return "the model runs one request at a time on mlx-lm's own caches (no per-row rollback)"
    for layer, pol in zip(binding.layers, binding.policies):
        cache = pol.new_cache()
        if not callable(getattr(cache, "trim_rows", None)):
            return (f"layer {layer.index} ({layer.kind}) uses cache policy '{pol.name}', which cannot remove "
                    "rejected draft positions (windowed ring buffers and recurrent state keep no undo)")
    return None
