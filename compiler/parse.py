"""Graph files -> GraphSpec: jinja2 rendering with the model config in scope, then YAML with line numbers.

Problems are collected as Diagnostics (file, line, node, hint) instead of raising at
the first one, so `graphc validate` can report all of them.
"""

from __future__ import annotations

import difflib
import os
import traceback
from pathlib import Path
from typing import Any

import jinja2
import yaml

from .decode_options import problems as decode_problems
from .errors import Diagnostic, GraphError, SourceLoc
from .ir import CachePolicySpec, GraphSpec, NodeSpec, freeze

GRAPHS_DIR = Path(__file__).resolve().parent.parent / "graphs"


class _LineDict(dict):
    line = 0
    key_lines: dict
    repeated: list  # (key, first line, repeated line)


class _LineList(list):
    line = 0


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader whose mappings and lists remember the (1-based) line they start on."""

    def construct_mapping(self, node, deep=False):
        value = _LineDict(super().construct_mapping(node, deep=True))
        value.line = node.start_mark.line + 1
        value.key_lines, value.repeated = {}, []
        for k, _ in node.value:
            key, line = self.construct_object(k, deep=True), k.start_mark.line + 1
            if key in value.key_lines:  # YAML keeps the last silently: a second `decode:` would hide the first
                value.repeated.append((key, value.key_lines[key], line))
            value.key_lines.setdefault(key, line)
        return value

    def construct_sequence(self, node, deep=False):
        value = _LineList(super().construct_sequence(node, deep=True))
        value.line = node.start_mark.line + 1
        return value


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)


def resolve_graph_path(graph: str | os.PathLike) -> Path:
    """A path, or the name of a built-in graph ('dense', 'sliding.yaml')."""
    p = Path(graph)
    if p.exists():
        return p
    for candidate in (GRAPHS_DIR / p.name, GRAPHS_DIR / f"{p.name}.yaml"):
        if candidate.exists():
            return candidate
    names = sorted(x.stem for x in GRAPHS_DIR.glob("*.yaml"))
    close = difflib.get_close_matches(p.stem, names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise FileNotFoundError(f"graph '{graph}' not found: not a file, and not a built-in graph "
                            f"({', '.join(names)}){hint}")


def render(text: str, file: str, context: dict[str, Any]) -> tuple[str | None, list[Diagnostic]]:
    """Render the jinja2 template; template errors become diagnostics with the template line."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        return env.from_string(text).render(**context), []
    except jinja2.TemplateSyntaxError as e:
        return None, [Diagnostic(SourceLoc(file, e.lineno or 0), f"template syntax error: {e.message}",
                                 hint="check the {% %} / {{ }} blocks on that line")]
    except jinja2.UndefinedError as e:
        line = 0
        for frame in traceback.extract_tb(e.__traceback__):
            if frame.filename == "<template>":
                line = frame.lineno
        hint = "the template reads a value the model config does not have; guard it with `{% if ... is defined %}`"
        if not context.get("config"):
            hint = "no model was given, so `config` is empty: pass --model DIR to render with its config.json"
        return None, [Diagnostic(SourceLoc(file, line), f"template error: {e.message}", hint=hint)]


def parse_text(text: str, file: str = "<memory>", config: dict | None = None) -> GraphSpec:
    """Render + parse a graph; raises GraphError with every diagnostic found."""
    spec, diags = parse_collect(text, file, config)
    if spec is None or any(d.severity == "error" for d in diags):
        raise GraphError(diags)
    return spec


def parse_collect(text: str, file: str, config: dict | None = None) -> tuple[GraphSpec | None, list[Diagnostic]]:
    """Like parse_text but returns (spec or None, diagnostics) without raising."""
    config = dict(config or {})
    context = {"config": config, "model_type": config.get("model_type", "")}
    rendered, diags = render(text, file, context)
    if rendered is None:
        return None, diags
    try:
        doc = yaml.load(rendered, Loader=_LineLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        msg = getattr(e, "problem", None) or str(e)
        return None, [Diagnostic(SourceLoc(file, line), f"YAML error: {msg}", hint="check indentation and colons")]
    if not isinstance(doc, dict):
        return None, [Diagnostic(SourceLoc(file, 1), "a graph file must be a YAML mapping",
                                 hint="start with `name:`, `cache:`, `nodes:` and `outputs:` keys")]
    return _build(doc, file, diags)


_TOP_KEYS = {"name", "description", "plugins", "inputs", "cache", "nodes", "outputs", "decode"}
_NODE_KEYS = {"id", "op", "inputs", "params"}


def _build(doc: _LineDict, file: str, diags: list[Diagnostic]) -> tuple[GraphSpec | None, list[Diagnostic]]:
    def loc(line):
        return SourceLoc(file, line)

    for key, first, again in doc.repeated:
        diags.append(Diagnostic(loc(again), f"top-level key '{key}' given twice (first at line {first})",
                                hint="YAML keeps only the last one: merge them into one"))
    for key in doc:
        if key not in _TOP_KEYS:
            diags.append(Diagnostic(loc(doc.key_lines.get(key, 0)), f"unknown top-level key '{key}'",
                                    hint=f"allowed keys: {', '.join(sorted(_TOP_KEYS))}"))

    name = str(doc.get("name") or Path(file).stem)
    inputs = doc.get("inputs", ["tokens"])
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        diags.append(Diagnostic(loc(doc.key_lines.get("inputs", 0)), "`inputs` must be a list of names"))
        inputs = ["tokens"]

    plugins = []
    raw_plugins = doc.get("plugins") or []
    if isinstance(raw_plugins, str):
        raw_plugins = [raw_plugins]
    if not isinstance(raw_plugins, list) or not all(isinstance(p, str) and p for p in raw_plugins):
        diags.append(Diagnostic(loc(doc.key_lines.get("plugins", 0)), "`plugins` must be a list of module names or .py paths",
                                hint="e.g. `plugins: [my_policy.py]` (relative to this file) or `plugins: [mypkg.policies]`"))
        raw_plugins = []
    first = getattr(raw_plugins, "line", doc.key_lines.get("plugins", 0))
    for i, entry in enumerate(raw_plugins):
        # Block lists start on the line after `plugins:`; flow lists sit on its line.
        line = first + i if first > doc.key_lines.get("plugins", 0) else first
        plugins.append((entry, line))

    cache = []
    raw_cache = doc.get("cache") or {}
    if not isinstance(raw_cache, dict):
        diags.append(Diagnostic(loc(doc.key_lines.get("cache", 0)), "`cache` must map a layer type to a policy",
                                hint="e.g. `cache: {full_attention: {policy: full}}`"))
        raw_cache = {}
    for layer_type, entry in raw_cache.items():
        line = raw_cache.key_lines.get(layer_type, 0) if isinstance(raw_cache, _LineDict) else 0
        if isinstance(entry, str):
            entry = {"policy": entry}
        if not isinstance(entry, dict) or "policy" not in entry:
            diags.append(Diagnostic(loc(line), f"cache entry for '{layer_type}' needs a `policy:`",
                                    hint=f"e.g. `{layer_type}: {{policy: full}}`"))
            continue
        params = {k: v for k, v in entry.items() if k != "policy"}
        if isinstance(entry.get("params"), dict):
            params = {**{k: v for k, v in params.items() if k != "params"}, **entry["params"]}
        cache.append(CachePolicySpec(str(layer_type), str(entry["policy"]), freeze(params), loc(line)))

    nodes = []
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list):
        diags.append(Diagnostic(loc(doc.key_lines.get("nodes", doc.line)), "`nodes` must be a list of nodes",
                                hint="e.g. `nodes: [{id: embed, op: embed, inputs: [tokens]}, ...]`"))
        raw_nodes = []
    for i, raw in enumerate(raw_nodes):
        line = getattr(raw, "line", getattr(raw_nodes, "line", 0))
        if not isinstance(raw, dict):
            diags.append(Diagnostic(loc(line), f"node #{i} must be a mapping with `id` and `op`"))
            continue
        node_id = str(raw.get("id") or f"#{i}")
        if "id" not in raw:
            diags.append(Diagnostic(loc(line), f"node #{i} has no `id`", hint="give every node a unique id"))
        if "op" not in raw:
            diags.append(Diagnostic(loc(line), "node has no `op`", node=node_id,
                                    hint="add `op:` with one of the op names (see docs/graph-format.md)"))
        for key in raw:
            if key not in _NODE_KEYS:
                diags.append(Diagnostic(loc(raw.key_lines.get(key, line)), f"unknown node key '{key}'", node=node_id,
                                        hint=f"allowed: {', '.join(sorted(_NODE_KEYS))}; op parameters go under `params:`"))
        ins = raw.get("inputs", [])
        if isinstance(ins, str):
            ins = [ins]
        if not isinstance(ins, list):
            diags.append(Diagnostic(loc(line), "`inputs` must be a list of node ids", node=node_id))
            ins = []
        params = raw.get("params") or {}
        if not isinstance(params, dict):
            diags.append(Diagnostic(loc(line), "`params` must be a mapping", node=node_id))
            params = {}
        nodes.append(NodeSpec(node_id, str(raw.get("op", "")), tuple(str(x) for x in ins), freeze(params), loc(line)))

    decode = doc.get("decode") or {}
    for problem in decode_problems(decode):
        diags.append(Diagnostic(loc(doc.key_lines.get("decode", 0)), problem,
                                hint="e.g. `decode: {compile: true}` (docs/graph-format.md)"))
    if not isinstance(decode, dict):
        decode = {}

    outputs = doc.get("outputs") or {}
    if not isinstance(outputs, dict):
        diags.append(Diagnostic(loc(doc.key_lines.get("outputs", 0)), "`outputs` must map output names to node ids",
                                hint="e.g. `outputs: {next_tokens: sample}`"))
        outputs = {}
    out_lines = outputs.key_lines if isinstance(outputs, _LineDict) else {}
    spec = GraphSpec(
        name=name,
        source=file,
        description=str(doc.get("description", "")),
        inputs=tuple(inputs),
        nodes=tuple(nodes),
        cache=tuple(cache),
        outputs=tuple((str(k), str(v)) for k, v in outputs.items()),
        output_lines=tuple((str(k), out_lines.get(k, 0)) for k in outputs),
        plugins=tuple(plugins),
        decode=freeze(dict(decode)),
        loc=SourceLoc(file, 1),
    )
    return spec, diags
