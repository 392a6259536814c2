"""Additive logit edits: bias, bans, min_tokens, grammar masks, host processors.

Everything except ``apply_logits_processors`` is a pure lazy mx op, so a
chained step (N+1 built on step N's lazy outputs) stays exact: min_tokens reads
the per-row generated count as an array, not a host int.

Edits are applied after penalties and before logprobs and selection. A -inf
edit is final: the token is never sampled, never greedy-chosen, and its logprob
is -inf.
"""

from __future__ import annotations

from typing import Callable, Sequence

import mlx.core as mx
import numpy as np

_NEG_INF = float("-inf")

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def apply_sparse_edits(logits: mx.array, rows: mx.array, cols: mx.array, vals: mx.array) -> mx.array:
    """logits.at[rows, cols] += vals (one scatter; no dense [B, V] edit array)."""
    return logits.at[rows, cols].add(vals.astype(logits.dtype))


def min_tokens_values(n_generated: mx.array, eos_rows: mx.array, eos_min_tokens: mx.array) -> mx.array:
    """f32 [M]: -inf for EOS entries whose row has generated fewer than min_tokens."""
    n = mx.take(n_generated.astype(mx.int32), eos_rows)
    return mx.where(n < eos_min_tokens, _NEG_INF, 0.0).astype(mx.float32)


def apply_token_bitmask(logits: mx.array, bitmask: mx.array) -> mx.array:
    """Grammar masks in llguidance / xgrammar layout: int32 [B, ceil(V/32)],
    bit j of word w allows token 32*w + j. Disallowed tokens become -inf."""
    B, V = logits.shape
    words = bitmask.astype(mx.uint32)
    bits = (words[:, :, None] >> mx.arange(32, dtype=mx.uint32)) & mx.array(1, mx.uint32)
    allowed = bits.reshape(B, -1)[:, :V] != 0
    return mx.where(allowed, logits, mx.array(_NEG_INF, logits.dtype))


def apply_additive_mask(logits: mx.array, mask: mx.array) -> mx.array:
    """logits + mask, mask [B, V] (0 = allowed, -inf = forbidden, or any bias)."""
    return logits + mask.astype(logits.dtype)


def apply_edits(
    logits: mx.array,
    st,
    *,
    n_generated: mx.array | None = None,
    token_bitmask: mx.array | None = None,
    additive_mask: mx.array | None = None,
) -> mx.array:
    """Apply the batch's bias / bans / min_tokens (``st``: SamplingTensors) and
    an optional external grammar mask. Upcasts to float32 only when it edits."""
    x = logits
    if st.has_static_edits or st.has_min_tokens:
        x = x.astype(mx.float32)
        rows, cols, vals = [], [], []
        if st.has_static_edits:
            rows.append(st.edit_rows), cols.append(st.edit_cols), vals.append(st.edit_vals)
        if st.has_min_tokens:
            if n_generated is None:
                raise ValueError("this batch has min_tokens: pass n_generated [B]")
            rows.append(st.eos_rows), cols.append(st.eos_cols)
            vals.append(min_tokens_values(n_generated, st.eos_rows, st.eos_min_tokens))
        cat = (lambda a: a[0]) if len(rows) == 1 else mx.concatenate
        x = apply_sparse_edits(x, cat(rows), cat(cols), cat(vals))
    if token_bitmask is not None:
        x = apply_token_bitmask(x, token_bitmask)
    if additive_mask is not None:
        x = apply_additive_mask(x.astype(mx.float32), additive_mask)
    return x


def apply_logits_processors(
    logits: mx.array,
    processors: Sequence[Sequence[LogitsProcessor] | None],
    histories: Sequence[Sequence[int] | mx.array],
) -> mx.array:
    """Host path, NOT chain-safe: run per-row Python callables
    ``proc(token_ids_so_far, logits_row) -> logits_row``.

    ``token_ids_so_far`` is an int32 mx.array [n] (the row's prompt + generated
    ids, known on the host — that is what breaks chaining); ``logits_row`` is
    [1, V] float32, mlx-lm's convention, so mlx-lm's own processors work as is.
    Rows whose entry is None pass through untouched.
    """
    if all(p is None for p in processors):
        return logits
    x = logits.astype(mx.float32)
    rows = []
    for i, procs in enumerate(processors):
        row = x[i : i + 1]
        if procs:
            hist = histories[i]
            hist = hist if isinstance(hist, mx.array) else mx.array(np.asarray(hist, np.int32).reshape(-1))
            for proc in procs:
                row = proc(hist, row).astype(mx.float32)
        rows.append(row)
    return mx.concatenate(rows, axis=0)
