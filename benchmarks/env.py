"""What the bench ran on: device, BLAS, platform, versions. Numbers mean nothing without it."""

from __future__ import annotations

import platform
import re
import sys
from importlib.metadata import version

import mlx.core as mx
import mlx_lm

from graphc.contracts import cpu_blas


def _loaded_libs(pattern: str) -> list[str]:
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return []
    names = {p.rsplit("/", 1)[-1] for p in re.findall(r"(/\S+\.so[\w.\-]*)", maps)}
    return sorted(n for n in names if re.search(pattern, n, re.I))


def environment() -> dict:
    try:
        mlx_lm_version = version("mlx-lm")
    except Exception:  # pragma: no cover - editable or vendored mlx-lm

        mlx_lm_version = getattr(mlx_lm, "__version__", "?")
    mx.eval(mx.ones((8, 8)) @ mx.ones((8, 8)))  # load the BLAS before looking for it
    dev = mx.default_device()
    backend = "cpu"
    if dev.type == mx.gpu:
        backend = "cuda" if mx.cuda.is_available() else ("metal" if mx.metal.is_available() else "gpu")
    try:
        info = dict(mx.device_info())
    except Exception:
        info = {}
    blas = _loaded_libs(r"blas|lapack|mkl|accelerate")
    if backend == "cpu" and cpu_blas.LOADED is not None:  # loaded ahead of the wheel's own, so MLX calls it
        blas_note = cpu_blas.NOTE
    elif backend == "cpu" and any("mlx_cpu.libs" in l or l.startswith("libblas-") for l in blas):
        blas_note = "mlx-cpu bundled reference BLAS (slow float32 matmul; see docs/demo-model.md)"
    elif backend == "cpu" and any("openblas" in l for l in blas):
        blas_note = "OpenBLAS"
    elif backend == "cuda":
        blas_note = "cuBLAS / MLX CUDA kernels"
    else:
        blas_note = ", ".join(blas) or "unknown"
    return {
        "device": str(dev),
        "backend": backend,
        "device_info": {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in info.items()},
        "blas": blas_note,
        "blas_libs": blas,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm_version,
    }


def describe(env: dict) -> str:
    name = env["device_info"].get("device_name") or env["processor"]
    return (f"device {env['device']} ({env['backend']}: {name}); BLAS: {env['blas']}; "
            f"mlx {env['mlx']}, mlx-lm {env['mlx_lm']}; {env['platform']}, Python {env['python']}")
