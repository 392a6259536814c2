"""Binding: walk the loaded model once, classify every layer, give each the policy the graph declares.

An unsupported combination (a layer type the graph has no policy for, a policy
that cannot serve a layer) is an error here, at bind time, not a wrong answer later.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from .archs import ArchAdapter, adapter_for
from .errors import Diagnostic, GraphError
from .ir import GraphSpec


@attrs.frozen
class LayerInfo:
    """What binding learned about one layer."""

    index: int
    kind: str  # full_attention | sliding_attention | linear_attention
    window: int | None = None
    sinks: bool = False
    kv_heads: int = 0
    head_dim: int = 0
    dtype: str = "float32"
    state_bytes: int = 0  # linear_attention: bytes of one request's recurrent state

    @property
    def kv_bytes_per_token(self) -> int:
        if self.kind == "linear_attention":
            return 0
        return 2 * self.kv_heads * self.head_dim * _DTYPE_BYTES.get(self.dtype, 4)


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _dtype_name(dt) -> str:
    return str(dt).replace("mlx.core.", "")


def classify_layer(i: int, layer, config: dict, layer_types: list | None) -> LayerInfo:
    """One layer's kind, window and KV shape, read off the mlx-lm module itself."""
    if getattr(layer, "is_linear", False) or hasattr(layer, "linear_attn") or hasattr(layer, "mamba"):
        return LayerInfo(i, "linear_attention", state_bytes=_state_bytes(layer))
    attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None)
    if attn is None:
        raise NotImplementedError(f"layer {i} ({type(layer).__name__}) has no self_attn and is not a known state layer")
    sliding = bool(getattr(layer, "use_sliding", False) or getattr(attn, "is_sliding", False))
    if layer_types is not None and i < len(layer_types):
        sliding = sliding or layer_types[i] == "sliding_attention"
    window = config.get("sliding_window") if sliding else None
    kv_heads = (getattr(attn, "n_kv_heads", None) or getattr(attn, "num_key_value_heads", None)
                or config.get("num_key_value_heads") or config.get("num_attention_heads"))
    head_dim = getattr(attn, "head_dim", None) or config.get("head_dim") or (
        config["hidden_size"] // config["num_attention_heads"])
    dtype = _dtype_name(attn.k_proj.weight.dtype) if hasattr(attn, "k_proj") else "float32"
    if dtype not in _DTYPE_BYTES:  # quantized weights: activations/KV are in the scales' dtype
        dtype = _dtype_name(getattr(attn.k_proj, "scales", mx.zeros(1, mx.float16)).dtype)
    return LayerInfo(
        index=i,
        kind="sliding_attention" if sliding else "full_attention",
        window=int(window) if window else None,
        sinks="sinks" in attn,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        dtype=dtype,
    )


def _state_bytes(layer) -> int:
    """One request's recurrent state for a GatedDeltaNet-style layer (conv tail + float32 state), else 0."""
    m = getattr(layer, "linear_attn", None)
    try:
        conv = (m.conv_kernel_size - 1) * m.conv_dim * _DTYPE_BYTES.get(_dtype_name(m.in_proj_qkvz.weight.dtype), 4)
        return int(conv + m.num_v_heads * m.head_v_dim * m.head_k_dim * 4)
    except AttributeError:
        return 0


@attrs.define
class Binding:
    """A graph bound to a model: the adapter, each layer's info and policy instance."""

    spec: GraphSpec
    adapter: ArchAdapter
    config: dict
    layers: list[LayerInfo]
    policies: list  # one CachePolicy per layer

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "?")


def classify_model(model, config: dict) -> list[LayerInfo]:
    adapter = adapter_for(model)
    layer_types = getattr(adapter.inner, "layer_types", None) or config.get("layer_types")
    return [classify_layer(i, layer, config, layer_types) for i, layer in enumerate(adapter.layers)]


def bind(spec: GraphSpec, model, config: dict) -> Binding:
    """Classify the model's layers and instantiate the declared policy for each. Raises GraphError."""
    from graphc.runtime.cache.registry import get_policy

    adapter = adapter_for(model)
    layers = classify_model(model, config)
    diags: list[Diagnostic] = []
    policies = []
    by_kind: dict[str, list[int]] = {}
    for info in layers:
        by_kind.setdefault(info.kind, []).append(info.index)
    for kind, idxs in by_kind.items():
        decl = spec.policy_for(kind)
        if decl is None:
            diags.append(Diagnostic(
                spec.loc,
                f"model '{config.get('model_type')}' has {kind} layers {_ranges(idxs)} but the graph declares no policy for them",
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
            policies.append(cls(info, **decl.param_dict))
        except (ValueError, TypeError) as e:
            raise GraphError([Diagnostic(decl.loc, f"cannot bind policy '{decl.policy}' to layer {info.index}: {e}")])
    return Binding(spec, adapter, dict(config), layers, policies)


def _graph_for_kinds(kinds: set[str]) -> str:
    if "linear_attention" in kinds:
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

