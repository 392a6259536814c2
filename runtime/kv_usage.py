"""KV bytes the decode batch allocates against the bytes its live tokens need.

Decode rows are contiguous `[B, H, T, ...]` arrays (runtime/cache/full.py): every row is as
long as the longest, left-padded, and capacity grows by doubling; so one long request among
short ones makes every row pay for its length. `/metrics` shows both figures and their ratio
(docs/server.md); benchmarks/kv_capacity.py measures it under a mixed-length mix.

Live bytes are computed from the cache arrays themselves: per layer, bytes of one column of one
row (the arrays' bytes over rows x capacity) times the columns that hold a row's own tokens.
"""

from __future__ import annotations


def _column_bytes(cache) -> float:
    planes = [getattr(cache, n) for n in getattr(cache, "PLANES", ("keys", "values"))]
    planes = [p for p in planes if p is not None]
    if not planes:
        return 0.0
    B, cap = planes[0].shape[0], planes[0].shape[2]
    return sum(p.nbytes for p in planes) / (B * cap) if B and cap else 0.0


def live_bytes(cache) -> int:
    """Bytes of `cache` (one layer of the decode batch) that hold its rows' own tokens."""
    parts = getattr(cache, "caches", None)
    if parts is not None and not hasattr(cache, "keys"):  # a list of caches (runtime/cache/cache_list.py)
        return sum(live_bytes(c) for c in parts)
    own = getattr(cache, "live_bytes", None)
    if own is not None:  # a cache that knows (runtime/cache/paged.py: its rows' tokens in pages)
        return int(own())
    if getattr(cache, "keys", None) is None:
        return int(cache.nbytes)  # constant-size state (SSM) or nothing yet: all of it is live
    idx = cache.idx
    if hasattr(cache, "left_pad"):  # FullKV: a row's tokens are the columns after its padding
        cols = sum(idx - p for p in cache.left_pad)
    elif hasattr(cache, "lo"):  # WindowedKV: a row's data starts at its first filled column
        cols = sum(idx - lo for lo in cache.lo)
    else:
        return int(cache.nbytes)
    return int(_column_bytes(cache) * cols)


def usage(caches) -> dict:
    """{"allocated": bytes the decode batch's caches hold, "live": bytes its tokens need}."""
    if not caches:
        return {"allocated": 0, "live": 0}
    return {"allocated": sum(int(c.nbytes) for c in caches), "live": sum(live_bytes(c) for c in caches)}
