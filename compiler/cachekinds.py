"""Each layer's cache kind, taken from the model itself: `mlx_lm.models.cache.make_prompt_cache`.

mlx-lm already says what cache every layer needs: `model.make_cache()` where the model
defines it (KVCache, RotatingKVCache(max_size, keep), ArraysCache(size), CacheList(...),
ChunkedKVCache(chunk), ...), else one KVCache per layer. Binding maps each class to a graphc
layer kind (and the graph's policy for that kind) instead of guessing from attribute names:

    KVCache                        -> full_attention     (full / pool_backed)
    RotatingKVCache(w, keep=0)     -> sliding_attention  (windowed, window w)
    ArraysCache(n)                 -> linear_attention   (ssm_state, n state slots)
    CacheList(a, b, ...)           -> cache_list         (cache_list: one policy per part)

    anything else                  -> native             (mlx-lm's own cache object, one request
                                                          at a time; the reason it cannot batch
                                                          is kept for the refusal message)

A `native` layer keeps mlx-lm's own cache class (ChunkedKVCache, QuantizedKVCache,
RotatingKVCache with `keep`, a model's private cache class, ...): exact by construction,
but it cannot join rows into a batch or share prefixes, so such a model is served one
request at a time — and refused, with the model type, the layer, the reason and what
graphc would need, if even that fails the self-check.

Shapes (KV heads, head dim, dtype, state bytes) are read off mlx-lm's own caches after a
few tokens of the model's own forward (compiler/selfcheck.py runs it), not off the config.
"""

from __future__ import annotations

import attrs
from mlx_lm.models import cache as C


@attrs.frozen
class LayerInfo:
    """What binding learned about one layer, from the cache mlx-lm makes for it (below)."""

    index: int
    kind: str  # full_attention | sliding_attention | linear_attention | cache_list
    window: int | None = None
    sinks: bool = False
    kv_heads: int = 0
    head_dim: int = 0
    dtype: str = "float32"
    state_bytes: int = 0  # linear_attention: bytes of one request's recurrent state
    state_size: int = 2  # linear_attention: slots of mlx-lm's ArraysCache
    cache_type: str = "KVCache"  # the mlx-lm cache class this layer's policy stands in for
    v_head_dim: int | None = None  # when values are narrower/wider than keys (MLA)
    parts: tuple = ()  # cache_list: one LayerInfo per cache in the list
    native: object = attrs.field(default=None, eq=False, repr=False)  # native: an empty mlx-lm cache to copy
    native_reason: str = ""  # native: why graphc cannot batch it (the refusal message if unbatched fails too)

    @property
    def kv_bytes_per_token(self) -> int:
        if self.kind == "cache_list":
            return sum(p.kv_bytes_per_token for p in self.parts)
        if self.kind in ("linear_attention", "native"):
            return 0
        vd = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return self.kv_heads * (self.head_dim + vd) * _DTYPE_BYTES.get(self.dtype, 4)


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def dtype_name(dt) -> str:
    return str(dt).replace("mlx.core.", "")


def text_model(model):
    """The model graphc serves: a multimodal wrapper's `language_model` (text-only), else the model."""
    lm = getattr(model, "language_model", None)
    if lm is not None and callable(lm) and hasattr(lm, "layers"):
        return lm
    return model


def model_type_of(model, config: dict | None = None) -> str:
    t = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", None)
    return str(t or (config or {}).get("model_type") or type(model).__module__.rsplit(".", 1)[-1])


def _native(i: int, fresh, model_type: str, where: str, reason: str, need: str):
    """A layer kept on mlx-lm's own cache class (served unbatched); `fresh` is an empty one to copy."""
    why = f"model type '{model_type}': {where}: {reason}. To batch it graphc would need {need}."
    return LayerInfo(i, "native", cache_type=type(fresh).__name__, native=fresh, native_reason=why)


def native_reasons(layers) -> list[str]:
    out = []
    for l in layers:
        out += [l.native_reason] if l.kind == "native" else native_reasons(l.parts)
    return out


def layer_info(i: int, cache, model_type: str, part: str = "", fresh=None):
    """The LayerInfo for mlx-lm cache object `cache` (already filled by a few tokens, so its shapes
    are known); `fresh` is the same layer's cache from a new make_prompt_cache (empty)."""
    name = type(cache).__name__
    where = f"layer {i}{part} (cache {name})"
    if type(cache) is C.KVCache:
        return LayerInfo(i, "full_attention", cache_type=name, **_kv_shape(cache))
    if type(cache) is C.RotatingKVCache:
        if cache.keep:
            return _native(i, fresh, model_type, where, f"the model keeps the first {cache.keep} tokens of a rotating window "
                    "(attention-sink style), which graphc's windowed policy does not",
                    "a windowed policy that pins the first `keep` positions")
        return LayerInfo(i, "sliding_attention", window=int(cache.max_size), cache_type=name, **_kv_shape(cache))
    if type(cache) is C.ArraysCache:
        state = sum(c.nbytes for c in cache.cache if c is not None)
        return LayerInfo(i, "linear_attention", state_size=len(cache.cache), state_bytes=int(state),
                         cache_type=name)
    if type(cache) is C.CacheList:
        parts = tuple(layer_info(i, c, model_type, f"{part}.{j}", fresh.caches[j])
                      for j, c in enumerate(cache.caches))
        return LayerInfo(i, "cache_list", parts=parts, cache_type=name)
    if type(cache) is C.ChunkedKVCache:
        return _native(i, fresh, model_type, where, f"chunked attention (chunk {cache.chunk_size}) whose mask the model builds "
                "from one integer offset shared by the whole batch",
                "a batched chunked-KV cache and a model forward that takes per-row offsets")
    return _native(i, fresh, model_type, where, f"graphc has no batched equivalent of mlx-lm's {name}",
                   f"a cache policy that speaks {name}'s protocol (see docs/models.md)")


def _kv_shape(cache) -> dict:
    k = cache.keys
    if k is None:  # a layer the forward never wrote (shared KV): no bytes of its own
        return {}
    return {"kv_heads": int(k.shape[1]), "head_dim": int(k.shape[3]), "dtype": dtype_name(k.dtype),
            "v_head_dim": int(cache.values.shape[3])}


def layers_from_caches(caches: list, model_type: str, model=None, fresh: list | None = None) -> list:
    fresh = fresh if fresh is not None else [None] * len(caches)
    infos = [layer_info(i, c, model_type, fresh=f) for i, (c, f) in enumerate(zip(caches, fresh))]
    mods = list(getattr(model, "layers", None) or []) if model is not None else []
    if len(mods) == len(infos):  # attention sinks: informational (inspect shows them)
        infos = [attrs.evolve(info, sinks=True) if "sinks" in (getattr(m, "self_attn", None) or {}) else info
                 for info, m in zip(infos, mods)]
    return infos


def position_counters(cache) -> list:
    """The parts of a layer cache that count the positions a forward folds in (`folded`,
    runtime/cache/ssm_state.py StateCache): a CacheList's parts, or the cache itself."""
    return [p for p in getattr(cache, "caches", None) or [cache] if hasattr(p, "folded")]


def folding_layers(policies) -> tuple[int, ...]:
    """The layers whose policies keep caches that count positions: the forward tells only those."""
    return tuple(i for i, p in enumerate(policies) if position_counters(p.new_cache()))
