"""The built-in demo model: what a graphc command runs when given no --model.

Preferred: the small trained llama shipped as package data in ``demo/``
(see docs/demo-model.md). Fallback: a random-weight llama built once and
cached under ~/.cache/graphc/, keyed by a hash of its config and the
package version, so every process agrees on one folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from graphc.compiler.cache_dir import cache_root

from .make import make_config, make_model
from .tokenizer import PACKAGE_DIR, corpus_hash

SHIPPED_DEMO_DIR = PACKAGE_DIR / "demo"

# Bump when the random demo's recipe changes in a way the config does not show.
_RECIPE_VERSION = 1
_RANDOM_DEMO = dict(arch="llama", seed=0, hidden_size=64, num_layers=2, vocab_size=1024)


def _shipped_demo_ok(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("model*.safetensors"))


def _graphc_version() -> str:
    try:
        return version("graphc")
    except Exception:
        return "0"


def random_demo_key() -> str:
    spec = dict(_RANDOM_DEMO)
    cfg = make_config(spec.pop("arch"), **{k: v for k, v in spec.items() if k != "seed"})
    blob = json.dumps(
        {
            "cfg": cfg,
            "seed": _RANDOM_DEMO["seed"],
            "recipe": _RECIPE_VERSION,
            "graphc": _graphc_version(),
            "corpus": corpus_hash(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def random_demo_path() -> Path:
    """Build (once) and return the cached random-weight llama demo model."""
    final = cache_root() / f"demo-llama-{random_demo_key()}"
    if _shipped_demo_ok(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build in a private temp dir, then rename into place: rename is atomic on
    # one filesystem, so a racing process either wins or finds ours complete.
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        spec = dict(_RANDOM_DEMO)
        make_model(spec.pop("arch"), tmp, **spec)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _shipped_demo_ok(final):  # lost the race to a broken dir?
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def demo_model_path() -> Path:
    """The model folder graphc uses when no --model is given."""
    if _shipped_demo_ok(SHIPPED_DEMO_DIR):
        return SHIPPED_DEMO_DIR
    return random_demo_path()
