"""The Plan: the lowered program for one batch kind, as plain data.

`graphc inspect` prints it; lower.py turns it into a callable. Nothing here holds
arrays, so a plan can be dumped to JSON, diffed and compared across graphs.
"""

from __future__ import annotations

import attrs
import networkx as nx

from graphc.contracts.policies import prefix_unsupported_reason

from .bind import Binding
from .bound import bound_nodes
from .cachekinds import native_reasons
from .choice import Choice
from .decode_options import resolve
from .layer_groups import declared, decoder_node
from .ops import BATCH_KINDS, EDIT_KINDS, OPS
from .passes import ChoiceContext, run_decode_passes, run_prefill_passes
from .target import Requested, Target
from .validate import to_digraph


@attrs.frozen
class PlanStep:
    index: int
    node: str  # graph node id it came from
    op: str
    detail: str
    when: str = "always"  # always | final chunk | rows that ask


@attrs.frozen
class LayerPlan:
    index: int
    kind: str
    policy: str  # policy name
    policy_detail: str  # name(params)
    window: int | None
    sinks: bool
    bytes_per_token: int


@attrs.frozen
class GroupPlan:
    """One of the decoder's layer groups (compiler/layer_groups.py) with this model's layers in it."""

    name: str
    kinds: tuple  # the kinds the group declares
    required: bool
    layers: tuple  # layer indices of this model in the group (possibly none)
    kinds_present: tuple  # the kinds those layers have
    policies: tuple  # their policies, as described
    bytes_per_token: int  # KV bytes per token of context, all the group's layers
    state_bytes: int  # bytes of one request's recurrent state (linear_attention layers)

    @classmethod
    def from_dict(cls, d: dict) -> "GroupPlan":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


_CHECK_FIELDS = ("lowering", "ok", "max_abs_diff", "tolerance", "error", "batched", "mask_rank", "other_schedules")


@attrs.frozen
class Plan:
    graph: str
    source: str
    kind: str
    model_type: str
    steps: tuple[PlanStep, ...]
    layers: tuple[LayerPlan, ...]
    chain_safe: bool
    chain_notes: tuple[str, ...]
    outputs: tuple  # (name, node id) pairs
    ops: tuple = ()  # (primitive, count) pairs from tracing the lowered step, filled by inspect
    lowering: str = "generic"  # fast (split embed/layers/norm/head) | generic (the model's own forward)
    # one (lowering, ok, max_abs_diff, tolerance, error, batched, mask_rank, other_schedules) per check
    self_check: tuple = ()
    notes: tuple = ()  # what binding decided and why (fallbacks, prefix reuse off, multimodal wrapper)
    # What the runtime reads from the plan (runtime/plan_contract.py): None = the graph has no such node.
    edits: tuple | None = None  # edit kinds the logit_edits node applies
    logprobs_top_n: int | None = None  # the logprobs node's max_top_n
    prompt_logprobs_top_n: int | None = None  # the prompt_logprobs node's max_top_n
    sample_method: str | None = None  # the sample node's method
    passes: tuple = ()  # (pass, what it did) in the order applied: inspect prints them
    # How the step runs, chosen by the compiler's choice passes (compiler/passes/): the runtime
    # reads these and obeys; a measured choice lists the arms its gate picks among.
    choices: tuple = ()  # Choice, in pass order
    decode_options: tuple = ()  # (option, value): the graph's `decode:` under the engine's overrides
    target: str = ""  # the device facts the choices were made for (Target.describe)
    decode_sources: tuple = ()  # (option, "graph" | "engine" | "default"): where each decode option came from
    groups: tuple = ()  # GroupPlan per decoder layer group, in layer order
    groups_from: str = ""  # who declared the groups (the attention node, or one per `cache:` entry)

    def choice(self, name: str) -> Choice | None:
        return next((c for c in self.choices if c.name == name), None)

    def option(self, key: str):
        return dict(self.decode_options)[key]

    def to_dict(self) -> dict:
        d = attrs.asdict(self, recurse=True)
        d["steps"] = [attrs.asdict(s) for s in self.steps]
        d["layers"] = [attrs.asdict(l) for l in self.layers]
        d["chain_notes"] = list(self.chain_notes)
        d["outputs"] = dict(self.outputs)
        d["ops"] = dict(self.ops)
        d["self_check"] = [dict(zip(_CHECK_FIELDS, (*c[:-1], list(c[-1])))) for c in self.self_check]
        d["notes"] = list(self.notes)
        d["edits"] = list(self.edits) if self.edits is not None else None
        d["passes"] = [{"pass": a, "detail": b} for a, b in self.passes]
        d["choices"] = [c.to_dict() for c in self.choices]
        d["decode_options"] = dict(self.decode_options)
        d["decode_sources"] = dict(self.decode_sources)
        d["groups"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(g).items()}
                       for g in self.groups]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(
            graph=d["graph"], source=d["source"], kind=d["kind"], model_type=d["model_type"],
            steps=tuple(PlanStep(**s) for s in d["steps"]),
            layers=tuple(LayerPlan(**l) for l in d["layers"]),
            chain_safe=d["chain_safe"], chain_notes=tuple(d["chain_notes"]),
            outputs=tuple(d["outputs"].items()), ops=tuple(d.get("ops", {}).items()),
            lowering=d.get("lowering", "generic"),
            self_check=tuple((*(c.get(k, {"batched": True, "mask_rank": 4}.get(k)) for k in _CHECK_FIELDS[:-1]),
                              tuple(c.get("other_schedules", ()))) for c in d.get("self_check", [])),
            notes=tuple(d.get("notes", [])),
            edits=tuple(d["edits"]) if d.get("edits") is not None else None,
            logprobs_top_n=d.get("logprobs_top_n"), prompt_logprobs_top_n=d.get("prompt_logprobs_top_n"),
            sample_method=d.get("sample_method"),
            passes=tuple((p["pass"], p["detail"]) for p in d.get("passes", [])),
            choices=tuple(Choice.from_dict(c) for c in d.get("choices", [])),
            decode_options=tuple(d.get("decode_options", {}).items()), target=d.get("target", ""),
            decode_sources=tuple(d.get("decode_sources", {}).items()),
            groups=tuple(GroupPlan.from_dict(g) for g in d.get("groups", [])), groups_from=d.get("groups_from", ""),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(l.bytes_per_token for l in self.layers)


def topo_nodes(spec):
    """Graph nodes in dependency order (stable: file order among ready nodes)."""
    g = to_digraph(spec)
    order = {n.id: i for i, n in enumerate(spec.nodes)}
    ids = list(nx.lexicographical_topological_sort(g, key=lambda n: order.get(n, -1)))
    return [spec.node(i) for i in ids if i in order]


def _when(op, params, kind: str) -> str:
    phase = op.phase_for(params)
    if op.on_request:
        return "rows that ask"
    if phase != "forward" and kind == "prefill":
        return "final chunk"
    return "always"


def prune_for_kind(spec, kind: str) -> tuple[list, list[str]]:
    """Nodes the `kind` batch runs, in dependency order, and the ones it drops: nodes whose op
    does not run in this kind (prompt_logprobs in decode), then every node whose value then
    reaches no remaining graph output (dead-node elimination)."""
    order = topo_nodes(spec)
    runs = {n.id for n in order if n.op in OPS and kind in OPS[n.op].kinds}
    targets = [nid for _, nid in spec.outputs if nid in runs]
    live, stack = set(), list(targets)
    while stack:
        nid = stack.pop()
        if nid in live or nid not in runs:
            continue
        live.add(nid)
        stack.extend(i for i in spec.node(nid).inputs if i not in spec.inputs)
    return [n for n in order if n.id in live], [n.id for n in order if n.id not in live]


def binding_notes(binding: Binding) -> list[str]:
    notes = []
    if binding.wrapper_type:
        notes.append(f"multimodal wrapper '{binding.wrapper_type}': serving its text model "
                     f"'{binding.model_type}' (text-only)")
    if binding.lowering == "fast":
        notes.append(f"fast path: {type(binding.adapter).__name__} (embed / layers / norm / head split; "
                     "head on the last position only)")
    else:
        why = ("the fast path failed the self-check" if len(binding.checks) > 1 else
               "forced" if binding.adapter is not None else f"no fast path for '{binding.model_type}'")
        notes.append(f"generic lowering: the model's own forward ({why})")
    if binding.mask_rank == 5:
        notes.append("per-row masks of rank 5 ([B, 1, 1, N, T]): the model splits attention scores by KV group")
    natives = native_reasons(binding.layers)
    if natives:
        notes.append(f"one request at a time (max_batch 1) on mlx-lm's own cache: {natives[0]}")
    elif not binding.batched:
        notes.append("one request at a time (max_batch 1): the model's forward is exact on one row but not on "
                     "left-padded batches of rows at different positions")
    lossy = [p for p in binding.policies if getattr(p, "exact", True) is False]
    if lossy:  # opt-in rounding (quantized KV): say so, the outputs are not the model's bf16 ones
        notes.append(f"not exact: {len(lossy)} of {len(binding.policies)} layers keep KV as {lossy[0].describe()}; "
                     "outputs differ from unquantized KV (checked against mlx-lm's forward on the same codes: "
                     f"{type(lossy[0].reference_cache()).__name__}; docs/cache-policies.md)")
    reason = prefix_unsupported_reason(binding.policies)
    if reason:
        notes.append(f"prefix reuse off: {reason}")
    return notes


def build_plan(binding: Binding, kind: str, target: Target | None = None, requested: Requested | None = None) -> Plan:
    """The plan of one batch kind. The choice passes (compiler/passes/: decode's, and prefill's
    final chunk and its padding) run on `target` (the device's facts; None: unprobed, every kernel
    off) and `requested` (what the engine's options ask, over the graph's `decode:` section)."""
    if kind not in BATCH_KINDS:
        raise ValueError(f"unknown batch kind '{kind}' (known: {', '.join(BATCH_KINDS)})")
    spec = binding.spec
    nodes, dropped = prune_for_kind(spec, kind)
    bound = bound_nodes(spec, [n.id for n in nodes])
    steps = []
    for i, (node, op, _, _) in enumerate(bound):
        detail = op.describe(node, binding, kind) if op.describe else (op.doc or op.name)
        if op.module and not op.module.startswith("graphc."):
            detail += f"  (op from {op.module})"
        steps.append(PlanStep(i, node.id, node.op, detail, _when(op, node.params, kind)))
    by_op = {}
    for node, *_ in bound:
        by_op.setdefault(node.op, node.params)
    layers = tuple(
        LayerPlan(l.index, l.kind, pol.name, pol.describe(), l.window, l.sinks, pol.bytes_per_token())
        for l, pol in zip(binding.layers, binding.policies)
    )
    notes = []
    chain_safe = kind == "decode"
    if not any(name == "next_tokens" and nid not in dropped for name, nid in spec.outputs):
        chain_safe = False
        notes.append("no next_tokens output: this graph does not decode, so there is no chain")
    elif kind != "decode":
        notes.append("prefill batches are not chained: the next step needs the host to pick what runs")
    for pol in binding.policies:
        if not pol.chain_safe:
            chain_safe = False
            notes.append(f"policy '{pol.name}' needs host work between steps: the runner never chains this graph")
            break
    edits = tuple(by_op["logit_edits"]["edits"]) if "logit_edits" in by_op else None
    if edits:
        if "grammar" in edits:
            notes.append("rows with a grammar break the chain: their mask for step N+1 needs step N's token on the host")
        if "processors" in edits:
            notes.append("rows with custom logits processors break the chain: Python runs on their logits")
    if kind == "decode" and chain_safe:
        notes.insert(0, "chain-safe: step N+1 is built on step N's lazy tokens; penalty counts and "
                        "min_tokens counters update inside the step")
    passes = [("bind", f"{len(binding.layers)} layers -> "
                       + ", ".join(sorted({f"{l.kind}: {p.name}" for l, p in zip(binding.layers, binding.policies)}))),
              ("lowering", binding.lowering + (" (load-time self-check ok)" if binding.check is not None and
                                               getattr(binding.check, "ok", False) else ""))]
    if dropped:
        passes.append((f"prune for {kind}", "dropped " + ", ".join(dropped)
                       + " (their ops do not run in this batch kind, or their value reaches no output)"))
    phases = {}
    for node, _, _, ph in bound:
        phases.setdefault(ph, []).append(node.id)
    passes.append(("phase split", " | ".join(f"{ph}: {', '.join(ids)}" for ph, ids in phases.items())
                   or f"nothing runs in a {kind} batch (this graph's outputs come from other batch kinds)"))
    if kind == "prefill" and ("final" in phases or "head" in phases):
        passes.append(("head placement", "final/head ops run on a prompt's final chunk only; "
                                         "earlier chunks only fill the caches"))
    target, requested = target or Target(), requested or Requested()
    opts = resolve(spec.decode_options, requested.decode_overrides)
    sources = tuple((k, "engine" if requested.decode_overrides.get(k) is not None
                     else "graph" if k in spec.decode_options else "default") for k in sorted(opts))
    choices, choice_lines = (), []
    if kind == "prefill":
        choices = run_prefill_passes(binding, target, requested)
    else:
        ctx = ChoiceContext(binding, opts, target, requested, has_verify=any(n.op == "verify" for n in nodes))
        choices, choice_lines = run_decode_passes(ctx)
        if choice_lines and choice_lines[0][0] == "compile":
            passes.append(choice_lines.pop(0))
    if edits is not None:
        off = [e for e in EDIT_KINDS if e not in edits]
        passes.append(("edits", "applies " + (", ".join(edits) or "none")
                       + (f"; rejects requests asking for {', '.join(off)}" if off else "")))
    passes += choice_lines
    return Plan(
        graph=spec.name, source=spec.source, kind=kind, model_type=binding.model_type,
        steps=tuple(steps), layers=layers, chain_safe=chain_safe, chain_notes=tuple(notes),
        outputs=tuple((k, v) for k, v in spec.outputs if v not in dropped), lowering=binding.lowering,
        self_check=tuple((c.lowering, c.ok, c.max_abs_diff, c.tolerance, c.error, c.batched, c.mask_rank,
                          tuple(c.other_schedules))
                         for c in binding.checks),
        notes=tuple(binding_notes(binding)),
        edits=edits,
        logprobs_top_n=by_op["logprobs"]["max_top_n"] if "logprobs" in by_op else None,
        prompt_logprobs_top_n=by_op["prompt_logprobs"]["max_top_n"] if "prompt_logprobs" in by_op else None,
        sample_method=by_op["sample"]["method"] if "sample" in by_op else None,
        passes=tuple(passes),
        choices=tuple(choices), decode_options=tuple(sorted(opts.items())), target=target.describe,
        decode_sources=sources, groups=group_plans(binding), groups_from=_groups_from(spec),
    )


def group_plans(binding: Binding) -> tuple:
    pols = binding.policies
    return tuple(GroupPlan(g.name, g.kinds, g.required, g.layers, g.kinds_present, g.policies,
                           sum(pols[i].bytes_per_token() for i in g.layers),
                           sum(binding.layers[i].state_bytes for i in g.layers))
                 for g in binding.groups)


def _groups_from(spec) -> str:
    node = decoder_node(spec)
    if node is None:
        return ""
    if declared(spec):
        return f"declared by node '{node.id}', line {node.loc.line}"
    return f"one per `cache:` entry (node '{node.id}' declares no `layers:`)"
