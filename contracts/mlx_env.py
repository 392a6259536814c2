"""MLX environment defaults that must be in place before `mlx.core` is imported.

MLX's CUDA backend keeps the cuDNN attention plans it builds in an LRU per thread, keyed by the
exact query, key, value (and mask) shapes and strides, 256 plans by default
(`MLX_CUDA_SDPA_CACHE_SIZE`). A serving engine meets many more: every aligned prompt-chunk shape
up to 4,096 tokens of context is 392 of them, the batched prefills' shapes more, and the KV
buffer's capacity (part of the strides) grows while rows decode. A plan costs ~40 ms to build,
inside the step of every running stream, so an evicted plan is paid again and again (a GPU
warm-up builds 300-500 of them: in a process whose cache held 256, the first ones built, the most
frequent, were gone before traffic came; benchmarks/probes/first_use.py).

MLX sizes the importing thread's LRU when `mlx.core` is imported (a later change of the variable
reaches only threads that start using MLX afterwards), so graphc.contracts sets it first thing:
every graphc package imports graphc.contracts before MLX. A value the user set is kept; an
application that imports mlx before graphc sets it itself.
"""

from __future__ import annotations

import os

DEFAULTS = {"MLX_CUDA_SDPA_CACHE_SIZE": "2048"}


def set_defaults(environ=os.environ) -> dict[str, str]:
    """Set each default `environ` does not already set; returns the ones set here."""
    applied = {k: v for k, v in DEFAULTS.items() if k not in environ}
    environ.update(applied)
    return applied
