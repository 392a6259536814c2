"""Implementations the contracts need, found through the graphc distribution's entry points.

The neutral contracts may not import the runtime (the runtime imports the compiler, which
imports the contracts), yet the compiler must find the built-in cache policies and sampling
kernels without being told. So the runtime declares them as entry points of the distribution
(pyproject.toml, `[project.entry-points."graphc.cache_policies"]` and `"graphc.sampling"`),
the way any plugin declares itself, and the contracts load a provider only when something
asks for it. No module here names a runtime module; the packaging metadata connects them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from types import ModuleType


@functools.cache
def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """name -> entry point, of every installed distribution, in `group`."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


def provider(group: str, name: str, what: str):
    """What entry point `name` of `group` names (its module imported on first use)."""
    ep = entry_points(group).get(name)
    if ep is None:
        raise ImportError(f"{what}: no entry point '{name}' in group '{group}' (is graphc installed completely? "
                          "`pip install -e .` writes its entry points)")
    try:
        return ep.load()
    except ImportError as e:
        raise ImportError(f"{what} is provided by '{ep.value}', which failed to import: {e} "
                          "(is graphc installed completely? `pip install -e .`)") from e


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


class Lazy:
    """A callable standing for the function a "module:attr" string names, imported on the first
    call (a CLI command: parsing flags needs none of what running the command imports)."""

    def __init__(self, spec: str, what: str):
        self.spec, self.what = spec, what

    def __call__(self, *args, **kwargs):
        return resolve(self.spec, self.what)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Lazy({self.spec!r})"
