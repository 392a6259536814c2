"""MurmurHash3_x86_32: a pure-Python reference and an mx port on uint32 words.

The sampler derives its Gumbel noise from this hash (see ``noise.py``), so the
mx port must agree with the reference bit for bit on every backend: it only
uses uint32 multiply / xor / shift, which wrap modulo 2**32 in mlx as in C.

The mx port hashes whole 32-bit little-endian words only (no byte tail) — that
is all the noise key needs. ``murmur_absorb`` and ``murmur_finalize`` are
exposed separately so callers can absorb per-row words once (on ``[B, 1]``)
and only absorb the per-token word on ``[B, K]``.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

C1 = 0xCC9E2D51
C2 = 0x1B873593
M5 = 0xE6546B64
F1 = 0x85EBCA6B
F2 = 0xC2B2AE35
MASK32 = 0xFFFFFFFF


# --------------------------------------------------------------------------
# Pure-Python reference (any byte string, tail included)
# --------------------------------------------------------------------------


def _rotl_py(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK32


def murmur3_32_bytes(data: bytes, seed: int = 0) -> int:
    """Reference MurmurHash3_x86_32 of ``data`` with a 32-bit ``seed``."""
    h = seed & MASK32
    n = len(data)
    nblocks = n // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * C1) & MASK32
        k = _rotl_py(k, 15)
        k = (k * C2) & MASK32
        h ^= k
        h = _rotl_py(h, 13)
        h = (h * 5 + M5) & MASK32
    tail = data[4 * nblocks :]
    k = 0
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * C1) & MASK32
        k = _rotl_py(k, 15)
        k = (k * C2) & MASK32
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * F1) & MASK32
    h ^= h >> 13
    h = (h * F2) & MASK32
    h ^= h >> 16
    return h


def murmur3_32_words_py(words: Sequence[int], seed: int = 0) -> int:
    """Reference hash of 32-bit words laid out little-endian (4 bytes each)."""
    data = b"".join((w & MASK32).to_bytes(4, "little") for w in words)
    return murmur3_32_bytes(data, seed)


# --------------------------------------------------------------------------
# mx port (uint32 arrays, broadcasting)
# --------------------------------------------------------------------------

_U = mx.uint32


def _c(v: int) -> mx.array:
    # Explicit uint32 constants: a bare Python int above 2**31 must not be
    # allowed to promote the computation to a wider or signed type.
    return mx.array(v, dtype=_U)


def _rotl(x: mx.array, r: int) -> mx.array:
    return (x << _c(r)) | (x >> _c(32 - r))


def murmur_absorb(h: mx.array, word: mx.array) -> mx.array:
    """One 4-byte block of the body loop: returns the new running state."""
    k = word.astype(_U) * _c(C1)
    k = _rotl(k, 15)
    k = k * _c(C2)
    h = h.astype(_U) ^ k
    h = _rotl(h, 13)
    return h * _c(5) + _c(M5)


def murmur_finalize(h: mx.array, nbytes: int) -> mx.array:
    """Length mix and fmix32."""
    h = h ^ _c(nbytes)
    h = h ^ (h >> _c(16))
    h = h * _c(F1)
    h = h ^ (h >> _c(13))
    h = h * _c(F2)
    return h ^ (h >> _c(16))


def murmur3_32(words: Sequence[mx.array], seed: mx.array | int = 0) -> mx.array:
    """MurmurHash3_x86_32 of the little-endian 32-bit ``words`` (broadcast
    together elementwise) with ``seed``; returns uint32 of the broadcast shape."""
    h = seed if isinstance(seed, mx.array) else _c(seed & MASK32)
    h = h.astype(_U)
    for w in words:
        w = w if isinstance(w, mx.array) else _c(w & MASK32)
        h = murmur_absorb(h, w)
    return murmur_finalize(h, 4 * len(words))
