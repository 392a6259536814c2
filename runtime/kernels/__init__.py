"""CUDA kernels (`mx.fast.cuda_kernel`) for decode paths where MLX's own kernels are the limit.

Each module has the kernel, a `reference()` it must match, and a `check()` that compares
the two on random inputs in this process before the kernel is used (the compiled decode
path, runtime/compiled_decode.py, falls back to MLX on any mismatch or build failure).
"""

import hashlib


def source_tag(source: str) -> str:
    """A short hash of a kernel's source, part of its name.

    MLX's CUDA backend caches built kernels on disk (MLX_PTX_CACHE_DIR, default
    /tmp/mlx/<version>/ptx) under the kernel's name and template arguments only, so a
    changed source under an unchanged name would load the old build."""
    return hashlib.sha1(source.encode()).hexdigest()[:10]
