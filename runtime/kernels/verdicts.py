"""The kernels' checks kept on disk per device, so that a restart of a server skips them.

Before a CUDA kernel serves, its `check()` builds it (NVRTC) and compares it with MLX on random
inputs at its CHECK_CASES, every variant the engine may pick. On a fresh H200 that was 155 s of a
1B model's 172 s `Engine.load` (top ranks 53 s, attention 74 s with its writing variant, skinny
matmul 27 s, by cProfile of the load). The answers depend only on
the device and its driver, MLX's version and the kernels' own code (runtime/kernels/ and the
token math they import, runtime/token_math/: tests/test_imports.py keeps them from importing
anything else), which is what a stored record is keyed by. Keyed on all of graphc's code, any
edit outside the kernels (a scheduler change) re-checked them on the next start; `$GRAPHC_CACHE_DIR/kernels/<key>.json` holds each kernel's
`stored_verdicts()` (runtime/kernels/__init__.py KernelOp), failures included: a kernel that
did not match here keeps not serving after a restart. GRAPHC_SELFCHECK=always checks at every
start and neither reads nor writes a record (as for the model self-check); deleting the
`kernels` folder forgets every record (e.g. after a check failed for a passing reason)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from importlib import metadata
from pathlib import Path

import mlx.core as mx

from graphc.compiler.cache_dir import cache_root
from graphc.compiler.selfcheck_cache import mode

from .registry import KERNELS

log = logging.getLogger("graphc.kernels")

SCHEMA = 1


# What a verdict depends on in graphc: every file under these folders of the package.
_KERNEL_CODE = ("runtime/kernels", "runtime/token_math")
_PACKAGE = Path(__file__).resolve().parents[2]


def source_digest() -> str:
    """A digest of the kernels' code: their Python, CUDA fragments and the token math they import."""
    h = hashlib.sha256()
    for sub in _KERNEL_CODE:
        for p in sorted((_PACKAGE / sub).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".cu", ".cuh", ".h"):
                h.update(str(p.relative_to(_PACKAGE)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def record_key() -> str:
    """sha256 over the device (MLX's device facts), MLX's version and the kernels' code digest."""
    parts = {"schema": SCHEMA, "device": str(mx.default_device()), "info": device_facts(), "driver": _driver(),
             "mlx": metadata.version("mlx") if _has("mlx") else "?", "graphc": source_digest(),
             "host": platform.machine()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


# device_info() keys that change while the device stays the same: the free memory at this
# instant (CUDA reports it), and which physical card of a model this is. Keyed on them, every
# start had a new key, so a restart checked again (71 s on an H200).
_VOLATILE = ("free", "used", "avail", "uuid", "pci")


def device_facts() -> dict:
    """MLX's device facts that a kernel's verdict depends on (name, architecture, memory size)."""
    try:
        info = mx.device_info()
    except Exception:  # noqa: BLE001 - an MLX without device_info: the device string alone
        return {}
    return {k: v for k, v in info.items() if not any(w in k.lower() for w in _VOLATILE)}


def _driver() -> str:
    """The NVIDIA kernel driver's version line where Linux shows it: a driver update re-checks
    (NVRTC and the driver build the kernels, so a verdict is only as good as both)."""
    try:
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return ""


def _has(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def record_path(key: str | None = None) -> Path:
    return cache_root() / "kernels" / f"{key or record_key()}.json"


def restore() -> bool:
    """Take a stored record's verdicts into every kernel; False when there is none to take (then
    the checks run, and `store()` keeps what they found)."""
    if mode() == "always":
        return False
    path = record_path()
    try:
        rec = json.loads(path.read_text())
        if rec.get("schema") != SCHEMA or set(rec["kernels"]) != set(KERNELS):
            raise ValueError("another schema or kernel set")
        for name, stored in rec["kernels"].items():
            KERNELS[name].restore_verdicts(stored)
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the stored kernel checks %s (%s): checking again", path, e)
        return False
    log.info("CUDA kernel checks: the verdicts stored for this device and code (%s)", path)
    return True


def store() -> None:
    """Keep what this process's checks found (written whole, then renamed: a reader never sees half)."""
    if mode() == "always":
        return
    path = record_path()
    rec = {"schema": SCHEMA, "kernels": {name: k.stored_verdicts() for name, k in KERNELS.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not store the kernel checks in %s (%s): the next start checks again", path, e)
