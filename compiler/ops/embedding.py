"""Embedding ops: pool the final hidden states of each row into one vector, then normalize.

graphs/embed.yaml wires them: embed -> attention -> pool -> normalize. Rows arrive
left-padded (`StepInputs.pads`: pad count per row), so `mean` averages only a row's real
positions, `last` is the last column and `cls` the row's first real token.
"""

from __future__ import annotations

import mlx.core as mx

from .forward import final_hidden
from .registry import EMBEDDINGS, HIDDEN, Param, register_op

POOLING = ("mean", "last", "cls")


def _describe_pool(node, binding, kind):
    how = {"mean": "mean over each row's real (unpadded) positions", "last": "the last position",
           "cls": "each row's first real token"}[node.params["method"]]
    return f"final norm, then {how} -> [B, {binding.config.get('hidden_size', '?')}] float32"


@register_op("pool", inputs=(HIDDEN,), output=EMBEDDINGS, phase="final", describe=_describe_pool,
             params={"method": Param(str, "mean", choices=POOLING, doc="how a row's positions become one vector")},
             doc="one vector per row from the final hidden states")
def pool(ctx, node, h):
    h = final_hidden(ctx, h).astype(mx.float32)  # [B, L, D]
    B, L, _ = h.shape
    pads = ctx.inputs.pads or [0] * B
    method = node.params["method"]
    if method == "last":
        return h[:, -1, :]
    if method == "cls":
        return h[mx.arange(B), mx.array(pads, dtype=mx.int32)]
    keep = (mx.arange(L)[None, :] >= mx.array(pads, dtype=mx.int32)[:, None]).astype(mx.float32)  # [B, L]
    return (h * keep[:, :, None]).sum(axis=1) / keep.sum(axis=1, keepdims=True)


def _describe_normalize(node, binding, kind):
    return "truncate to the request's `dimensions` (when given), then divide by the L2 norm"


@register_op("normalize", inputs=(EMBEDDINGS,), output=EMBEDDINGS, phase="final", describe=_describe_normalize,
             doc="unit L2 norm (after truncating to the requested dimensions)")
def normalize(ctx, node, x):
    dims = (ctx.inputs.options or {}).get("dimensions")
    if dims is not None:
        x = x[:, :dims]
    return x / mx.maximum(mx.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
