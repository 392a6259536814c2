"""Graph plugins: Python the graph needs imported before it can be validated or bound.

A graph lists them under a top-level `plugins:` key:

    plugins:
      - my_policies.py            # a file, relative to the graph file (or absolute)
      - mypackage.kv_policies     # or an importable module name

Each is imported once per process (a file under a module name derived from its path, so
loading the same file twice does not register its policies twice). Importing is what
registers a user's cache policy (`@register_policy("name")`), so `graphc validate`,
`graphc inspect` and `Engine.load` all accept a graph that names it. A plugin that fails
to import is a diagnostic on the line that lists it, not a traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from .errors import Diagnostic, SourceLoc


def is_file_entry(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def load_plugin(entry: str, base: Path | None = None):
    """Import one plugin entry; returns the module. Raises on failure."""
    if not is_file_entry(entry):
        return importlib.import_module(entry)
    path = Path(entry)
    if not path.is_absolute() and base is not None:
        path = base / path
    path = path.resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = f"graphc_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_plugins(spec) -> list[Diagnostic]:
    """Import every plugin a GraphSpec lists; problems come back as diagnostics."""
    out = []
    base = Path(spec.source).parent if spec.source and not spec.source.startswith("<") else Path.cwd()
    for entry, line in spec.plugins:
        try:
            load_plugin(entry, base)
        except Exception as e:  # noqa: BLE001 - any import problem is the user's to see
            hint = ("a file path is relative to the graph file" if is_file_entry(entry)
                    else "a module name must be importable (installed, or on PYTHONPATH)")
            out.append(Diagnostic(SourceLoc(spec.source, line), f"plugin '{entry}' failed to load: "
                                  f"{type(e).__name__}: {e}", hint=hint))
    return out
