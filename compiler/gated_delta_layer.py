"""qwen3_next's gated-delta decoder layer over a prompt chunk, its recurrence chunkwise.

mlx-lm's Qwen3NextGatedDeltaNet.__call__ (mlx_lm/models/qwen3_next.py) calls
`gated_delta_update`, which off Metal steps through the chunk one position at a time. This is
that layer's code with one change: the recurrence is compiler/gated_delta_chunked.py's. The
projections, the convolution and its cache tail, q/k normalization, the gates and the output
norm are the layer's own modules and mlx-lm's own helpers, in mlx-lm's order. It serves only
where the plan's "linear attention (prompt chunks)" choice is `chunked`
(compiler/passes/prefill_choices.py), for chunks of more than one position; decode steps and
every other layer run as mlx-lm's modules.
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import compute_g, normalize_qk

from .gated_delta_chunked import gated_delta_chunked

# The mlx-lm classes this file re-states (checked by name: a change of mlx-lm's layer shows up as
# a refusal here and in the plan, never as a silently different forward).
LINEAR_ATTENTION = "Qwen3NextGatedDeltaNet"
DECODER_LAYER = "Qwen3NextDecoderLayer"


def why_not_chunked(layer) -> str | None:
    """Why this decoder layer cannot run its prompt chunks here (None: it can)."""
    attn = getattr(layer, "linear_attn", None)
    if attn is None:
        return None  # not a linear-attention layer: nothing to replace
    if type(layer).__name__ != DECODER_LAYER:
        return f"its decoder layer is {type(layer).__name__}, not mlx-lm's {DECODER_LAYER}"
    if type(attn).__name__ != LINEAR_ATTENTION:
        return f"its linear attention is {type(attn).__name__}, not mlx-lm's {LINEAR_ATTENTION}"
    return None


def decoder_layer_chunked(layer, x, mask, cache):
    """Qwen3NextDecoderLayer.__call__ for a linear-attention layer, the recurrence chunkwise."""
    h = x + gated_delta_net_chunked(layer.linear_attn, layer.input_layernorm(x), mask, cache)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def gated_delta_net_chunked(attn, inputs, mask, cache):
    """Qwen3NextGatedDeltaNet.__call__ (eval mode) with gated_delta_chunked as its recurrence."""
    B, S, _ = inputs.shape
    q, k, v, z, b, a = attn.fix_query_key_value_ordering(attn.in_proj_qkvz(inputs), attn.in_proj_ba(inputs))
    if cache is not None and cache[0] is not None:
        conv_state = cache[0]
    else:
        conv_state = mx.zeros((B, attn.conv_kernel_size - 1, attn.conv_dim), dtype=inputs.dtype)
    mixed_qkv = mx.concatenate([q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], axis=-1)
    if mask is not None:
        mixed_qkv = mx.where(mask[..., None], mixed_qkv, 0)
    conv_input = mx.concatenate([conv_state, mixed_qkv], axis=1)
    if cache is not None:
        n_keep = attn.conv_kernel_size - 1
        if cache.lengths is not None:
            ends = mx.clip(cache.lengths, 0, S)
            positions = (ends[:, None] + mx.arange(n_keep))[..., None]
            cache[0] = mx.take_along_axis(conv_input, positions, axis=1)
        else:
            cache[0] = mx.contiguous(conv_input[:, -n_keep:, :])
    conv_out = nn.silu(attn.conv1d(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [attn.key_dim, 2 * attn.key_dim], -1),
            [attn.num_k_heads, attn.num_k_heads, attn.num_v_heads],
            [attn.head_k_dim, attn.head_k_dim, attn.head_v_dim],
        )
    ]
    state = cache[1] if cache else None
    q, k = normalize_qk(q, k, inv_scale=attn.head_k_dim**-0.5, eps=1e-6)
    # gated_delta_update's gates, then its recurrence in chunkwise form
    beta = mx.sigmoid(b)
    g = compute_g(attn.A_log, a, attn.dt_bias)
    out, state = gated_delta_chunked(q, k, v, g, beta, state, mask)
    if cache is not None:
        cache[1] = state
        cache.advance(S)
    out = attn.norm(out, z)
    return attn.out_proj(out.reshape(B, S, -1))


class _ChunkedPrompts(nn.Module):
    """Stands in for a layer's Qwen3NextGatedDeltaNet while the self-check's reference runs:
    prompt chunks (more than one position) through gated_delta_net_chunked, single positions
    through the layer itself, as graphc's chunked prefill and its decode steps run them."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def __call__(self, x, mask=None, cache=None):
        if x.shape[1] > 1:
            return gated_delta_net_chunked(self.attn, x, mask, cache)
        return self.attn(x, mask, cache)


@contextmanager
def chunked_reference(layers):
    """mlx-lm's own forward, for as long as the block runs, with the chunked recurrence in its
    gated-delta layers' prompt chunks: what an engine that asks for linear_prefill="chunked" is
    checked against (compiler/compile.py). It swaps the layers' `linear_attn` on this model
    instance only (never mlx-lm's module globals: another engine in the process keeps its own
    forward) and puts them back."""
    swapped = [(layer, layer.linear_attn) for layer in layers if hasattr(layer, "linear_attn")
               and why_not_chunked(layer) is None]
    try:
        for layer, attn in swapped:
            layer.linear_attn = _ChunkedPrompts(attn)
        yield len(swapped)
    finally:
        for layer, attn in swapped:
            layer.linear_attn = attn


__all__ = ["chunked_reference", "decoder_layer_chunked", "gated_delta_net_chunked", "why_not_chunked"]
