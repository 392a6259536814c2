"""Where graphc caches files (the demo model's tokenizer, converted GGUF models): one variable.

$GRAPHC_CACHE_DIR, else $XDG_CACHE_HOME/graphc, else ~/.cache/graphc. GRAPHC_CACHE, the name
the GGUF cache once read, is still accepted with a warning so that existing setups keep their
cache; GRAPHC_CACHE_DIR wins when both are set."""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("GRAPHC_CACHE_DIR")
    old = os.environ.get("GRAPHC_CACHE")
    if not base and old:
        # FutureWarning, not DeprecationWarning: Python shows it to end users by default.
        warnings.warn("GRAPHC_CACHE is deprecated; set GRAPHC_CACHE_DIR instead", FutureWarning, stacklevel=2)
        base = old
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "graphc"
