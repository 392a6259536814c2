"""Diagnostics: every graph problem names the file, the line and the node, and says how to fix it."""

from __future__ import annotations

import difflib

import attrs


@attrs.frozen
class SourceLoc:
    """Where something was written: a graph file and a 1-based line (0 when unknown)."""

    file: str
    line: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@attrs.frozen
class Diagnostic:
    """One problem found in a graph. `hint` says how to fix it."""

    loc: SourceLoc
    message: str
    node: str | None = None
    hint: str | None = None
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        where = f"{self.loc}: {self.severity}"
        node = f" in node '{self.node}'" if self.node else ""
        text = f"{where}{node}: {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


class GraphError(ValueError):
    """A graph that cannot be parsed, validated or bound. Carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.severity == "error"]
        head = f"{len(errors)} problem(s) in step graph:\n" if len(errors) != 1 else ""
        super().__init__(head + "\n".join(str(d) for d in errors))


def did_you_mean(word: str, choices) -> str:
    """A hint naming the closest known choice, or listing them all."""
    choices = sorted(choices)
    close = difflib.get_close_matches(word, choices, n=1)
    if close:
        return f"did you mean '{close[0]}'? (known: {', '.join(choices)})"
    return f"known: {', '.join(choices)}"


class UnsupportedModel(ValueError):
    """A model graphc refuses to serve, raised at load/bind time (never on a request).

    The message names the model type, where (the layer, the cache), the reason, and what
    graphc would need to serve it."""
