"""Token selection for mixed batches: greedy argmax and filtered Gumbel-max.

All functions here are pure lazy mx ops on batched arrays; branching happens
only on host flags of ``SamplingTensors`` while the graph is built.

This module is the policy: which path a row group takes (greedy, plain, candidates, full),
compiled per static configuration, and where a row's noise state comes from. The math the
paths share lives in runtime/token_math/: the rank order and a row's first ranks
(ranks.py), the filters and the Gumbel-max over ranked candidates (choose.py, whose rule
is written out there), the noise keyed by token id (noise.py) — so the candidate and the
full path pick the same token for the same row.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import mlx.core as mx

from ..token_math import ranks
from ..token_math.choose import choose
from ..token_math.noise import gumbel_noise, row_noise_state
from ..token_math.ranks import rank_order
from .kinds import CANDIDATES, FULL, GREEDY, PLAIN

if TYPE_CHECKING:  # annotations only: tensors.py builds fused rows, whose selection uses this module
    from .tensors import RowGroup, SamplingTensors

_NEG_INF = float("-inf")


# --------------------------------------------------------------------------
# per-group selectors
# --------------------------------------------------------------------------


def select_greedy(x: mx.array) -> mx.array:
    """Exact argmax (first index on ties, i.e. the lowest id), int32 [b]."""
    return mx.argmax(x, axis=-1).astype(mx.int32)


def _plain(x, inv_t, log_min_p, state, *, use_min_p: bool):
    s = x.astype(mx.float32) * inv_t[:, None]
    ids = mx.arange(x.shape[-1], dtype=mx.uint32)[None]
    score = s + gumbel_noise(state, ids)
    if use_min_p:
        keep = (s - mx.max(s, axis=-1, keepdims=True)) >= log_min_p[:, None]
        score = mx.where(keep, score, _NEG_INF)
    return mx.argmax(score, axis=-1).astype(mx.int32)


def choose_ranked(sv, sid, inv_t, top_k, top_p, log_min_p, state, *, use_top_k, use_top_p, use_min_p, masks=None):
    """`choose` over ranked candidates (values ``sv``, ids ``sid``, in rank order): scales them
    by 1/T and draws their Gumbel noise from ``state``; the grouped and the fused path share it."""
    s = sv.astype(mx.float32) * inv_t[:, None]
    return choose(s, sid, gumbel_noise(state, sid), top_k, top_p, log_min_p,
                  use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p, masks=masks)


def _ranked(x, inv_t, top_k, top_p, log_min_p, state, *, width, use_top_k, use_top_p, use_min_p, candidate_select=None):
    sv, sid = rank_order(x, min(width, x.shape[-1]))
    return choose_ranked(
        sv, sid, inv_t, top_k, top_p, log_min_p, state,
        use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p,
    )


# Each selector is compiled once per static configuration (and mx.compile
# re-traces per input shape). On a GPU the win is mostly fewer graph nodes and
# no per-step Python op construction: a sampled step is ~30 small ops, whose
# scheduling cost is comparable to the work itself at decode batch sizes.
COMPILE = True


def _compiled(fn, **static):
    if fn is _ranked:
        static["candidate_select"] = ranks.CANDIDATE_SELECT  # traced in, so part of the cache key
    return _compiled_cached(fn, COMPILE, **static)


@functools.lru_cache(maxsize=None)
def _compiled_cached(fn, compile_: bool, **static):
    f = functools.partial(fn, **static)
    return mx.compile(f) if compile_ else f


def select_plain(x: mx.array, g: RowGroup, state: mx.array) -> mx.array:
    """Temperature (and min_p): argmax(x / T + g) over the whole vocabulary, no
    sort. min_p compares against the row max — the same float the rank path
    calls s_0 — so it keeps exactly the tokens the rank rule keeps."""
    f = _compiled(_plain, use_min_p=g.use_min_p)
    return f(x, g.inv_temperature, g.log_min_p, state)


def _select_ranked(x: mx.array, g: RowGroup, state: mx.array, width: int) -> mx.array:
    f = _compiled(_ranked, width=width, use_top_k=g.use_top_k, use_top_p=g.use_top_p, use_min_p=g.use_min_p)
    return f(x, g.inv_temperature, g.top_k, g.top_p, g.log_min_p, state)


def select_candidates(x: mx.array, g: RowGroup, state: mx.array) -> mx.array:
    """Rows whose top_k bounds the kept set: work on the first ``g.width`` ranks."""
    return _select_ranked(x, g, state, g.width)


def select_full(x: mx.array, g: RowGroup, state: mx.array) -> mx.array:
    """Rows with top_p and no top_k <= CANDIDATE_MAX (or a larger top_k):
    full-vocabulary rank sort."""
    return _select_ranked(x, g, state, x.shape[-1])


# --------------------------------------------------------------------------
# batch entry point
# --------------------------------------------------------------------------


def noise_state(st: SamplingTensors, positions: mx.array, key: mx.array | None = None) -> mx.array:
    """uint32 [B] murmur state per row: the row's seed when it has one, else
    fresh words split from ``key`` (or from the global mx.random state when
    ``key`` is None), absorbed with the row's position. (An Engine's rows always carry a seed:
    their own or their request's noise seed, runtime/batch_sampling.py.)"""
    lo, hi = st.seed_lo, st.seed_hi
    if not st.all_seeded:
        if key is not None:
            rnd = mx.random.split(key, st.batch_size)
        else:
            rnd = mx.random.randint(0, 2**31 - 1, (st.batch_size, 2), dtype=mx.int32).astype(mx.uint32)
        if st.any_seeded:
            lo = mx.where(st.has_seed, lo, rnd[:, 0])
            hi = mx.where(st.has_seed, hi, rnd[:, 1])
        else:
            lo, hi = rnd[:, 0], rnd[:, 1]
    return row_noise_state(lo, hi, positions)


def select_group(x: mx.array, g: RowGroup, state: mx.array | None) -> mx.array:
    if g.kind == GREEDY:
        return select_greedy(x)
    if g.kind == PLAIN:
        return select_plain(x, g, state)
    if g.kind == CANDIDATES:
        return select_candidates(x, g, state)
    if g.kind == FULL:
        return select_full(x, g, state)
    raise ValueError(f"unknown selection group {g.kind!r}")


def select_tokens(
    logits: mx.array,
    st: SamplingTensors,
    positions: mx.array | None = None,
    key: mx.array | None = None,
) -> mx.array:
    """Choose one token per row. Returns int32 [B], lazy.

    logits     [B, V] any float dtype, already edited (penalties, bias, bans, masks)
    positions  int [B]: sequence index the chosen token will occupy (noise key);
               unused (may be None) when every row is greedy
    key        mx.random key for rows without a seed
    """
    if st.all_greedy:
        return select_greedy(logits)
    if positions is None:
        raise ValueError("positions are required when any row samples")
    if st.fused is not None:  # greedy and top-k rows only: one compiled selection, no gathers
        return st.fused.select(logits, st, positions, key)
    state = noise_state(st, positions, key)
    outs = []
    for g in st.groups:
        if g.rows is None:
            outs.append(select_group(logits, g, state))
        else:
            xs = mx.take(logits, g.rows, axis=0)
            ss = None if g.kind == GREEDY else mx.take(state, g.rows)
            outs.append(select_group(xs, g, ss))
    if len(outs) == 1:
        return outs[0]
    return mx.take(mx.concatenate(outs), st.inverse_perm)
