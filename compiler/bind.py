"""Binding: walk the loaded model once, classify every layer, give each the policy the graph declares.

An unsupported combination (a layer type the graph has no policy for, a policy that cannot
serve a layer, a model without the layers the graph's decoder requires: compiler/layer_groups.py)
is an error here, at bind time, not a wrong answer later.
"""

from __future__ import annotations

import attrs
from mlx_lm.models.cache import make_prompt_cache

from graphc.contracts.policies import PolicyLike, get_policy

from .archs import ArchAdapter, adapter_for
from .cachekinds import LayerInfo, layers_from_caches, model_type_of, text_model
from .cachekinds import folding_layers as folding_layers_of
from .errors import Diagnostic, GraphError
from .ir import GraphSpec
from .layer_groups import BoundGroup, bind_groups, declared, decoder_node, groups_of
from .selfcheck import reference_run


@attrs.frozen
class Binding:
    """A graph bound to a model: each layer's info and policy, and how the forward is lowered.

    `lowering` is "fast" (the split embed / layers / norm / head of `adapter`) or "generic"
    (the model's own `__call__`); `check` is the load-time self-check that chose it
    (compiler/selfcheck.py). Frozen: compile_graph makes a new Binding for each lowering it
    tries (attrs.evolve), so a lowered step's binding never changes under it."""

    spec: GraphSpec
    model: object  # the model graphc serves (a multimodal wrapper's language_model)
    config: dict
    layers: list[LayerInfo]
    policies: list[PolicyLike]  # one per layer (contracts/policies.py)
    model_type: str = "?"
    adapter: ArchAdapter | None = None  # the fast path's decomposition, when this model type has one
    lowering: str = "generic"
    check: object = None  # CheckResult of the lowering in use
    checks: tuple = attrs.field(default=(), converter=tuple)  # every lowering tried, in order
    batched: bool = True  # False: exact only one request at a time; the engine runs max_batch=1
    mask_rank: int = 4  # 5: per-row masks as [B, 1, 1, N, T] (attention scores split by KV group)
    wrapper_type: str | None = None  # the multimodal wrapper's type when the text model inside is served
    groups: tuple[BoundGroup, ...] = ()  # the decoder's layer groups with this model's layers in each
    # Layers whose caches count the positions a forward folds in (`folded`, runtime/cache/ssm_state.py):
    # found from the policies when the Binding is made, so each forward (compiler/ops/forward.py)
    # visits only those.
    folding_layers: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: folding_layers_of(self.policies), takes_self=True))


def classify_model(model, config: dict) -> list[LayerInfo]:
    """Each layer's LayerInfo from the caches mlx-lm's own forward fills (refuses what graphc cannot batch)."""
    served = text_model(model)
    mtype = model_type_of(served, config)
    return layers_from_caches(reference_run(served, mtype).caches, mtype, served, make_prompt_cache(served))


def bind(spec: GraphSpec, model, config: dict, layers: list[LayerInfo] | None = None,
         model_type: str | None = None, target=None) -> Binding:
    """Instantiate the declared policy for each layer. Raises GraphError (no policy for a kind).
    `target` (compiler/target.py, the device's facts): handed to each policy that has `for_target`,
    so what its caches run on this device follows the same facts the plan's choices do."""
    served = text_model(model)
    model_type = model_type or model_type_of(served, config)
    layers = layers if layers is not None else classify_model(model, config)
    diags: list[Diagnostic] = []
    policies = []
    by_kind: dict[str, list[int]] = {}
    for info in layers:
        by_kind.setdefault(info.kind, []).append(info.index)
    diags += _check_groups(spec, by_kind, model_type)
    for kind, idxs in by_kind.items():
        decl = spec.policy_for(kind)
        if decl is None:
            if not declared(spec):  # a declared decoder already said so, naming its node (_check_groups)
                diags.append(Diagnostic(
                    spec.loc,
                    f"model '{model_type}' has {kind} layers {_ranges(idxs)} but the graph declares no policy for them",
                    hint=_suggest_graph(set(by_kind)) + f", or add `{kind}: {{policy: ...}}` under `cache:`",
                ))
            continue
        cls = get_policy(decl.policy)
        problem = cls.check_layer(layers[idxs[0]])
        if problem:
            diags.append(Diagnostic(decl.loc, f"{problem} (layers {_ranges(idxs)})",
                                    hint=_suggest_graph(set(by_kind))))
    if diags:
        raise GraphError(diags)
    for info in layers:
        decl = spec.policy_for(info.kind)
        cls = get_policy(decl.policy)
        try:
            policy = cls(info, **decl.param_dict)
        except (ValueError, TypeError) as e:
            raise GraphError([Diagnostic(decl.loc, f"cannot bind policy '{decl.policy}' to layer {info.index}: {e}")])
        if target is not None and hasattr(policy, "for_target"):
            policy.for_target(target)
        policies.append(policy)
    wrapper = model_type_of(model, config) if served is not model else None
    return Binding(spec, served, dict(config), layers, policies, model_type=model_type,
                   adapter=adapter_for(served, model_type), wrapper_type=wrapper,
                   groups=bind_groups(spec, layers, policies))


def _check_groups(spec: GraphSpec, by_kind: dict[str, list[int]], model_type: str) -> list[Diagnostic]:
    """The decoder node's declared layer groups against the model's layers: every layer in a
    group, and a layer in one of the `requires` groups (what the graph is for)."""
    node = decoder_node(spec)
    if node is None or not declared(spec):
        return []
    groups = groups_of(spec)
    has = ", ".join(f"{kind} {_ranges(idxs)}" for kind, idxs in by_kind.items())
    serves = "; ".join(f"{g.name}: {', '.join(g.kinds)}" for g in groups)
    out = []
    for kind, idxs in by_kind.items():
        if not any(kind in g.kinds for g in groups):
            out.append(Diagnostic(
                node.loc, f"model '{model_type}' has {kind} layers {_ranges(idxs)} but the graph declares no policy "
                f"for them: this decoder's layer groups are {serves}", node=node.id,
                hint=_suggest_graph(set(by_kind)) + f", or add {kind} to a group under `layers:` and "
                f"`{kind}: {{policy: ...}}` under `cache:`"))
    required = [g for g in groups if g.required]
    if required and not any(kind in g.kinds for g in required for kind in by_kind):
        names = " or ".join(f"{g.name} ({', '.join(g.kinds)})" for g in required)
        out.append(Diagnostic(
            node.loc, f"this decoder requires {names} layers, and model '{model_type}' has none (its layers: {has})",
            node=node.id, hint=_suggest_graph(set(by_kind)) + ", the graph written for those layers"))
    return out


def _graph_for_kinds(kinds: set[str]) -> str:
    if kinds & {"linear_attention", "cache_list", "native"}:
        return "hybrid"
    if "sliding_attention" in kinds:
        return "sliding"
    return "dense"


def default_graph_for(layers: list[LayerInfo]) -> str:
    return _graph_for_kinds({l.kind for l in layers})


def _suggest_graph(kinds: set[str]) -> str:
    return f"use graphs/{_graph_for_kinds(kinds)}.yaml"


def _ranges(idxs: list[int]) -> str:
    if len(idxs) > 6:
        return f"{idxs[0]}..{idxs[-1]} ({len(idxs)} layers)"
    return ",".join(map(str, idxs))

