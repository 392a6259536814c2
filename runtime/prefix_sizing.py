"""How big a bound graph's prefix cache is (runtime/prefix_cache.py): pool slots from the device's
memory or an explicit token count, window slots for sliding layers, a snapshot count limit for
recurrent layers, and where boundaries sit (docs/cache-policies.md)."""

from __future__ import annotations

import mlx.core as mx

from graphc.contracts.policies import prefix_unsupported_reason

from .cache.pool import device_memory
from .cache.prefix_state import PrefixKind
from .prefix_cache import PrefixCache

DEFAULT_MEM_FRACTION = 0.25
# On the CPU the device memory is the machine's RAM, shared with everything else, and the pool
# grows with every new prompt until it is full: its default size is capped at this many bytes
# (mem_fraction / max_total_tokens set it explicitly). GPUs keep the mem_fraction default.
DEFAULT_CPU_POOL_BYTES = 1 << 30
# Recurrent-state snapshots every this many prompt tokens (besides message boundaries and the ends
# of prompts and requests). A snapshot costs the whole state of every recurrent layer (tens of MB
# on an 80B qwen3_next), so they are sparser than sliding windows' boundaries; message boundaries
# are what a growing chat reuses, the interval bounds what a long message without them recomputes.
DEFAULT_SNAPSHOT_INTERVAL = 4096


def for_binding(binding, *, mem_fraction: float | None = None, max_total_tokens: int | None = None,
                interval: int = 512, snapshot_interval: int | None = None) -> PrefixCache | None:
    """The prefix cache a bound graph supports, or None.

    Prefix reuse needs every layer's policy to take part (a `prefix_kind`, see
    runtime/cache/prefix_state.py) and at least one TOKENS layer; a graph that uses `full`
    (graphs/dense_noprefix.yaml) has none. Capacity: `max_total_tokens` pool slots if given,
    else what `mem_fraction` of the device's memory holds at the pools' bytes per token (the
    arrays grow on demand, so an unused budget costs nothing). `interval`: window boundaries of
    sliding layers; `snapshot_interval` (None: DEFAULT_SNAPSHOT_INTERVAL): recurrent snapshots.
    """
    pols = binding.policies
    if prefix_unsupported_reason(pols):
        return None
    kinds = [p.prefix_kind for p in pols]
    pool_bpt = sum(p.bytes_per_token() for p, k in zip(pols, kinds) if k is PrefixKind.TOKENS)
    win_bpt = sum(p.bytes_per_token() for p, k in zip(pols, kinds) if k is PrefixKind.TAIL)
    if max_total_tokens is None:
        frac = DEFAULT_MEM_FRACTION if mem_fraction is None else mem_fraction
        if not 0 < frac <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {frac}")
        budget = int(frac * device_memory())
        if mem_fraction is None and _on_cpu():
            budget = min(budget, DEFAULT_CPU_POOL_BYTES)
        max_total_tokens = budget // max(1, pool_bpt + win_bpt)
    if max_total_tokens < 1:
        raise ValueError(f"max_total_tokens must be >= 1, got {max_total_tokens}")
    tails = {p.prefix_tail() for p, k in zip(pols, kinds) if k is PrefixKind.TAIL}
    state_bytes = sum(p.bytes_per_request(0) for p, k in zip(pols, kinds) if k is PrefixKind.SNAPSHOT)
    snapshots = PrefixKind.SNAPSHOT in kinds
    # Snapshots may take about a quarter of the pool's bytes (and at least a few).
    max_snapshots = max(8, (max_total_tokens * pool_bpt // 4) // max(1, state_bytes)) if snapshots else 0
    window = tails.pop() if tails else None
    return PrefixCache(capacity=max_total_tokens, window=window,
                       window_capacity=max_total_tokens if window else 0,
                       snapshots=snapshots, max_snapshots=max_snapshots, interval=interval,
                       snapshot_interval=DEFAULT_SNAPSHOT_INTERVAL if snapshot_interval is None else snapshot_interval)


def pool_bytes_per_token(policies) -> int:
    """Bytes one pool slot costs over all layers (TOKENS and TAIL layers keep per-token rows)."""
    return sum(p.bytes_per_token() for p in policies if p.prefix_kind in (PrefixKind.TOKENS, PrefixKind.TAIL))


def _on_cpu() -> bool:
    return mx.default_device().type == mx.DeviceType.cpu
