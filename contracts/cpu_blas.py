"""Which BLAS MLX's CPU backend calls on Linux: the system's OpenBLAS when there is one.

The `mlx[cpu]` wheel for Linux links the reference BLAS it bundles (netlib's, mlx_cpu.libs/
libblas-*.so), and MLX runs every float32 matmul of the CPU backend through its `cblas_sgemm`:
~6 GFLOP/s on this project's 2-core x86 machine, where OpenBLAS does ~120-170 per core. MLX
resolves `cblas_sgemm` when `mlx.core` is loaded, and a library loaded before it with
RTLD_GLOBAL comes first in that lookup, so graphc.contracts loads the system's OpenBLAS
(`apt install libopenblas0`) first thing, before anything imports mlx.core. On the small-32k
shape (float32, 8 prompts of 384 tokens, `python -m graphc.benchmarks.cpu_prefill`) a cold
prefill took 0.52 s instead of 2.88 s; docs/performance.md.

One thread a call: graphc's CPU prefill lanes already run two forwards side by side
(runtime/cpu_lanes.py), and OpenBLAS's own threads on top of them oversubscribed the cores (that
bench: 1.05x BatchGenerator with them, 1.54x without). OpenBLAS sizes its thread pool from
`OPENBLAS_NUM_THREADS` once, when the library loads, so graphc sets the variable to 1 for that
load and then removes it again: the rest of the process, numpy's own OpenBLAS
(libscipy_openblas64_, loaded later) and child processes included, sees the environment the user
gave it. A value the user set is used for the load and kept.

Whether numpy's threads cost the prefill was measured twice. One run each suggested they did
(1.01-1.05x against 1.52-1.60x); alternated runs on a later day (`python -m
graphc.benchmarks.cpu_prefill --model small-32k --dtype float32 --n 8 --len 384 --pairs 2`; numpy
loaded after graphc with two threads against one) did not: medians 1.15-1.57x against 1.04-1.72x
over eight runs each, 1.03-1.52x against 1.04-1.56x over five more
(benchmarks/results/cpu-prefill-numpy-threads.txt; this shared machine swings that much in both
arms). numpy runs no matmul on the prefill path, so graphc leaves numpy's threads alone.

`GRAPHC_BLAS=mlx` keeps the wheel's BLAS; `GRAPHC_BLAS=/path/libX.so` loads that library
instead. Quantized and float16/bfloat16 matmuls are MLX's own CPU kernels and do not change;
macOS (Accelerate) and the GPU backends are left alone. A process that imported mlx.core before
graphc keeps the BLAS it got (`NOTE` says so).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# Where Debian/Ubuntu (libopenblas0), Fedora and Arch put it; ldconfig's cache is asked after.
KNOWN_PATHS = ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
               "/usr/lib64/libopenblas.so.0", "/usr/lib/libopenblas.so.0")
NOTE = "not chosen yet"  # what preload() did, for logs and the bench's environment line
LOADED: str | None = None  # the library preload() put before MLX's own, when it did


def choose(environ, platform: str, exists=os.path.exists, find=ctypes.util.find_library) -> tuple[str | None, str]:
    """(library to preload or None, why): pure, so every branch is testable without loading one."""
    choice = environ.get("GRAPHC_BLAS", "auto")
    if choice == "mlx":
        return None, "GRAPHC_BLAS=mlx: the mlx wheel's own BLAS"
    if not platform.startswith("linux"):
        return None, "not Linux: MLX's own BLAS"
    if choice != "auto":
        return choice, f"GRAPHC_BLAS={choice}"
    for path in KNOWN_PATHS:
        if exists(path):
            return path, "OpenBLAS"
    name = find("openblas")
    if name:
        return name, "OpenBLAS"
    return None, ("no OpenBLAS found: the mlx-cpu wheel's reference BLAS, ~20x slower float32 matmuls on "
                  "the CPU (`apt install libopenblas0` and graphc uses it)")


def preload(environ=os.environ) -> str:
    """Load the chosen BLAS with RTLD_GLOBAL before mlx.core is imported; what happened (`NOTE`)."""
    global NOTE, LOADED
    if "mlx.core" in sys.modules:
        NOTE = "mlx.core was imported before graphc: the BLAS it loaded is kept"
        return NOTE
    lib, why = choose(environ, sys.platform)
    if lib is None:
        NOTE = why
        return NOTE
    user_set = "OPENBLAS_NUM_THREADS" in environ
    threads = environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)  # OpenBLAS reads the variable here, once
    except OSError as e:
        NOTE = f"{why} {lib} could not be loaded ({e}): the mlx wheel's own BLAS"
        return NOTE
    finally:
        if not user_set:  # numpy's OpenBLAS and child processes get the user's environment
            environ.pop("OPENBLAS_NUM_THREADS", None)
    NOTE = f"{why} ({lib}, {threads} thread(s) a call)"
    LOADED = lib
    return NOTE
