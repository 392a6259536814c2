"""Repetition / frequency / presence penalties over per-row token counts.

State is a count array ``[B, V]`` (int32): how many times each token occurred
in what the row's penalties see — its generated tokens, plus its prompt when
``penalize_prompt`` is set. The host builds it once per batch composition
(``build_token_counts``); after that ``update_token_counts`` adds each step's
chosen tokens lazily, so chained steps stay exact without the host.

Formula per row (applied in float32, on the raw logits, before any other edit):

    seen  = count > 0
    x     = where(seen, where(x > 0, x / rep, x * rep), x)   # CTRL, sign-aware
    x     = x - freq * count - pres * seen

Neutral values (rep 1, freq 0, pres 0) are exact identities, so rows without
penalties ride along unchanged in a batch that has some.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np


def build_token_counts(histories: Sequence[Sequence[int]], vocab_size: int) -> mx.array:
    """Host: int32 [B, V] occurrence counts of each row's history."""
    counts = np.zeros((len(histories), vocab_size), np.int32)
    for i, h in enumerate(histories):
        if len(h):
            counts[i] = np.bincount(np.asarray(h, np.int64), minlength=vocab_size)[:vocab_size]
    return mx.array(counts)


def penalty_history(params, prompt_ids: Sequence[int], generated_ids: Sequence[int]) -> list[int]:
    """The token history a row's penalties see (prompt only if ``penalize_prompt``)."""
    return (list(prompt_ids) if params.penalize_prompt else []) + list(generated_ids)


def update_token_counts(counts: mx.array, tokens: mx.array) -> mx.array:
    """Lazy: counts [B, V] + one-hot(tokens [B]). Pure (returns a new array)."""
    rows = mx.arange(counts.shape[0])
    return counts.at[rows, tokens.astype(mx.int32)].add(mx.array(1, counts.dtype))


def _penalize_all(x, counts, rep, freq, pres):
    c = counts.astype(mx.float32)
    seen = counts > 0
    x = mx.where(seen, mx.where(x > 0, x / rep, x * rep), x)
    return x - freq * c - pres * seen.astype(mx.float32)


def _penalize_rep(x, counts, rep):
    return mx.where(counts > 0, mx.where(x > 0, x / rep, x * rep), x)


def _penalize_add(x, counts, freq, pres):
    return x - freq * counts.astype(mx.float32) - pres * (counts > 0).astype(mx.float32)


# Elementwise: fused, one pass over [B, V] instead of ~8.
_penalize_all_c = mx.compile(_penalize_all, shapeless=True)
_penalize_rep_c = mx.compile(_penalize_rep, shapeless=True)
_penalize_add_c = mx.compile(_penalize_add, shapeless=True)


def apply_penalties(
    logits: mx.array,
    counts: mx.array,
    repetition: mx.array,
    frequency: mx.array,
    presence: mx.array,
    *,
    use_repetition: bool = True,
    use_additive: bool = True,
) -> mx.array:
    """float32 [B, V] penalised logits. ``repetition/frequency/presence`` f32 [B]."""
    x = logits.astype(mx.float32)
    rep = repetition.astype(mx.float32)[:, None]
    if use_repetition and use_additive:
        return _penalize_all_c(x, counts, rep, frequency[:, None], presence[:, None])
    if use_repetition:
        return _penalize_rep_c(x, counts, rep)
    if use_additive:
        return _penalize_add_c(x, counts, frequency[:, None], presence[:, None])
    return x


def penalize(logits: mx.array, st, counts: mx.array | None) -> mx.array:
    """Apply the batch's penalties (``st``: SamplingTensors); no-op without any."""
    if not st.has_penalties:
        return logits
    if counts is None:
        raise ValueError("this batch has penalties: pass its token counts [B, V]")
    return apply_penalties(
        logits,
        counts,
        st.repetition_penalty,
        st.frequency_penalty,
        st.presence_penalty,
        use_repetition=st.has_repetition_penalty,
        use_additive=st.has_additive_penalties,
    )
