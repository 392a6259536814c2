"""Implementations named by module string, imported on first use.

The neutral contracts may not import the runtime (that would be a cycle: the runtime
imports the compiler, which imports the contracts), yet the compiler must find the
built-in cache policies and sampling kernels without being told. So the contracts name
the modules that provide them, and import a provider only when something asks for it —
the way a Python entry point or a graph's `plugins:` entry names code.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def load(module: str, what: str) -> ModuleType:
    """Import `module`, which provides `what` (named in the error when the import fails)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} is provided by module '{module}', which failed to import: {e} "
                          "(is graphc installed completely? `pip install -e .`)") from e


def resolve(spec: str, what: str):
    """The object a "module:attr" string names, its module imported on first use (a command
    that needs an optional extra, or the whole engine, is named so and loaded only when run)."""
    module, _, attr = spec.partition(":")
    return getattr(load(module, what), attr)
