"""The `graphc` command (`graphc = graphc.cli:main`): the composition root.

The one package allowed to import both the compiler and the runtime (`graphc inspect
--compile` builds an Engine, `graphc serve` / `bench` are the runtime's); the layering rule
is in contracts/__init__.py.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
