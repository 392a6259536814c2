"""Gumbel noise keyed by (row seed, position, token id).

Key layout (the contract; docs/sampling.md repeats it):

    seed64  = seed mod 2**64            (Python int; negative seeds wrap)
    seed_lo = seed64 & 0xFFFFFFFF       -> the murmur seed
    seed_hi = seed64 >> 32
    h       = MurmurHash3_x86_32(le32(seed_hi) ++ le32(position) ++ le32(token_id),
                                 seed=seed_lo)                # 12-byte key
    u       = clip((float32(h) + 0.5) * 2**-32, 2**-32, 1 - 2**-24)
    g       = -log(-log(u))                                   # float32

``position`` is the index the sampled token will occupy in its request's
sequence (prompt tokens are 0..L-1, so the first generated token is L).

Because the noise is a function of the token id — not of where the token sits
in some candidate array — the candidate path and the full-vocabulary path see
the same noise for the same token, and a seeded row draws the same tokens
wherever it sits in whatever batch. The first two words depend only on the
row, so they are absorbed once per row (``row_noise_state``) and only the
token word is hashed per element.

The clip matters: float32(h) rounds up to 2**32 for h near 2**32-1, u = 1 would
give g = +inf, and u = 0 would give -inf.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .murmur import murmur3_32_words_py, murmur_absorb, murmur_finalize

KEY_BYTES = 12
U_MIN = 2.0**-32
U_MAX = 1.0 - 2.0**-24


def split_seed(seed: int) -> tuple[int, int]:
    """Python seed -> (seed_lo, seed_hi) uint32 words."""
    s = int(seed) % (1 << 64)
    return s & 0xFFFFFFFF, s >> 32


def _row_state(seed_lo, seed_hi, positions):
    h = murmur_absorb(seed_lo.astype(mx.uint32), seed_hi.astype(mx.uint32))
    return murmur_absorb(h, positions.astype(mx.uint32))


_row_state_c = mx.compile(_row_state, shapeless=True)


def row_noise_state(seed_lo: mx.array, seed_hi: mx.array, positions: mx.array) -> mx.array:
    """Murmur state after absorbing [seed_hi, position]: uint32 ``[B]`` (one
    fused kernel instead of ~16 tiny ones)."""
    return _row_state_c(seed_lo, seed_hi, positions)


def _hash_uniform(state: mx.array, token_ids: mx.array) -> mx.array:
    h = murmur_finalize(murmur_absorb(state, token_ids), KEY_BYTES)
    u = (h.astype(mx.float32) + 0.5) * (2.0**-32)
    return mx.clip(u, U_MIN, U_MAX)


# Elementwise only, so shapeless compile is safe as long as the call sites keep
# one broadcast pattern (state [b, 1], token ids [b, n]); fusing the ~20 uint32
# ops into one kernel is ~4x faster on CPU than running them one by one.
_hash_uniform_c = mx.compile(_hash_uniform, shapeless=True)


def uniform_noise(state: mx.array, token_ids: mx.array) -> mx.array:
    """u in [2**-32, 1-2**-24] (float32) for ``state [b]`` x ``token_ids [b, n]``."""
    b = state.shape[0]
    tok = mx.broadcast_to(token_ids.astype(mx.uint32), (b, token_ids.shape[-1]))
    return _hash_uniform_c(state.astype(mx.uint32)[:, None], tok)


def gumbel_noise(state: mx.array, token_ids: mx.array) -> mx.array:
    """Standard Gumbel noise, float32 ``[b, n]``, for ``state [b]`` and ``token_ids [b, n]``."""
    return gumbel_from_uniform(uniform_noise(state, token_ids))


def gumbel_from_uniform(u: mx.array) -> mx.array:
    """-log(-log(u)): the Gumbel noise of uniform noise ``u`` (also of the top-ranks kernel's u)."""
    # The two logs stay outside the compiled kernel: mlx's unfused log is
    # vectorised and was faster than the fused version on CPU.
    return -mx.log(-mx.log(u))


def gumbel_noise_py(seed: int, position: int, token_id: int) -> float:
    """Host reference of one noise value (float64 logs of the float32 u)."""
    lo, hi = split_seed(seed)
    h = murmur3_32_words_py([hi, position, token_id], lo)
    u = np.float32(np.float32(h) + np.float32(0.5)) * np.float32(2.0**-32)
    u = float(min(max(u, np.float32(U_MIN)), np.float32(U_MAX)))
    return -math.log(-math.log(u))
