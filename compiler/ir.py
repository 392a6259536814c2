"""The graph IR: small frozen attrs classes, built from YAML after jinja2 rendering.

A `GraphSpec` is what a graph file declares: nodes (each an op with inputs and
params), the cache policy each layer type gets, and the graph outputs. It holds
no model and no arrays; binding and lowering produce the `Plan` (see plan.py).
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import SourceLoc


def _freeze(value: Any) -> Any:
    """Make nested YAML values hashable so specs stay frozen and comparable."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


@attrs.frozen
class CachePolicySpec:
    """`layer_type: {policy: NAME, params...}` — the policy one kind of layer gets."""

    layer_type: str
    policy: str
    params: tuple = ()  # frozen (key, value) pairs
    loc: SourceLoc = SourceLoc("<memory>")

    @property
    def param_dict(self) -> dict:
        return dict(self.params)


@attrs.frozen
class NodeSpec:
    """One step of the graph: `op` applied to `inputs` (names of other nodes or graph inputs)."""

    id: str
    op: str
    inputs: tuple[str, ...] = ()
    params: tuple = ()
    loc: SourceLoc = SourceLoc("<memory>")

    @property
    def param_dict(self) -> dict:
        return dict(self.params)


@attrs.frozen
class GraphSpec:
    """A whole step graph as declared."""

    name: str
    source: str
    description: str = ""
    inputs: tuple[str, ...] = ("tokens",)
    nodes: tuple[NodeSpec, ...] = ()
    cache: tuple[CachePolicySpec, ...] = ()
    outputs: tuple = ()  # frozen (output name, node id) pairs
    output_lines: tuple = ()  # (output name, line) pairs, for diagnostics
    plugins: tuple = ()  # (module name or file path, line) pairs, imported before validation
    decode: tuple = ()  # frozen `decode:` options (compiler/decode_options.py)
    loc: SourceLoc = SourceLoc("<memory>")

    def node(self, node_id: str) -> NodeSpec:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def nodes_of(self, op: str) -> list[NodeSpec]:
        return [n for n in self.nodes if n.op == op]

    def policy_for(self, layer_type: str) -> CachePolicySpec | None:
        for c in self.cache:
            if c.layer_type == layer_type:
                return c
        return None

    @property
    def decode_options(self) -> dict:
        return dict(self.decode)

    @property
    def output_dict(self) -> dict[str, str]:
        return dict(self.outputs)


freeze = _freeze
