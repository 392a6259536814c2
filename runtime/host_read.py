"""How the host reads a decode step's tokens without the next step's GPU work faulting on them.

MLX's CUDA allocator moves any buffer the host reads (`tolist`) into managed memory, and a freed
buffer goes back to its cache for the next array of its size class. A chained decode reads step
N's tokens while step N + 1 (queued on those tokens) runs, so the next lookup's index and every
later [B] int32 array of the step can sit in pages the host touched: the GPU faults and the page
migrates. Under ncu on the H200 the embedding lookup took 156-295 µs inside an 8B batch-64 step
against 3 µs alone.

The strategies (`ModelRunner(host_read=...)`; the Engine picks "pieces" on CUDA when the graph
says `decode: {host_read_pieces: true}`, else "tokens"):

  "tokens"  read the step's tokens themselves (the default)
  "pieces"  read 8-byte copies of them (two tokens each): MLX serves allocations of 8 bytes and
            less from its scalar pool, managed memory the GPU maps without migrating, so no page
            the GPU uses ever moves to the host. B/2 tiny copies and host reads per step.

Why "tokens" stays the default: under ncu "pieces" takes the lookup from 258 µs to 4.7 µs (8B,
batch 64), but through `Engine.generate` (7 paired repeats on the H200) it gained nothing resolvable
at 8B (tokens / pieces per-step median 0.974, spread 0.85-1.23; batch 1: 1.004) and lost at 1B
batch 64 (0.958), where the step is host-bound and the B/2 copies and reads are host work. ncu
serialises kernels and so times the fault at its worst; unprofiled, the chain hides most of it.

On the CPU backend there is no managed memory and "tokens" is always used.
"""

from __future__ import annotations

import mlx.core as mx

STRATEGIES = ("tokens", "pieces")


def for_host(tokens: mx.array, strategy: str) -> list[mx.array]:
    """The arrays the host will read for `tokens` [B] int32 (lazy; evaluate them with the step)."""
    if strategy == "tokens":
        return [tokens]
    n = tokens.shape[0]
    return [tokens[i:i + 2] + 0 for i in range(0, n, 2)]


def read(arrays: list[mx.array]) -> list[int]:
    """The tokens, in order, from `for_host`'s arrays."""
    if len(arrays) == 1:
        return arrays[0].tolist()
    out: list[int] = []
    for a in arrays:
        out.extend(a.tolist())
    return out
