"""Validation: one pass over a networkx DiGraph of the spec, collecting every problem.

Checks, each a small function so `graphc validate` can name the check that fired:
structure (ids, ops, params), edges (dangling inputs, types, cycles), required
ops, outputs, cache policies. Binding (bind.py) adds the model-dependent checks.
"""

from __future__ import annotations

import difflib

import networkx as nx

from graphc.contracts.policies import get_policy, policy_names

from .errors import Diagnostic, SourceLoc, did_you_mean
from .ir import GraphSpec
from .layer_groups import LAYER_TYPES
from .ops import OPS, PRIMARY_OUTPUTS, REQUIRED_OPS, RUNTIME_OUTPUTS
from .plugins import load_plugins


def to_digraph(spec: GraphSpec) -> nx.DiGraph:
    """Nodes are node ids plus graph inputs; an edge a -> b means b reads a."""
    g = nx.DiGraph()
    for name in spec.inputs:
        g.add_node(name, op="input", spec=None)
    for node in spec.nodes:
        g.add_node(node.id, op=node.op, spec=node)
    for node in spec.nodes:
        for src in node.inputs:
            if src in g:
                g.add_edge(src, node.id)
    return g


def check_ids(spec: GraphSpec) -> list[Diagnostic]:
    seen, out = {}, []
    for node in spec.nodes:
        if node.id in seen:
            out.append(Diagnostic(node.loc, f"duplicate node id (first defined at line {seen[node.id].line})",
                                  node=node.id, hint="node ids must be unique"))
        elif node.id in spec.inputs:
            out.append(Diagnostic(node.loc, "node id shadows a graph input", node=node.id,
                                  hint="rename the node"))
        else:
            seen[node.id] = node.loc
    return out


def check_ops_and_params(spec: GraphSpec) -> list[Diagnostic]:
    out = []
    for node in spec.nodes:
        op = OPS.get(node.op)
        if op is None:
            if node.op:
                out.append(Diagnostic(node.loc, f"unknown op '{node.op}'", node=node.id,
                                      hint=did_you_mean(node.op, OPS)))
            continue
        for key, value in node.param_dict.items():
            p = op.params.get(key)
            if p is None:
                hint = did_you_mean(key, op.params) if op.params else f"op '{op.name}' takes no params"
                out.append(Diagnostic(node.loc, f"unknown param '{key}' for op '{op.name}'", node=node.id, hint=hint))
                continue
            if isinstance(value, tuple) and p.type in ((list, tuple), list, tuple):
                value = list(value)
            if isinstance(value, int) and not isinstance(value, bool) and p.type is float:
                value = float(value)
            if not isinstance(value, p.type) or isinstance(value, bool) and p.type is int:
                tname = p.type_name if p.type != (list, tuple) else "list"
                out.append(Diagnostic(node.loc, f"param '{key}' must be a {tname}, got {value!r}", node=node.id))
                continue
            if p.choices and value not in p.choices:
                out.append(Diagnostic(node.loc, f"param '{key}' is {value!r}", node=node.id,
                                      hint=f"allowed: {', '.join(map(str, p.choices))}"))
            problem = p.check(value) if p.check else None
            if problem:
                out.append(Diagnostic(node.loc, f"param '{key}' {problem}", node=node.id))
    return out


def check_edges(spec: GraphSpec, g: nx.DiGraph) -> list[Diagnostic]:
    out = []
    known = set(g.nodes)
    produced = {name: "tokens" for name in spec.inputs}
    produced.update({n.id: OPS[n.op].output for n in spec.nodes if n.op in OPS})
    for node in spec.nodes:
        for src in node.inputs:
            if src not in known:
                out.append(Diagnostic(node.loc, f"input '{src}' names no node or graph input", node=node.id,
                                      hint=did_you_mean(src, known)))
        op = OPS.get(node.op)
        if op is None:
            continue
        if len(node.inputs) != len(op.inputs):
            out.append(Diagnostic(node.loc, f"op '{op.name}' takes {len(op.inputs)} input(s) "
                                  f"({', '.join(op.inputs)}), got {len(node.inputs)}", node=node.id))
            continue
        for src, want in zip(node.inputs, op.inputs):
            have = produced.get(src)
            if have is not None and have != want:
                out.append(Diagnostic(node.loc, f"input '{src}' produces {have}, but op '{op.name}' expects {want} here",
                                      node=node.id, hint=f"feed it from a node that produces {want}"))
    try:
        cycle = nx.find_cycle(g)
        ids = [a for a, _ in cycle]
        first = spec.node(ids[0])
        out.append(Diagnostic(first.loc, f"cycle: {' -> '.join(ids + [ids[0]])}", node=first.id,
                              hint="a step graph must be acyclic; a value cannot depend on itself within one step"))
    except nx.NetworkXNoCycle:
        pass
    return out


def check_required(spec: GraphSpec) -> list[Diagnostic]:
    out = []

    ops = {n.op for n in spec.nodes}
    unknown = [op for op in ops if op not in OPS]
    for req in REQUIRED_OPS:
        # A misspelt op ('atention') is already reported as unknown; don't report it missing too.
        if req not in ops and not difflib.get_close_matches(req, unknown, n=1):
            out.append(Diagnostic(spec.loc, f"missing a required '{req}' node",
                                  hint=f"every step graph needs: {', '.join(REQUIRED_OPS)}"))
    # The forward runs once per step: a second embed / attention node would write the caches twice.
    for op in REQUIRED_OPS:
        nodes = spec.nodes_of(op)
        if len(nodes) > 1:
            out.append(Diagnostic(nodes[1].loc, f"more than one '{op}' node", node=nodes[1].id,
                                  hint=f"a step graph runs the model once: keep one '{op}' node"))
    # Graph-level rules an op declares about its neighbours (e.g. prompt_logprobs needs
    # every position's logits).
    for node in spec.nodes:
        op = OPS.get(node.op)
        if op is not None and op.check is not None:
            for problem in op.check(node, spec):
                out.append(Diagnostic(node.loc, problem, node=node.id))
    return out


def check_outputs(spec: GraphSpec, g: nx.DiGraph) -> list[Diagnostic]:
    out = []
    lines = dict(spec.output_lines)
    outputs = spec.output_dict
    if not any(name in outputs for name in PRIMARY_OUTPUTS):
        out.append(Diagnostic(spec.loc, "missing output: a step graph needs one of "
                              + ", ".join(f"'{n}'" for n in PRIMARY_OUTPUTS),
                              hint="generation graphs: `outputs: {next_tokens: <your sample node>}`; "
                                   "see graphs/embed.yaml and graphs/score.yaml for the others"))
    for name, node_id in outputs.items():
        loc = SourceLoc(spec.source, lines.get(name, 0))
        if node_id not in g:
            out.append(Diagnostic(loc, f"output '{name}' names unknown node '{node_id}'",
                                  hint=did_you_mean(node_id, [n.id for n in spec.nodes])))
            continue
        want = RUNTIME_OUTPUTS.get(name)
        op = OPS.get(g.nodes[node_id]["op"])
        got = op.output if op is not None else ("tokens" if node_id in spec.inputs else None)
        if want and got and got != want:
            out.append(Diagnostic(loc, f"output '{name}' must carry {want}, but node '{node_id}' "
                                  f"({g.nodes[node_id]['op']}) produces {got}", node=node_id,
                                  hint=f"name a node whose op produces {want}"))
    # Nodes whose value reaches no output are dead: almost always a wiring mistake.
    targets = {v for v in outputs.values() if v in g}
    live = set(targets)
    for t in targets:
        live |= nx.ancestors(g, t)
    for node in spec.nodes:
        if node.id not in live and targets:
            out.append(Diagnostic(node.loc, "node reaches no graph output", node=node.id, severity="warning",
                                  hint="wire it into an output or delete it"))
    return out


def check_cache(spec: GraphSpec) -> list[Diagnostic]:
    out = []
    if not spec.cache:
        out.append(Diagnostic(spec.loc, "no `cache:` section: attention layers have no policy",
                              hint="e.g. `cache: {full_attention: {policy: full}}`"))
    for c in spec.cache:
        if c.layer_type not in LAYER_TYPES:
            out.append(Diagnostic(c.loc, f"unknown layer type '{c.layer_type}'", hint=did_you_mean(c.layer_type, LAYER_TYPES)))
        try:
            cls = get_policy(c.policy)
        except KeyError:
            out.append(Diagnostic(c.loc, f"unknown cache policy '{c.policy}' for {c.layer_type}",
                                  hint=did_you_mean(c.policy, policy_names())))
            continue
        for problem in cls.check_params(c.param_dict):
            out.append(Diagnostic(c.loc, f"cache policy '{c.policy}': {problem}"))
    return out


def check_plugins(spec: GraphSpec) -> list[Diagnostic]:
    """Import the graph's plugins first: they register the policies check_cache looks up."""
    return load_plugins(spec)


CHECKS = (check_plugins, check_ids, check_ops_and_params, check_required, check_cache)


def validate(spec: GraphSpec) -> list[Diagnostic]:
    """Every problem the spec has on its own (no model). Errors and warnings, in file order."""
    g = to_digraph(spec)
    diags = []
    for check in CHECKS:
        diags += check(spec)
    diags += check_edges(spec, g)
    diags += check_outputs(spec, g)
    return sorted(diags, key=lambda d: (d.loc.file, d.loc.line))
