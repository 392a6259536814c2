"""Fused decode blocks: an architecture's fast path for the compiled decode step.

MLX's matmul for 2..64 rows costs about the same per call whatever its width
(docs/performance.md, the matmul table), so a llama block that runs q/k/v and gate/up as
one matmul each (4 calls a layer instead of 7) decodes faster. The adapter (compiler/archs.py
`ArchAdapter.fused_decode`) supplies the block; the compiled decode path
(runtime/compiled_decode.py) runs it through the cache contract in contracts/decode_block.py.

Quantized projections are stacked the same way when all seven share one format (group size,
bits, mode): their packed rows, scales and biases concatenate into one quantized matmul.

The fused matrices are graphc's own arrays: the model object and its parameters are left
exactly as loaded (the uncompiled path, the user's code and `model.parameters()` see what
they always did). The price is a second copy of the fused projections, which `note` (and so
`graphc inspect`) states; `decode: {fuse_projections: false}` avoids it.

`llama_block(layer, None, ...)` is the same block on the layer's own projection modules (no
copies): what a cache with an attention kernel runs a layer through where no fused block is
held (`ArchAdapter.own_block`; runtime/kernel_views.py, runtime/compiled_decode.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.activations import swiglu


class FusedBlocks:
    """{id(layer): fused weights} for the layers that have a fused block, and how to run one."""

    def __init__(self, weights: dict, run, *, total: int, what: str = "", reason: str | None = None):
        self.weights = weights
        self._run = run
        self.total = total  # layers in the model
        self.what = what  # e.g. "q/k/v + gate/up"
        self.reason = reason  # why some (or all) layers have none

    @classmethod
    def none(cls, reason: str, total: int = 0) -> "FusedBlocks":
        return cls({}, None, total=total, reason=reason)

    def __len__(self) -> int:
        return len(self.weights)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for w in self.weights.values() for v in w.values()
                   for a in (v.arrays() if isinstance(v, _QuantizedRows) else [v] if isinstance(v, mx.array) else []))

    def run(self, layer, h: mx.array, cache):
        """The layer's output through its fused block, or None when it has none."""
        w = self.weights.get(id(layer))
        return None if w is None else self._run(layer, w, h, cache)

    @property
    def note(self) -> str:
        """What inspect says: how many blocks are fused and what that holds, or why none are."""
        if not self.weights:
            return f"no fused blocks: {self.reason}"
        out = (f"fused {self.what} in {len(self.weights)} of {self.total} blocks "
               f"(+{self.nbytes / 2**20:.1f} MiB of fused weights held by graphc; the model is untouched)")
        return out + (f"; others: {self.reason}" if self.reason and len(self.weights) < self.total else "")


def llama_not_own_block(layer) -> str | None:
    """Why graphc cannot run this layer as its own llama block (`llama_block`, attention through
    `cache.attend`) on the layer's own projections (None when it can)."""
    a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if type(layer) is not llama.TransformerBlock or type(a) is not llama.Attention or type(m) is not llama.MLP:
        return f"{type(layer).__name__} is not mlx-lm's llama TransformerBlock"
    if getattr(layer, "use_sliding", False):
        return "a sliding-window layer"
    return None


def llama_unfusable(layer) -> str | None:
    """Why this layer cannot run as the fused llama block (None when it can)."""
    why = llama_not_own_block(layer)
    if why is not None:
        return why
    a, m = layer.self_attn, layer.mlp
    projs = [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    if any("bias" in p for p in projs):
        return "biased projections (the fused block has no bias terms)"
    if all(type(p) is nn.Linear for p in projs):
        return None
    other = sorted({type(p).__name__ for p in projs} - {"Linear", "QuantizedLinear"})
    if other:  # e.g. a LoRA adapter's LoRALinear: run through the layer's own modules
        return f"{', '.join(other)} projections (the fused block stacks plain or quantized matrices only)"
    if all(type(p) is nn.QuantizedLinear for p in projs):
        if len({_quant_format(p) for p in projs}) > 1:
            return "projections quantized with different group sizes, bits or modes"
        return None
    return "projections of mixed kinds (plain and quantized)"


def _quant_format(p) -> tuple:
    return p.group_size, p.bits, getattr(p, "mode", "affine")


class _QuantizedRows:
    """Quantized matrices stacked by output rows, multiplied as one: `x @ W.T` for each part's
    rows, in one quantized matmul (each output row's dot product is its own part's)."""

    def __init__(self, parts: list):
        self.group_size, self.bits, self.mode = _quant_format(parts[0])
        self.weight = mx.concatenate([p.weight for p in parts])
        self.scales = mx.concatenate([p.scales for p in parts])
        self.biases = mx.concatenate([p.biases for p in parts]) if parts[0].get("biases") is not None else None

    def arrays(self) -> list:
        return [a for a in (self.weight, self.scales, self.biases) if a is not None]

    def __call__(self, x):
        return mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                   group_size=self.group_size, bits=self.bits, mode=self.mode)


def llama_blocks(layers: list) -> FusedBlocks:
    """Fused q/k/v and gate/up matrices for every llama block that can take them."""
    weights, reasons = {}, []
    for layer in layers:
        why = llama_unfusable(layer)
        if why is not None:
            reasons.append(why)
            continue
        a, m = layer.self_attn, layer.mlp
        if type(a.q_proj) is nn.QuantizedLinear:  # stacked quantized rows (same format, checked above)
            qkv, gu = _QuantizedRows([a.q_proj, a.k_proj, a.v_proj]), _QuantizedRows([m.gate_proj, m.up_proj])
            mx.eval(*qkv.arrays(), *gu.arrays())
        else:
            qkv = mx.concatenate([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            gu = mx.concatenate([m.gate_proj.weight, m.up_proj.weight])
            mx.eval(qkv, gu)  # materialized now: the model's arrays are only read, never replaced
        weights[id(layer)] = {"qkv": qkv, "gate_up": gu}  # rows: q, k, v heads of one head dim
    reason = "; ".join(sorted(set(reasons))) or None
    return FusedBlocks(weights, llama_block, total=len(layers), what="q/k/v + gate/up", reason=reason)


def llama_block(layer, w: dict | None, x: mx.array, cache) -> mx.array:
    """mlx-lm's llama TransformerBlock with its K/V write and attention through `cache.attend_new`
    (a kernel where the cache has one). `w`: fused q/k/v and gate/up matrices (each one matmul, same dot
    products); None: the layer's own projection modules, quantized or not — every op but the
    attention is then the one mlx-lm's block runs."""
    a = layer.self_attn
    B, L, _ = x.shape
    xn = layer.input_layernorm(x)
    if w is None:
        q, k, v = a.q_proj(xn), a.k_proj(xn), a.v_proj(xn)
        q = q.reshape(B, L, a.n_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = a.rope(q, offset=cache.offset)
        k = a.rope(k, offset=cache.offset)
    else:
        # The fused row holds every head of q, k and v ([B, L, Hq + 2 Hkv, D]). RoPE turns each head
        # alone, at the same positions, so the q and k heads go through it as one array: one
        # launch a layer instead of two, the same numbers.
        heads = _rows(cache, xn, w["qkv"]).reshape(B, L, a.n_heads + 2 * a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        qk = a.rope(heads[:, : a.n_heads + a.n_kv_heads], offset=cache.offset)
        q, k, v = qk[:, : a.n_heads], qk[:, a.n_heads:], heads[:, a.n_heads + a.n_kv_heads:]
    o = cache.attend_new(q, k, v, a.scale).transpose(0, 2, 1, 3).reshape(B, L, -1)
    if w is None:
        h = x + a.o_proj(o)
        return h + layer.mlp(layer.post_attention_layernorm(h))
    quantized = isinstance(w["qkv"], _QuantizedRows)  # then o_proj / down_proj run as the model's modules
    h = (x + a.o_proj(o)) if quantized else cache.plus_matmul(x, o, a.o_proj.weight)
    g, u = mx.split(_rows(cache, layer.post_attention_layernorm(h), w["gate_up"]), 2, axis=-1)
    act = swiglu(g, u)  # mlx-lm's MLP activation
    return (h + layer.mlp.down_proj(act)) if quantized else cache.plus_matmul(h, act, layer.mlp.down_proj.weight)


def _rows(cache, x, w):
    """x @ W.T for fused rows: one quantized matmul, or the cache's matmul (MLX's or the skinny kernel)."""
    return w(x) if isinstance(w, _QuantizedRows) else cache.matmul(x, w)
