"""A mixed step's decoder stack: the decode batch's rows and one prompt's chunk in one pass
(the decode plan's `mixed step` choice, `decode: {mixed_step: true}`; runtime/mixed_step.py runs it).

Why: on a GPU a prompt chunk's own forward costs about what a decode step costs whatever its
tokens (one launch per op, eager), and graphc's separate prompt forward also ends in a host read,
so a step that carries prompt work cost the running streams ~3.5x the decode step (H100, 1B:
docs/serving-bench.md, "Why ITL p99 stays above 1.5x the decode step"). Here the rows' tokens and
the chunk's tokens run as one [1, rows + n] sequence through every norm, projection and MLP (one
launch each for both parts), split only for RoPE, the K/V writes and attention, where each part
reads its own caches: the rows theirs (left-padded, through the eager step's attention kernel
where the plan chose it), the prompt its own.

Exact: each token's projections, norms and MLP are the same dot products as in its own forward,
so with a batch-invariant BLAS the tokens equal the separate forwards' (tests/test_mixed_step.py);
on a GPU, a matmul over more rows may round differently, as any change of batch does.

Where it applies is `why_not_mixable`, which the decode plan's `mixed step` choice reads; the runtime
obeys the choice (runtime/mixed_step.py).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention

from .fused_block import llama_not_own_block


def why_not_mixable(binding) -> str | None:
    """Why this model and graph cannot carry a prompt chunk in the decode forward (None when they
    can): the fast lowering, the graph's decoder reading the embedding alone (so this stack stands
    in for both), every layer mlx-lm's llama block, and every layer's cache plain K/V rows."""
    if binding.lowering != "fast":
        return "the generic lowering runs the model's own forward, one batch at a time"
    nodes = {n.id: n for n in binding.spec.nodes}
    stacks = [n for n in nodes.values() if n.op == "attention"]
    if len(stacks) != 1 or [nodes[i].op for i in stacks[0].inputs if i in nodes] != ["embed"]:
        return "the graph's decoder does not read the embedding alone"
    bad = sorted({why for why in map(llama_not_own_block, binding.adapter.layers) if why is not None})
    if bad:
        return "; ".join(bad) + " (the mixed block is mlx-lm's llama block)"
    caches = {p.name: p.new_cache() for p in binding.policies}
    odd = sorted(name for name, c in caches.items()
                 if getattr(c, "PLANES", None) != ("keys", "values") or not getattr(c, "batch_prefill", False))
    if odd:
        return f"policy {', '.join(map(repr, odd))} keeps other than plain K/V rows (quantized, paged or windowed)"
    return None


def _rows_attention(a, q, k, v, cache, mask):
    """The decode rows' write and attention: the cache's own (a kernel view's) or MLX's."""
    attend_new = getattr(cache, "attend_new", None)
    if attend_new is not None:
        return attend_new(q, k, v, a.scale)
    k, v = cache.update_and_fetch(k, v)
    return scaled_dot_product_attention(q, k, v, cache=cache, scale=a.scale, mask=mask)


def mixed_layer(layer, x: mx.array, rows: int, row_cache, prompt_cache, row_mask, prompt_mask,
                keep: int | None = None) -> mx.array:
    """One llama block over x [1, rows + n, hidden]: the first `rows` positions are one decode token
    per row of `row_cache`, the other n one prompt's chunk in `prompt_cache`.

    `keep`: None, every position goes on (a layer before the last); else the decoder's last layer,
    where only the rows and the chunk position `keep` are read after it (a final chunk's sampled
    position; -1: none, a middle chunk, whose K/V writes are all that stays): the other positions
    skip o_proj and the MLP, as the split final chunk does (compiler/ops/forward.py). A kept
    position before the chunk's end (pads after it) takes its row of the whole chunk's attention,
    so the attention shapes are the separate padded chunk's (on CUDA, a plan the warm-up built)."""
    a = layer.self_attn
    n = x.shape[1] - rows
    xn = layer.input_layernorm(x)
    q, k, v = a.q_proj(xn), a.k_proj(xn), a.v_proj(xn)

    def parts(t, heads):
        return (t[0, :rows].reshape(rows, 1, heads, -1).transpose(0, 2, 1, 3),
                t[:, rows:].reshape(1, n, heads, -1).transpose(0, 2, 1, 3))

    (qr, qp), (kr, kp), (vr, vp) = parts(q, a.n_heads), parts(k, a.n_kv_heads), parts(v, a.n_kv_heads)
    qr, kr = a.rope(qr, offset=row_cache.offset), a.rope(kr, offset=row_cache.offset)
    qp, kp = a.rope(qp, offset=prompt_cache.offset), a.rope(kp, offset=prompt_cache.offset)
    outs = [_rows_attention(a, qr, kr, vr, row_cache, row_mask)]
    kp, vp = prompt_cache.update_and_fetch(kp, vp)
    if keep is None:
        outs.append(scaled_dot_product_attention(qp, kp, vp, cache=prompt_cache, scale=a.scale, mask=prompt_mask))
    elif keep >= 0:
        if keep == n - 1:  # the chunk's last position sees every column: one query, no mask
            op = scaled_dot_product_attention(qp[:, :, -1:], kp, vp, cache=prompt_cache, scale=a.scale, mask=None)
        else:
            op = scaled_dot_product_attention(qp, kp, vp, cache=prompt_cache, scale=a.scale,
                                              mask=prompt_mask)[:, :, keep:keep + 1]
        outs.append(op)
        x = mx.concatenate([x[:, :rows], x[:, rows + keep:rows + keep + 1]], axis=1)
    else:
        x = x[:, :rows]
    o = mx.concatenate([t.transpose(0, 2, 1, 3).reshape(1, t.shape[0] * t.shape[2], -1) for t in outs], axis=1)
    h = x + a.o_proj(o)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def mixed_hidden(binding, row_tokens: mx.array, row_caches: list, prompt_tokens: mx.array, prompt_caches: list,
                 sample_at: int | None) -> tuple[mx.array, mx.array | None]:
    """The decoder stack over both parts: the rows' hidden states [rows, 1, hidden] and the chunk's
    at `sample_at` [1, 1, hidden] (None for a middle chunk: `sample_at` None), as the fast path's
    `attention` op gives them (before the final norm)."""
    adapter = binding.adapter
    rows, n = row_tokens.shape[0], prompt_tokens.shape[1]
    x = adapter.embed(mx.concatenate([row_tokens.reshape(1, rows), prompt_tokens], axis=1))
    first = prompt_caches[0]
    row_mask = row_caches[0].make_mask(1, window_size=None, return_array=False)
    prompt_mask = first.make_mask(n, window_size=None, return_array=False)
    keep = -1 if sample_at is None else sample_at
    layers = adapter.layers
    for i, (layer, rc, pc) in enumerate(zip(layers, row_caches, prompt_caches)):
        last = i == len(layers) - 1
        x = mixed_layer(layer, x, rows, rc, pc, row_mask, prompt_mask, keep if last else None)
    return x[0, :rows].reshape(rows, 1, -1), (x[:, rows:] if sample_at is not None else None)
