"""Token selection for mixed batches: greedy argmax and filtered Gumbel-max.

All functions here are pure lazy mx ops on batched arrays; branching happens
only on host flags of ``SamplingTensors`` while the graph is built.

Rank order. Filters are defined on one total order of the vocabulary: edited
logit descending, ties broken by lower token id. It is realised as a uint64 key
``(orderable_bits(float32 logit) << 32) | (0xFFFFFFFF - token_id)`` so that
top-k over keys gives exactly the first k ranks, with no tie ambiguity. Both the
candidate path (top-K keys, then sort K) and the full path (sort all V keys)
therefore see the same prefix of ranks for the same row, and the kept set of a
row is always a prefix of that order:

    keep(r) = r < top_k
              and (top_p >= 1 or excl_cumsum_r < top_p * Z)   # Z = mass of the top-k ranks
              and s_r - s_0 >= log(min_p)                        # s = logit / T

Then token = argmax over kept ranks of s_r + g(seed, position, id_r). Noise is
keyed by token id, so a row picks the same token on either path.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import mlx.core as mx

from .noise import gumbel_noise, row_noise_state
from .kinds import CANDIDATES, FULL, GREEDY, PLAIN

if TYPE_CHECKING:  # annotations only: tensors.py builds fused rows, whose selection uses this module
    from .tensors import RowGroup, SamplingTensors

_NEG_INF = float("-inf")


# --------------------------------------------------------------------------
# rank keys
# --------------------------------------------------------------------------


_NEG_ZERO = 0x80000000


def _order_keys(b: mx.array, ids: mx.array) -> mx.array:
    # -0.0 ranks as +0.0 (so ties between them fall to the lower id, as argmax has it: a greedy
    # row's rank 0 is its argmax), then IEEE order -> unsigned order: flip every bit of
    # negatives, the sign bit of positives.
    b = mx.where(b == mx.array(_NEG_ZERO, mx.uint32), mx.array(0, mx.uint32), b)
    neg = (b >> mx.array(31, mx.uint32)) == mx.array(1, mx.uint32)
    o = mx.where(neg, ~b, b | mx.array(0x80000000, mx.uint32))
    return (o.astype(mx.uint64) << mx.array(32, mx.uint64)) | (
        mx.array(0xFFFFFFFF, mx.uint32) - ids
    ).astype(mx.uint64)


# Elementwise only: one fused kernel instead of ~8 passes over [b, V].
_order_keys_c = mx.compile(_order_keys, shapeless=True)


def rank_keys(x: mx.array) -> mx.array:
    """uint64 [b, V] keys whose descending order is the rank order of ``x [b, V]``."""
    b, v = x.shape
    ids = mx.broadcast_to(mx.arange(v, dtype=mx.uint32)[None], (b, v))
    # The bit view stays outside the compiled function: View has no shapeless form.
    return _order_keys_c(x.astype(mx.float32).view(mx.uint32), ids)


def ids_from_keys(keys: mx.array) -> mx.array:
    """The token ids int32 of `rank_keys`' keys: the low word holds 0xFFFFFFFF - id."""
    low = (keys & mx.array(0xFFFFFFFF, mx.uint64)).astype(mx.uint32)
    return (mx.array(0xFFFFFFFF, mx.uint32) - low).astype(mx.int32)


def decode_neg_keys(nk: mx.array) -> tuple[mx.array, mx.array]:
    """(ids int32, float32 values) from ~(rank keys), without a gather from the logits: the
    low word of ~key is the id itself (~(0xFFFFFFFF - id) = id); the high word inverts the
    order map (-0.0 comes back as +0.0, which compares and scales the same)."""
    ids = (nk & mx.array(0xFFFFFFFF, mx.uint64)).astype(mx.int32)
    o = ~(nk >> mx.array(32, mx.uint64)).astype(mx.uint32)
    pos = (o >> mx.array(31, mx.uint32)) == mx.array(1, mx.uint32)
    return ids, mx.where(pos, o & mx.array(0x7FFFFFFF, mx.uint32), ~o).view(mx.float32)


def float_bits(x: mx.array) -> mx.array:
    """uint32 bits of float32(x). bf16 is the top half of a float32, so its bits are a shift
    (fused with what follows under mx.compile) instead of a float32 copy of x."""
    if x.dtype == mx.bfloat16:
        return x.view(mx.uint16).astype(mx.uint32) << mx.array(16, mx.uint32)
    if x.dtype == mx.float32:
        return x.view(mx.uint32)
    return x.astype(mx.float32).view(mx.uint32)


@functools.lru_cache(maxsize=None)
def const_arange(n: int, dtype=mx.uint32) -> mx.array:
    """An evaluated arange: inside mx.compile a captured array is a constant, not a node."""
    a = mx.arange(n, dtype=dtype)
    mx.eval(a)
    return a


# How the candidate path finds its first K ranks: "topk" (mx.topk over the
# keys, then sort K) or "sort" (sort all V keys, keep K). Both give the same
# ranks bit for bit. On the H200 the top_k=50 candidate path measured slower
# than the whole full-sort path at B = 1 (0.48 vs 0.29 ms) and faster at
# B = 256 (0.99 vs 1.58 ms); the primitives were not timed apart, so measure
# before flipping this.
CANDIDATE_SELECT = "topk"


# Block width of the two-level candidate search (`_block_candidates`). The ranks found do
# not depend on it; the cost does: [b, V / BLOCK] block keys to partition against
# [b, width * BLOCK] gathered keys to partition. On CPU at [64, 128256], width 64, the whole
# search took (ms, float32 / bf16 logits) 30 / 43 at 16, 24 / 39 at 32, 25 / 45 at 64 and
# 33 / 54 at 128, against 25 / 48 for the greedy argmax (docs/performance.md, "Sampling
# cost"): 32. Not measured on a GPU yet.
BLOCK = 32


def uses_blocks(v: int, width: int) -> bool:
    """Whether the first ``width`` ranks of a ``v``-wide row are found block-wise."""
    return width < v and CANDIDATE_SELECT == "topk" and -(-v // BLOCK) >= 4 * width


def _block_candidates(x: mx.array, width: int) -> mx.array:
    """Rank keys of the first ``width`` ranks of each row, descending, without a top-k over V.

    The vocabulary is cut into blocks of BLOCK tokens. Every token among the first
    ``width`` ranks is at least the best token of its block, so those blocks' best tokens
    are themselves among the first ``width`` ranks: the wanted tokens all lie in the
    ``width`` blocks whose best tokens rank first. Blocks are ordered by (max value
    descending, block index ascending) — the order of their best tokens, because every id
    of a lower block is lower — so one max per block (a plain reduction in x's own dtype,
    no argmax and no float32 copy of [b, V]), a partition over the [b, V / BLOCK] block
    keys, and a top-k over the width * BLOCK gathered keys give exactly the ranks a top-k
    over all V keys gives (keys are unique per row).
    """
    return ~_block_neg_keys(x, width)[:, :width]


def _block_neg_keys(x: mx.array, width: int) -> mx.array:
    # Works on ~key (bitwise not): the ascending order of ~key is the rank order, so the
    # partition and the sort below need no reversed copy.
    b, v = x.shape
    g = -(-v // BLOCK)
    if g * BLOCK != v:  # pad with -inf: a pad's id is above every real id, so it ranks after them
        x = mx.pad(x, [(0, 0), (0, g * BLOCK - v)], constant_values=_NEG_INF)
    blocks = x.reshape(b, g, BLOCK)
    best = mx.max(blocks, axis=-1)  # [b, g], x's dtype
    # low word 0xFFFFFFFF - block index: ties between equal block maxima go to the lower block
    bkeys = _order_keys(float_bits(best), const_arange(g)[None])
    top = mx.argpartition(~bkeys, width - 1, axis=-1)[:, :width]  # the width best blocks
    vals = mx.take_along_axis(blocks, top[..., None], axis=1).reshape(b, width * BLOCK)
    ids = (top.astype(mx.uint32)[..., None] * BLOCK + const_arange(BLOCK)).reshape(b, width * BLOCK)
    nk = ~_order_keys(float_bits(vals), ids)
    return mx.sort(mx.partition(nk, width - 1, axis=-1)[:, :width], axis=-1)


def first_rank_neg_keys(x: mx.array, width: int) -> mx.array:
    """~(rank keys) of the first ``width`` ranks of each row, ascending (= rank order):
    uint64 [b, width]. Pure mx ops with no data-dependent shape: callable inside mx.compile."""
    v = x.shape[-1]
    if uses_blocks(v, width):
        return _block_neg_keys(x, width)  # large vocabularies: no top-k over all V keys
    nk = ~_order_keys(float_bits(x), mx.broadcast_to(const_arange(v)[None], x.shape))
    if width < v and CANDIDATE_SELECT == "topk":
        return mx.sort(mx.partition(nk, width - 1, axis=-1)[:, :width], axis=-1)
    return mx.sort(nk, axis=-1)[:, :width]


def rank_order(x: mx.array, width: int) -> tuple[mx.array, mx.array]:
    """First ``width`` ranks of each row: (values in x's dtype [b, width], ids int32 [b, width])."""
    v = x.shape[-1]
    if uses_blocks(v, width):
        keys = _block_candidates(x, width)
    elif width < v and CANDIDATE_SELECT == "topk":
        keys = mx.sort(mx.topk(rank_keys(x), width, axis=-1), axis=-1)[:, ::-1]
    else:
        keys = mx.sort(rank_keys(x), axis=-1)[:, ::-1][:, :width]
    ids = ids_from_keys(keys)
    return mx.take_along_axis(x, ids, axis=-1), ids


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


def rank_masks(top_k: mx.array, n: int) -> tuple:
    """What `choose` derives from top_k alone, for rows whose top_k does not change between steps:
    (rank < top_k: bool [b, n], top_k - 1 clipped to the width: int32 [b, 1], zeros [b, 1])."""
    k = mx.minimum(top_k, n)[:, None]
    return const_arange(n, mx.int32)[None] < k, k - 1, mx.zeros((top_k.shape[0], 1), mx.float32)


def top_p_sums(s: mx.array, keep_k: mx.array | None) -> mx.array:
    """Inclusive prefix sums of exp(s - s_0) over the kept ranks (top-k), float32 [b, n]: the scan
    top-p compares against. The Gumbel-choose kernel (runtime/kernels/gumbel_choose.py) computes
    the same bits itself (the CUDA cumsum's order) and its check compares it with this."""
    p = mx.exp(s - s[:, :1])
    if keep_k is not None:
        p = mx.where(keep_k, p, 0.0)
    return mx.cumsum(p, axis=-1)


def choose(s, sid, g, top_k, top_p, log_min_p, *, use_top_k, use_top_p, use_min_p, masks=None):
    """The kept ranks (top-k, top-p, min-p) and Gumbel-max over them: the chosen ids int32 [b].
    ``s`` [b, n] float32: the first n ranks' logits / T, in rank order; ``sid`` their ids;
    ``g`` their Gumbel noise; ``masks``: `rank_masks(top_k, n)` computed once per batch (the
    fused path: three launches fewer a step), else derived here."""
    b, n = s.shape
    s0 = s[:, :1]
    keep = None
    keep_k, k_last, zero = masks if masks is not None else rank_masks(top_k, n)
    if use_top_k:
        keep = keep_k
    if use_top_p:
        c = top_p_sums(s, keep)
        # Z is read from the same scan as the prefix sums, so the two paths
        # (K-wide and V-wide rows share the first K prefix sums) agree bit for bit.
        z = mx.take_along_axis(c, k_last, axis=-1)
        excl = mx.concatenate([zero, c[:, :-1]], axis=1)
        tp = top_p[:, None]
        kp = (excl < tp * z) | (tp >= 1.0)
        keep = kp if keep is None else keep & kp
    if use_min_p:
        km = (s - s0) >= log_min_p[:, None]
        keep = km if keep is None else keep & km
    score = s + g
    if keep is not None:
        score = mx.where(keep, score, _NEG_INF)
    j = mx.argmax(score, axis=-1)[:, None]
    return mx.take_along_axis(sid, j, axis=-1)[:, 0]


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
        static["candidate_select"] = CANDIDATE_SELECT  # traced in, so part of the cache key
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
