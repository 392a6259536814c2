"""`graphc inspect`: render a Plan as text (jinja2), JSON or graphviz dot."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import jinja2

from .compile import CompiledGraph
from .decode_options import COMPILED_ONLY
from .plan import Plan
from .trace import trace_ops

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
    keep_trailing_newline=True, trim_blocks=False, lstrip_blocks=False,
)


def layer_ranges(idxs) -> str:
    """0-5,8,10-11 (9): a group's layer indices, runs collapsed."""
    runs, out = [], []
    for i in idxs:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    for a, b in runs:
        out.append(str(a) if a == b else f"{a}-{b}")
    return f"{','.join(out)} ({len(idxs)})"


_TEMPLATES.filters["layer_ranges"] = layer_ranges
_TEMPLATES.globals["dict"] = dict
_TEMPLATES.globals["compiled_only"] = COMPILED_ONLY

MEMORY_CONTEXTS = (8192, 32768)


def memory_table(compiled: CompiledGraph) -> dict | None:
    """KV bytes per request at 8k and 32k context: as bound, and as if every attention layer were `full`.

    Sliding models also get their sliding layers alone, as bound (windowed: 2 x window in
    steady decode) and as full KV — the saving the windowed policy buys.
    """
    pols = compiled.binding.policies
    layers = compiled.binding.layers
    kinds = {l.kind for l in layers}
    if kinds == {"full_attention"}:
        return None
    sliding = [(l, p) for l, p in zip(layers, pols) if l.kind == "sliding_attention"]
    columns = ["as bound", "all full"] + (["sliding, bound", "sliding if full"] if sliding else [])
    rows = []
    for ctx in MEMORY_CONTEXTS:
        values = [sum(p.bytes_per_request(ctx) for p in pols), sum(l.kv_bytes_per_token * ctx for l in layers)]
        if sliding:
            values += [sum(p.bytes_per_request(ctx) for _, p in sliding),
                       sum(l.kv_bytes_per_token * ctx for l, _ in sliding)]
        rows.append({"context": ctx, "values": values})
    return {"columns": columns, "rows": rows}


def render_text(plan: Plan, memory: dict | None = None) -> str:
    return _TEMPLATES.get_template("plan.txt.j2").render(plan=plan, memory=memory)


def render_dot(plan: Plan, compiled: CompiledGraph) -> str:
    spec = compiled.spec
    kept = {s.node for s in plan.steps}  # the batch kind's pruned nodes are not drawn
    edges = [(src, n.id) for n in spec.nodes if n.id in kept for src in n.inputs]
    return _TEMPLATES.get_template("plan.dot.j2").render(plan=plan, inputs=spec.inputs, edges=edges)


def render_json(plan: Plan, memory: dict | None = None) -> str:
    d = plan.to_dict()
    d["format"] = "graphc.plan/1"
    if memory:
        d["kv_bytes_per_request"] = memory
    return json.dumps(d, indent=2)


def inspect_plan(compiled: CompiledGraph, kind: str, fmt: str = "text", trace: bool = True) -> str:
    plan = compiled.plan(kind)
    if trace:
        plan = attrs.evolve(plan, ops=tuple(trace_ops(compiled, kind)))
    memory = memory_table(compiled)
    if fmt == "json":
        return render_json(plan, memory)
    if fmt == "dot":
        return render_dot(plan, compiled)
    if fmt == "text":
        return render_text(plan, memory)
    raise ValueError(f"unknown format '{fmt}' (text, json, dot)")
