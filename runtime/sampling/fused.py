"""One compiled selection for a batch of greedy and top-k rows: no row gathers, no host work.

A batch whose rows are all greedy (temperature 0 or top_k 1) or candidates (top_k in
2..CANDIDATE_MAX, with any temperature / top-p / min-p) — the common serving mix — is
selected by one ``mx.compile``d function over the whole batch:

    ~keys of the first K ranks (block maxima, partition, gather, partition, sort)
      -> values and ids decoded from the keys (no gather from the logits)
      -> per-row noise state (seed or key words, absorbed with the position)
      -> temperature, top-k / top-p / min-p keep mask, Gumbel-max  (select.choose_ranked)

A greedy row is a row with top_k = 1 and temperature 1: its only kept rank is rank 0,
the argmax (lowest id on ties), whatever the noise. Every other row keeps exactly the
ranks the grouped path (select.select_candidates) keeps and sees the same noise, so a
seeded row draws the same token either way (tests/test_sampling_golden.py,
tests/test_sampling_fused.py).

The per-row parameters are device arrays built once per batch composition
(``FusedRows``, in ``SamplingTensors.fused``); the compiled function is traced once per
(batch size, vocabulary, logits dtype, K, filter flags, seeding), so a step re-runs a
cached trace. Batches with rows that need the whole vocabulary (temperature without
top_k: 'plain'; top_p without a small top_k: 'full') keep the grouped path.
"""

from __future__ import annotations

import functools

import attrs
import mlx.core as mx
import numpy as np

from ..kernels import gumbel_choose, top_ranks
from ..token_math.choose import choose, rank_masks
from ..token_math.murmur import murmur_absorb
from ..token_math.noise import gumbel_from_uniform
from ..token_math.ranks import decode_neg_keys, first_rank_neg_keys
from .kinds import CANDIDATES, GREEDY
from .select import choose_ranked

ALL, NONE, MIXED = "all", "none", "mixed"  # which rows carry a seed
_absorb = mx.compile(murmur_absorb, shapeless=True)  # elementwise: one kernel, once per batch composition


@attrs.frozen(eq=False)
class FusedRows:
    """Whole-batch selection parameters (row order = batch order), greedy rows folded in.

    width             K: the candidate count (power-of-two bucket of the largest top_k)
    inv_temperature   f32 [B]  1/T (1 for greedy rows)
    top_k             int32 [B] (1 for greedy rows, K when off)
    top_p             f32 [B]  (1 = off)
    log_min_p         f32 [B]  (-inf = off)
    use_*             host flags: does any row need that filter (static in the trace)
    seeding           'all' | 'none' | 'mixed'
    seed_state        uint32 [B] the murmur state after the row's two seed words (noise.py's
                      key layout), computed once: a step absorbs only the position
    kernel            host flag: the first K ranks, their scaled logits and noise come from the
                      CUDA top-ranks kernel (runtime/kernels/top_ranks.py; bit for bit MLX's
                      ops, checked here)
    masks             (rank < top_k [B, K], top_k - 1 [B, 1], zeros [B, 1]): choose.rank_masks,
                      built here once instead of in every step
    choose_kernel     host flag (with `kernel`): the top-p scan, the filters and Gumbel-max over the K
                      ranks run as one CUDA kernel too (runtime/kernels/gumbel_choose.py; the same
                      tokens as choose.choose, checked here)
    """

    width: int
    inv_temperature: mx.array
    top_k: mx.array
    top_p: mx.array
    log_min_p: mx.array
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool
    seeding: str
    seed_state: mx.array
    masks: tuple  # choose.rank_masks(top_k, K): fixed while the rows are
    kernel: bool = False
    choose_kernel: bool = False

    def select(self, logits: mx.array, st, positions: mx.array, key: mx.array | None) -> mx.array:
        """select.select_tokens for a batch these rows were built for (a method, so that select.py
        reaches the fused path through the value it is handed, not by importing this module)."""
        return fused_select(logits, st, positions, key)

    @classmethod
    def build(cls, kinds, groups, batch_size: int, has_seed: np.ndarray, seed_lo: mx.array,
              seed_hi: mx.array, vocab_size: int, kernel: bool = False) -> "FusedRows | None":
        """From the grouped form (tensors.py): None unless every row is greedy or candidates.
        ``kernel``: take the top-ranks kernel where it applies (CUDA, this width and vocabulary,
        and it matched MLX in this process)."""
        if not set(kinds) <= {GREEDY, CANDIDATES} or CANDIDATES not in kinds:
            return None
        cand = next(g for g in groups if g.kind == CANDIDATES)
        rows = np.array(cand.host_rows, np.int64)
        inv_t = np.ones(batch_size, np.float32)
        top_k = np.ones(batch_size, np.int32)
        top_p = np.ones(batch_size, np.float32)
        log_min_p = np.full(batch_size, -np.inf, np.float32)
        # The group's arrays are exactly what the grouped path feeds choose_ranked for these rows.
        inv_t[rows] = np.array(cand.inv_temperature)
        top_k[rows] = np.array(cand.top_k)
        top_p[rows] = np.array(cand.top_p)
        log_min_p[rows] = np.array(cand.log_min_p)
        any_greedy = len(rows) < batch_size
        top_k_arr = mx.array(top_k)
        n = min(cand.width, vocab_size)  # the ranks a step gets
        kernel = kernel and top_ranks_usable(vocab_size, cand.width)
        use_top_k = cand.use_top_k or any_greedy
        return cls(
            width=cand.width,
            inv_temperature=mx.array(inv_t),
            top_k=top_k_arr,
            top_p=mx.array(top_p),
            log_min_p=mx.array(log_min_p),
            use_top_k=use_top_k,
            use_top_p=cand.use_top_p,
            use_min_p=cand.use_min_p,
            seeding=ALL if has_seed.all() else NONE if not has_seed.any() else MIXED,
            seed_state=_absorb(seed_lo, seed_hi),
            masks=rank_masks(top_k_arr, n),
            kernel=kernel,
            choose_kernel=kernel and gumbel_choose_usable(cand.width, use_top_k, cand.use_top_p, cand.use_min_p),
        )


def top_ranks_usable(vocab_size: int, width: int) -> bool:
    """The top-ranks kernel takes this search and passed its check here (False off CUDA)."""
    return top_ranks.layout(vocab_size, width) is not None and top_ranks.check() is None


def gumbel_choose_usable(width: int, use_top_k: bool, use_top_p: bool, use_min_p: bool) -> bool:
    """The Gumbel-choose kernel takes this width and passed its check in this filter configuration
    here (False off CUDA)."""
    return gumbel_choose.usable(width, use_top_k, use_top_p, use_min_p)


def _fused(x, inv_t, top_k, top_p, log_min_p, seed_state, has_seed, positions, key, keep_k, k_last, zero, *,
           width, use_top_k, use_top_p, use_min_p, seeding, kernel, choose_kernel=False):
    masks = (keep_k, k_last, zero)
    h = seed_state
    if seeding != ALL:  # the words noise_state (select.py) draws for rows without a seed
        rnd = mx.random.split(key, x.shape[0])
        fresh = murmur_absorb(rnd[:, 0], rnd[:, 1])
        h = fresh if seeding == NONE else mx.where(has_seed, h, fresh)
    if kernel:  # one launch for the ranks, their scaled logits and their noise, bit for bit MLX's
        sid, s, u = top_ranks.candidates(x, width, inv_t, h, positions)
        if choose_kernel:  # the top-p scan, the filters and Gumbel-max in one more launch
            return gumbel_choose.choose(s, sid, u, top_k, top_p, log_min_p,
                                        use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p)
        return choose(s, sid, gumbel_from_uniform(u), top_k, top_p, log_min_p,
                      use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p, masks=masks)
    sid, sv = decode_neg_keys(first_rank_neg_keys(x, width))  # [B, K] in rank order
    state = murmur_absorb(h, positions.astype(mx.uint32))
    return choose_ranked(sv, sid, inv_t, top_k, top_p, log_min_p, state,
                     use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p, masks=masks)


# mx.compile keeps one trace per input shape / dtype under each static configuration, so a
# batch size seen before re-runs its trace; COMPILE = False runs the same ops eagerly (tests).
COMPILE = True


@functools.lru_cache(maxsize=None)
def _compiled(compile_: bool, **static):
    f = functools.partial(_fused, **static)
    return mx.compile(f) if compile_ else f


def fused_select(logits: mx.array, st, positions: mx.array, key: mx.array | None) -> mx.array:
    """Tokens int32 [B] for a batch with ``st.fused`` set (see the module doc); lazy."""
    f = st.fused
    h, seeding = f.seed_state, f.seeding
    if seeding != ALL and key is None:
        # No key (the runner always passes one): the words come from the global generator,
        # drawn outside the trace (its state is hidden), exactly as noise_state draws them.
        rnd = mx.random.randint(0, 2**31 - 1, (st.batch_size, 2), dtype=mx.int32).astype(mx.uint32)
        fresh = murmur_absorb(rnd[:, 0], rnd[:, 1])
        h = fresh if seeding == NONE else mx.where(st.has_seed, h, fresh)
        seeding = ALL
    fn = _compiled(COMPILE, width=f.width, use_top_k=f.use_top_k, use_top_p=f.use_top_p,
                   use_min_p=f.use_min_p, seeding=seeding, kernel=f.kernel, choose_kernel=f.choose_kernel)
    return fn(logits, f.inv_temperature, f.top_k, f.top_p, f.log_min_p, h, st.has_seed, positions,
              _NO_KEY if key is None else key, *f.masks)


_NO_KEY = mx.random.key(0)  # a placeholder input when every row is seeded (never read)
