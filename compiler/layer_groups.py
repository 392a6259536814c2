"""The decoder's layer groups: which layer kinds a graph's `attention` node serves, and which it is for.

    - id: decoder
      op: attention
      inputs: [embed]
      params:
        layers:                                   # group name -> the layer kinds in it
          recurrent: [linear_attention]
          attention: [full_attention, sliding_attention]
        requires: [recurrent]                     # a model needs a layer in one of these groups

The `cache:` section says which policy each layer kind gets; the groups say what the decoder
stack is made of. Validation checks the groups against `cache:` (every grouped kind has a
policy, every policy serves a group); binding checks them against the model (every layer falls
in a group; a `requires` group has a layer), so a dense model under the hybrid graph, or a
hybrid one under the dense graph, is an error naming the node rather than a graph that quietly
serves a model it was not written for. Inspect prints the model's layers group by group.

A graph without `layers:` (most user graphs) gets one group per `cache:` entry, named by its
kind, and requires none of them: what binding did before groups existed.
"""

from __future__ import annotations

import attrs

from .errors import did_you_mean

LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention", "cache_list", "native")

# The layer kinds a compiled decode step can take: every layer on plain full-attention KV
# (runtime/compiled_decode.py `_fixed`); windowed, recurrent, listed and native caches are not.
TRACEABLE_KINDS = ("full_attention",)


@attrs.frozen
class LayerGroup:
    name: str
    kinds: tuple[str, ...]
    required: bool = False


@attrs.frozen
class BoundGroup:
    """A group as bound to a model: the layers of its kinds (possibly none) and their policies."""

    name: str
    kinds: tuple[str, ...]
    required: bool
    layers: tuple[int, ...]
    kinds_present: tuple[str, ...]  # the kinds its layers have in this model, in layer order
    policies: tuple[str, ...]  # each distinct policy description among its layers, in layer order


def decoder_node(spec):
    """The graph's attention node (validation reports a missing or second one)."""
    nodes = spec.nodes_of("attention")
    return nodes[0] if nodes else None


def _raw(spec) -> tuple:
    node = decoder_node(spec)
    params = node.param_dict if node is not None else {}
    return params.get("layers"), params.get("requires")


def _mapping(raw) -> list[tuple[str, tuple]] | None:
    """(group, kinds) pairs from the frozen `layers:` value, or None when it is not a mapping of lists."""
    if not isinstance(raw, tuple) or not raw:
        return None
    out = []
    for item in raw:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            return None
        name, kinds = item
        kinds = (kinds,) if isinstance(kinds, str) else kinds
        if not isinstance(kinds, tuple) or not all(isinstance(k, str) for k in kinds):
            return None
        out.append((name, kinds))
    return out


def _names(raw) -> tuple:
    return (raw,) if isinstance(raw, str) else tuple(raw or ())


def declared(spec) -> bool:
    return _raw(spec)[0] is not None


def groups_of(spec) -> tuple[LayerGroup, ...]:
    """The decoder's groups (declared, or one per `cache:` entry); call on a validated spec."""
    layers, requires = _raw(spec)
    pairs = _mapping(layers)
    if pairs is None:
        return tuple(LayerGroup(c.layer_type, (c.layer_type,)) for c in spec.cache)
    req = set(_names(requires))
    return tuple(LayerGroup(name, kinds, name in req) for name, kinds in pairs)


def check(node, spec) -> list[str]:
    """The attention node's `layers:` / `requires:` against themselves and the `cache:` section."""
    params = node.param_dict
    layers, requires = params.get("layers"), params.get("requires")
    if layers is None:
        return ["`requires` names layer groups, but the node declares no `layers:`"] if requires else []
    pairs = _mapping(layers)
    if pairs is None:
        return ["param 'layers' must map group names to lists of layer kinds, "
                "e.g. `layers: {attention: [full_attention]}`"]
    out, seen, unknown = [], {}, False
    cached = {c.layer_type for c in spec.cache}
    for name, kinds in pairs:
        if not kinds:
            out.append(f"layer group '{name}' lists no layer kinds")
        for kind in kinds:
            if kind not in LAYER_TYPES:
                unknown = True
                out.append(f"layer group '{name}': unknown layer kind '{kind}' ({did_you_mean(kind, LAYER_TYPES)})")
            elif kind in seen:
                out.append(f"layer kind '{kind}' is in groups '{seen[kind]}' and '{name}': a kind belongs to one group")
            else:
                seen[kind] = name
                if kind not in cached:
                    out.append(f"layer group '{name}' lists {kind}, but `cache:` declares no policy for it "
                               f"(add `{kind}: {{policy: ...}}` under `cache:`)")
    for kind in sorted(cached - set(seen)) if not unknown else ():  # a misspelt kind is reported once, above
        if kind in LAYER_TYPES:
            out.append(f"`cache:` declares a policy for {kind}, but no layer group of this node lists it "
                       "(add it to a group under `layers:`, or drop the cache entry)")
    if not isinstance(requires, (str, tuple)) and requires is not None:
        out.append("param 'requires' must be a list of layer group names")
    else:
        for name in _names(requires):
            if name not in dict(pairs):
                out.append(f"`requires` names '{name}', which is not a layer group ({did_you_mean(name, dict(pairs))})")
    return out


def bind_groups(spec, layers, policies) -> tuple[BoundGroup, ...]:
    """Each group with the model's layers of its kinds, ordered by first layer (empty groups last)."""
    out = []
    for g in groups_of(spec):
        mine = [(l, p) for l, p in zip(layers, policies) if l.kind in g.kinds]
        present = tuple(dict.fromkeys(l.kind for l, _ in mine))
        descs = tuple(dict.fromkeys(p.describe() for _, p in mine))
        out.append(BoundGroup(g.name, g.kinds, g.required, tuple(l.index for l, _ in mine), present, descs))
    return tuple(sorted(out, key=lambda b: b.layers[0] if b.layers else len(layers)))


def group_of(groups, kind: str):
    return next((g for g in groups if kind in g.kinds), None)


def untraceable(groups) -> list:
    """Bound groups with layers a compiled decode step cannot take (kinds outside TRACEABLE_KINDS)."""
    return [g for g in groups if any(k not in TRACEABLE_KINDS for k in g.kinds_present)]
