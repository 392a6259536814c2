"""The filters and the Gumbel-max over ranked candidates: which ranks a row keeps, and its token.

A row's kept set is always a prefix of the rank order (ranks.py):

    keep(r) = r < top_k
              and (top_p >= 1 or excl_cumsum_r < top_p * Z)   # Z = mass of the top-k ranks
              and s_r - s_0 >= log(min_p)                        # s = logit / T

Then token = argmax over kept ranks of s_r + g(seed, position, id_r). Noise is keyed by
token id (noise.py), so a row picks the same token on either path.

Here rather than in runtime/sampling/: the Gumbel-choose kernel (runtime/kernels/
gumbel_choose.py) is checked against `choose` and `top_p_sums`, and a kernel imports no
sampling module (tests/test_imports.py).
"""

from __future__ import annotations

import mlx.core as mx

from .ranks import const_arange

_NEG_INF = float("-inf")


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
