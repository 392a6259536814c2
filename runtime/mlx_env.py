"""Defaults for MLX's own environment variables that serving needs, set before MLX reads them.

MLX's CUDA backend keeps the cuDNN attention plans it builds in an LRU keyed by the exact query,
key, value (and mask) shapes and strides, 256 plans by default (`MLX_CUDA_SDPA_CACHE_SIZE`). A
serving engine meets many more: every prompt's last chunk has its own length, and the KV buffer's
capacity (part of the strides) grows while rows decode. A plan costs tens of milliseconds to
build, inside the step of every running stream, so an evicted plan is paid again and again.
MLX reads the variable once, when the cache is first used, so this runs when graphc.runtime is
imported; a value the user set is kept.
"""

from __future__ import annotations

import os

DEFAULTS = {"MLX_CUDA_SDPA_CACHE_SIZE": "2048"}


def apply_defaults(environ=os.environ) -> dict[str, str]:
    """Set each default the environment does not already set; returns the ones set here."""
    applied = {k: v for k, v in DEFAULTS.items() if k not in environ}
    environ.update(applied)
    return applied
