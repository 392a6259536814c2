"""The forward ops: embed, attention, logits — each wrapping whichever forward binding chose.

Binding picks one lowering per model (compiler/compile.py, proven by the load-time
self-check): "fast", where embed / the layer loop / norm + head run separately through an
ArchAdapter (compiler/archs.py) and the head runs on the last position only; or "generic",
where the `attention` op is the model's OWN `model(tokens, cache=caches)` on graphc's
batched caches and returns logits for every position (lazily: a non-final chunk evaluates
only the cache writes, `LoweredStep.fill_targets`). Each op below has one registration and
dispatches on `binding.lowering`, so a graph reads the same whichever forward serves it.
"""

from __future__ import annotations

import mlx.core as mx

from ..cachekinds import position_counters
from ..gated_delta_layer import decoder_layer_chunked
from ..layer_groups import check as check_layer_groups
from .registry import HIDDEN, LOGITS, TOKENS, Param, model_dtype_key, register_op


def _generic(ctx) -> bool:
    return ctx.binding.lowering != "fast"


def _describe_embed(node, binding, kind):
    if binding.lowering != "fast":
        return "token ids (the model's own forward embeds them)"
    return (f"token ids -> hidden [{binding.config.get('hidden_size')}] via "
            f"{type(binding.adapter).__name__}.embed")


@register_op("embed", inputs=(TOKENS,), output=HIDDEN, describe=_describe_embed,
             doc="token ids -> hidden states (the model's own embedding, with its scaling)")
def embed(ctx, node, tokens):
    if _generic(ctx):
        return tokens  # the model's own forward embeds (attention below)
    return ctx.binding.adapter.embed(tokens)


def _describe_attention(node, binding, kind):
    counts = {}
    for l, pol in zip(binding.layers, binding.policies):
        counts.setdefault((l.kind, pol.describe()), []).append(l.index)
    parts = "; ".join(f"{len(ix)}x {k} -> {d}" for (k, d), ix in counts.items())
    if node.params.get("layers") is not None:  # the declared groups (compiler/layer_groups.py)
        parts = " + ".join(f"{len(g.layers)} {g.name}" for g in binding.groups if g.layers) + f" ({parts})"
    how = ""
    if binding.lowering != "fast":
        out = "logits" if "logits" in node.consumers else "final hidden states"
        call = "__call__" if out == "logits" else "model"
        how = f"{binding.model_type}.{call}(tokens, cache=graphc caches) -> {out}, "
    return how + f"{len(binding.layers)} layers: {parts}"


@register_op("attention", inputs=(HIDDEN,), output=HIDDEN, describe=_describe_attention, check=check_layer_groups,
             params={
                 "layers": Param(object, None, doc="group name -> the layer kinds the decoder stack serves in it "
                                                   "(compiler/layer_groups.py); default: one group per `cache:` entry"),
                 "requires": Param(object, None, doc="layer groups of which a model must have at least one layer"),
             },
             doc="the decoder stack; each layer reads and writes the cache policy declared for its layer type")
def attention(ctx, node, h):
    """The decoder stack. Fast path: the layer loop here, masks built once per (layer kind, window)
    from the first such layer's cache. Generic: the model's own forward — to logits when a
    `logits` node reads this one, else to its final (normed) hidden states (embedding graphs)."""
    out = _decoder(ctx, node, h)
    b = ctx.binding
    if b.folding_layers:  # found at bind time (compiler/cachekinds.py folding_layers)
        _folded([ctx.inputs.caches[i] for i in b.folding_layers], h.shape[1])
    return out


def _folded(caches, n: int) -> None:
    """Tell the caches that count their own positions (runtime/cache/ssm_state.py StateCache) that a
    forward folded n positions in: some models' recurrent layers never call `cache.advance`
    (mlx-lm's bailing_moe_linear), and the prefix cache checks a state snapshot's position."""
    for c in caches:
        for part in position_counters(c):
            part.folded(n)


def _decoder(ctx, node, h):
    b, inputs = ctx.binding, ctx.inputs
    if _generic(ctx):
        if "logits" in node.consumers or not node.consumers:
            return _model_forward(ctx, node, h)
        inner = getattr(b.model, "model", None)
        _set_mask_rank(ctx)
        if inner is None:
            raise NotImplementedError(
                f"model type '{b.model_type}' has no inner `.model` returning hidden states, which a graph "
                "without a logits node needs on the generic lowering")
        return inner(h, cache=inputs.caches)
    chunked = _linear_chunked(ctx)
    if _last_only(ctx, node, h.shape[1]):
        # The plan's "final chunk" is `split` (compiler/passes/prefill_choices.py): a final chunk
        # of L > 1 tokens runs as L-1 positions, then the last one. The first pass's output feeds
        # nothing, so MLX computes only its cache writes: the last layer's attention output and
        # MLP run for one position instead of L (a 4-layer model: a quarter of the prefill).
        # Any split of a prompt is exact (chunked prefill).
        _layers(b, inputs, h[:, :-1], chunked)
        return _layers(b, inputs, h[:, -1:], chunked)
    return _layers(b, inputs, h, chunked)


def _linear_chunked(ctx) -> bool:
    """The prefill plan chose the chunked gated-delta recurrence (compiler/passes/prefill_choices.py
    choose_linear_prefill); decode plans make no such choice and keep mlx-lm's."""
    return ctx.chosen("linear attention (prompt chunks)") == "chunked"


def _splits_final_chunk(ctx, n: int) -> bool:
    """A final chunk of n > 1 positions of which only the last is read, and the plan chose to
    split it (its "final chunk" choice; a plan without one, decode's, keeps the split). A chunk
    that samples before its end (`sample_at`: a padded one) runs whole."""
    inputs = ctx.inputs
    return (inputs.final and n > 1 and not inputs.all_positions and inputs.sample_at is None
            and ctx.chosen("final chunk") != "whole")


def _last_only(ctx, node, n: int) -> bool:
    """Only the last position of this final chunk is read, and the plan splits it off: the readers
    are `logits` nodes, one of them last-position (a `positions: all` one for prompt logprobs runs
    with all_positions then), or `verify`, which runs only in verify steps and those ask for
    all_positions. Not for scoring or embeddings, which read every position."""
    readers = set(node.consumers)
    if not (_splits_final_chunk(ctx, n) and not node.all_positions
            and "logits" in readers and readers <= {"logits", "verify"}):
        return False
    # The logits that sampling reads must be a last-position node: a graph whose only logits
    # node is `positions: all` gets every position from a direct forward, as it asks.
    return any(r.op == "logits" and dict(r.params).get("positions", "last") == "last" and node.id in r.inputs
               for r in ctx.binding.spec.nodes)


def _layers(b, inputs, h, linear_chunked: bool = False):
    """The fast path's layer loop over `h`'s positions, masks built once per (kind, window).
    linear_chunked: linear-attention layers run chunks of n > 1 positions with the chunked
    recurrence (compiler/gated_delta_layer.py) instead of as mlx-lm's modules."""
    n = h.shape[1]
    masks = {}
    for layer, info, cache in zip(b.adapter.layers, b.layers, inputs.caches):
        key = (info.kind, info.window)
        if key not in masks:
            if info.kind == "linear_attention":
                masks[key] = cache.make_mask(n)
            else:
                masks[key] = cache.make_mask(n, window_size=info.window)
        # A layer cache may run its layer itself: the compiled decode path
        # (runtime/compiled_decode.py) runs llama blocks with fused projections.
        run = getattr(cache, "run_layer", None)
        if linear_chunked and n > 1 and info.kind == "linear_attention":
            h = decoder_layer_chunked(layer, h, masks[key], cache)
        else:
            h = layer(h, masks[key], cache) if run is None else run(layer, h, masks[key])
    return h


def _model_forward(ctx, node, tokens):
    """The model's own forward on graphc's caches: lazy logits [B, L, V] for every position.

    Where the plan splits a final chunk (its "final chunk" choice), a final chunk of L > 1
    tokens runs as two forwards, L-1 tokens then the last one, so the head (vocab x hidden per
    position: for a 128k vocabulary as much work as several layers) runs on one position instead
    of L; the first forward's logits are never evaluated. Any split of a prompt is exact (chunked
    prefill), and the self-check runs this path. Not when every position's logits are wanted: a
    row asks for prompt logprobs (`all_positions`), or the graph reads every position for more
    than on-request outputs (scoring).
    """
    model, inputs = ctx.binding.model, ctx.inputs
    _set_mask_rank(ctx)
    n = tokens.shape[1]
    if _splits_final_chunk(ctx, n) and not node.all_positions:
        model(tokens[:, :-1], cache=inputs.caches)
        return model(tokens[:, -1:], cache=inputs.caches)
    return model(tokens, cache=inputs.caches)


def _set_mask_rank(ctx) -> None:
    """Per-row masks shaped for this model's scores (gemma2's GQA splits them by KV group; see
    runtime/cache/full.py): the binding found the rank at load time."""
    rank = getattr(ctx.binding, "mask_rank", 4)
    if rank != 4:
        for c in ctx.inputs.caches:
            for part in getattr(c, "caches", None) or [c]:
                part.mask_rank = rank


def final_hidden(ctx, h):
    """The model's final hidden states (after its final norm) from an attention node's output:
    the fast path's layer loop stops before the norm; the generic path's inner model includes it."""
    return ctx.binding.adapter.norm(h) if not _generic(ctx) else h


def _logits_phase(params):
    # Every position is needed on every chunk (prompt logprobs, scoring); the last one only on
    # the chunk that samples.
    return "forward" if params.get("positions") == "all" else "final"


def _describe_logits(node, binding, kind):
    pos, dtype = node.params["positions"], node.params["dtype"]
    vocab = binding.config.get("vocab_size") or binding.config.get("text_config", {}).get("vocab_size") or "?"
    if binding.lowering != "fast":
        which = "every position" if pos == "all" else "the last position"
        return (f"{which} of the model's own logits, vocab {vocab}, {dtype}"
                + (" (non-final chunks evaluate only the cache writes)" if pos == "last" else ""))
    lazy = " (lazy: computed only when a reader evaluates it)" if pos == "all" else ""
    return f"norm + lm_head on {pos} position(s), vocab {vocab}, {dtype}{lazy}"


@register_op("logits", inputs=(HIDDEN,), output=LOGITS, phase=_logits_phase, describe=_describe_logits,
             params={
                 "positions": Param(str, "last", choices=("last", "all"),
                                    doc="`last`: [B, V] for the sampled position; `all`: [B, L, V] for every position"),
                 "dtype": Param(str, "float32", choices=("float32", "model"),
                                doc="float32, or the model's own logits dtype"),
             },
             doc="final norm + LM head")
def logits(ctx, node, h):
    last = node.params["positions"] == "last"
    at = ctx.inputs.sample_at if ctx.inputs.final and ctx.inputs.sample_at is not None else -1
    if _generic(ctx):
        out = h[:, at, :] if last else h
    else:
        if last:  # norm + head on the sampled position only
            h = h[:, at:at + 1, :] if at >= 0 else h[:, -1:, :]
        adapter, mm = ctx.binding.adapter, ctx.inputs.matmul
        w = adapter.head_weight() if mm is not None else None
        h = adapter.norm(h)
        out = adapter.head(h) if w is None else mm(h, w)
        if last:
            out = out[:, -1, :]
    if node.params["dtype"] == "float32":
        if out.dtype != mx.float32:  # what unedited greedy / fused selection reads (registry.model_dtype_key)
            ctx.values[model_dtype_key(node.id)] = out
        out = out.astype(mx.float32)
    return out
