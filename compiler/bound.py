"""Graph nodes bound to their registered ops: what the plan describes and the lowering runs.

Both build_plan (compiler/plan.py) and lower (compiler/lower.py) walk the same bound nodes;
they live here, below both, so that neither imports the other for them.
"""

from __future__ import annotations

from typing import Any

from .ops import OPS, BoundNode


def _thaw(v):
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
        return {k: _thaw(x) for k, x in v}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def bound_nodes(spec, node_ids) -> list[tuple[BoundNode, Any, tuple, str]]:
    """(node as its lowering sees it, OpDef, input ids, phase) for each id, in the given order."""
    readers: dict[str, list] = {}
    for n in spec.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)

    def always_all(n) -> bool:  # an every-position logits node some always-computed op reads
        return (n.op == "logits" and dict(n.params).get("positions") == "all"
                and any(r.op in OPS and not OPS[r.op].on_request for r in readers.get(n.id, [])))

    out = []
    for nid in node_ids:
        node = spec.node(nid)
        op = OPS[node.op]
        params = op.resolved({k: _thaw(v) for k, v in node.param_dict.items()})
        mine = readers.get(node.id, [])
        bound = BoundNode(node.id, node.op, params, tuple(r.op for r in mine), any(always_all(r) for r in mine))
        out.append((bound, op, node.inputs, op.phase_for(params)))
    return out
