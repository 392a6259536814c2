"""The Plan: the lowered program for one batch kind, as plain data.

`graphc inspect` prints it; lower.py turns it into a callable. Nothing here holds
arrays, so a plan can be dumped to JSON, diffed and compared across graphs.
"""

from __future__ import annotations

import attrs

from .bind import Binding
from .ops import OPS

BATCH_KINDS = ("prefill", "decode")


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


_CHECK_FIELDS = ("lowering", "ok", "max_abs_diff", "tolerance", "error", "batched", "mask_rank")


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
    self_check: tuple = ()  # one (lowering, ok, max_abs_diff, tolerance, error, batched, mask_rank) per check
    notes: tuple = ()  # what binding decided and why (fallbacks, prefix reuse off, multimodal wrapper)

    def to_dict(self) -> dict:
        d = attrs.asdict(self, recurse=True)
        d["steps"] = [attrs.asdict(s) for s in self.steps]
        d["layers"] = [attrs.asdict(l) for l in self.layers]
        d["chain_notes"] = list(self.chain_notes)
        d["outputs"] = dict(self.outputs)
        d["ops"] = dict(self.ops)
        d["self_check"] = [dict(zip(_CHECK_FIELDS, c)) for c in self.self_check]
        d["notes"] = list(self.notes)
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
            self_check=tuple(tuple(c.get(k, {"batched": True, "mask_rank": 4}.get(k)) for k in _CHECK_FIELDS)
                             for c in d.get("self_check", [])),
            notes=tuple(d.get("notes", [])),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(l.bytes_per_token for l in self.layers)


def topo_nodes(spec):
    """Graph nodes in dependency order (stable: file order among ready nodes)."""
    import networkx as nx

    from .validate import to_digraph

    g = to_digraph(spec)
    order = {n.id: i for i, n in enumerate(spec.nodes)}
    ids = list(nx.lexicographical_topological_sort(g, key=lambda n: order.get(n, -1)))
    return [spec.node(i) for i in ids if i in order]


def _step_detail(node, binding: Binding, kind: str) -> tuple[str, str]:
    p = {k: v for k, v in node.param_dict.items()}
    generic = binding.lowering != "fast"
    if node.op == "embed":
        if generic:
            return "token ids (the model's own forward embeds them)", "always"
        adapter = type(binding.adapter).__name__
        return f"token ids -> hidden [{binding.config.get('hidden_size')}] via {adapter}.embed", "always"
    if node.op == "attention":
        counts = {}
        for l, pol in zip(binding.layers, binding.policies):
            counts.setdefault((l.kind, pol.describe()), []).append(l.index)
        parts = [f"{len(ix)}x {k} -> {d}" for (k, d), ix in counts.items()]
        how = f"{binding.model_type}.__call__(tokens, cache=graphc caches) -> logits, " if generic else ""
        return how + f"{len(binding.layers)} layers: " + "; ".join(parts), "always"
    when = "final chunk" if kind == "prefill" else "always"
    if node.op == "logits" and generic:
        return (f"last position of the model's own logits, vocab {_vocab(binding)}, float32 "
                "(non-final chunks evaluate only the cache writes)"), when
    if node.op == "logits":
        pos = p.get("positions", "last")
        return f"norm + lm_head on {pos} position(s), vocab {binding.config.get('vocab_size')}, float32", when
    if node.op == "logit_edits":
        edits = p.get("edits", list(OPS["logit_edits"].params["edits"].default))
        return "additive edit rows: " + ", ".join(edits), "rows that ask"
    if node.op == "sample":
        from graphc.runtime.sampling import CANDIDATE_MAX

        if p.get("method") == "greedy":
            return "argmax for every row", when
        return (f"per-row greedy / temperature / top-k / top-p / min-p, Gumbel-max; "
                f"[B, K] candidate set for rows with top_k <= {CANDIDATE_MAX}"), when
    if node.op == "logprobs":
        return f"chosen-token logprob, top-N (N <= {p.get('max_top_n', 20)}), requested ids", "rows that ask"
    return node.op, "always"


def _vocab(binding: Binding):
    check = binding.config.get("vocab_size") or binding.config.get("text_config", {}).get("vocab_size")
    return check or "?"


def binding_notes(binding: Binding) -> list[str]:
    from graphc.runtime.prefix_cache import prefix_unsupported_reason

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
    from .cachekinds import native_reasons

    natives = native_reasons(binding.layers)
    if natives:
        notes.append(f"one request at a time (max_batch 1) on mlx-lm's own cache: {natives[0]}")
    elif not binding.batched:
        notes.append("one request at a time (max_batch 1): the model's forward is exact on one row but not on "
                     "left-padded batches of rows at different positions")
    reason = prefix_unsupported_reason(binding.policies)
    if reason:
        notes.append(f"prefix reuse off: {reason}")
    return notes


def build_plan(binding: Binding, kind: str) -> Plan:
    if kind not in BATCH_KINDS:
        raise ValueError(f"unknown batch kind '{kind}' (known: {', '.join(BATCH_KINDS)})")
    spec = binding.spec
    steps = []
    for i, node in enumerate(topo_nodes(spec)):
        detail, when = _step_detail(node, binding, kind)
        steps.append(PlanStep(i, node.id, node.op, detail, when))
    layers = tuple(
        LayerPlan(l.index, l.kind, pol.name, pol.describe(), l.window, l.sinks, pol.bytes_per_token())
        for l, pol in zip(binding.layers, binding.policies)
    )
    notes = []
    chain_safe = kind == "decode"
    if kind != "decode":
        notes.append("prefill batches are not chained: the next step needs the host to pick what runs")
    for pol in binding.policies:
        if not pol.chain_safe:
            chain_safe = False
            notes.append(f"policy '{pol.name}' needs host work between steps")
            break
    edits = spec.nodes_of("logit_edits")
    if edits:
        enabled = edits[0].param_dict.get("edits", OPS["logit_edits"].params["edits"].default)
        if "grammar" in enabled:
            notes.append("rows with a grammar break the chain: their mask for step N+1 needs step N's token on the host")
        if "processors" in enabled:
            notes.append("rows with custom logits processors break the chain: Python runs on their logits")
    if kind == "decode" and chain_safe:
        notes.insert(0, "chain-safe: step N+1 is built on step N's lazy tokens; penalty counts and "
                        "min_tokens counters update inside the step")
    return Plan(
        graph=spec.name, source=spec.source, kind=kind, model_type=binding.model_type,
        steps=tuple(steps), layers=layers, chain_safe=chain_safe, chain_notes=tuple(notes),
        outputs=spec.outputs, lowering=binding.lowering,
        self_check=tuple((c.lowering, c.ok, c.max_abs_diff, c.tolerance, c.error, c.batched, c.mask_rank)
                         for c in binding.checks),
        notes=tuple(binding_notes(binding)),
    )
