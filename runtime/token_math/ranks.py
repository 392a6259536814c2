"""Rank keys: one total order of the vocabulary, as uint64 keys, and the first ranks of a row.

The order is edited logit descending, ties broken by lower token id. It is realised as a
uint64 key ``(orderable_bits(float32 logit) << 32) | (0xFFFFFFFF - token_id)`` so that
top-k over keys gives exactly the first k ranks, with no tie ambiguity. Both the candidate
path (top-K keys, then sort K) and the full path (sort all V keys) therefore see the same
prefix of ranks for the same row.

Pure lazy mx ops, below both the sampler (runtime/sampling/) and the kernels
(runtime/kernels/top_ranks.py, whose reference and check are these functions): a module
here imports no other graphc package, so the kernels stay leaves.
"""

from __future__ import annotations

import functools

import mlx.core as mx

_NEG_INF = float("-inf")

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
