"""The compiler's front door: file -> spec -> validated -> bound -> plans and lowered steps."""

from __future__ import annotations

import os

import attrs

from .bind import Binding, bind, classify_model, default_graph_for
from .errors import GraphError
from .ir import GraphSpec
from .lower import LoweredStep, lower
from .parse import parse_collect, resolve_graph_path
from .plan import Plan
from .validate import validate


def load_spec(graph: str | os.PathLike, config: dict | None = None) -> GraphSpec:
    """Parse and validate a graph file; raises GraphError listing every problem."""
    path = resolve_graph_path(graph)
    spec, diags = parse_collect(path.read_text(), str(path), config)
    if spec is not None:
        diags += validate(spec)
    if spec is None or any(d.severity == "error" for d in diags):
        raise GraphError(diags)
    return spec


@attrs.define
class CompiledGraph:
    """A graph bound to a model, with one lowered step per batch kind."""

    spec: GraphSpec
    binding: Binding
    prefill: LoweredStep
    decode: LoweredStep

    def plan(self, kind: str) -> Plan:
        return {"prefill": self.prefill, "decode": self.decode}[kind].plan


def compile_graph(graph: str | os.PathLike | None, model, config: dict) -> CompiledGraph:
    """Pick (when None), parse, validate, bind and lower a graph for a loaded model."""
    if graph is None:
        graph = default_graph_for(classify_model(model, config))
    spec = load_spec(graph, config)
    binding = bind(spec, model, config)
    return CompiledGraph(spec, binding, lower(binding, "prefill"), lower(binding, "decode"))


__all__ = ["CompiledGraph", "GraphError", "compile_graph", "load_spec"]
