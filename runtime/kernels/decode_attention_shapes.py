"""Which ragged-attention kernel takes which heads, and how it is launched: the grouped kernel's
warps, the vec kernel's fit and (warps, keys per lane) by number of blocks, and the reference
the kernels must match (MLX's masked attention with the kernels' semantics). Plain functions of
shapes, shared by the kernel (decode_attention.py) and its checks (decode_attention_check.py)."""

from __future__ import annotations

import mlx.core as mx

# Shared memory the grouped kernel's final combine may use (static, well under 48 KB).
_GROUPED_SMEM = 32 * 1024


# (fewest blocks, warps per block, keys per lane per trip) for the vec kernel, first match wins,
# from an H200 sweep of warps x keys per lane at the Llama shapes: 4 x 4 was the fastest at every
# batch of 16 rows and more (128+ blocks at 8 KV heads), 8 x 4 at batch 1 for 9 queries.
VEC_CONFIG = ((128, 4, 4), (0, 8, 4))
# Fewer blocks than this (one query at batches under 8, at 8 KV heads) take the grouped kernel:
# through the public API the vec kernel was 1-2 % slower there (Llama-3.2-1B batch 1, slower in
# 5 of 5 paired repeats).
VEC_MIN_BLOCKS = 64


def vec_fits(Hq: int, Hkv: int, D: int, itemsize: int) -> bool:
    """Whether the vec kernel takes these heads: whole query groups of at most 8 heads, a key
    row split into 16-byte pieces over a power-of-two number of lanes (D = 32, 64, 128 or 256
    in bf16), and per lane a query group's dims in registers (G x 16 / itemsize <= 32)."""
    vec = 16 // itemsize if itemsize in (2, 4) else 0
    if not vec or not Hkv or Hq % Hkv or not 1 <= Hq // Hkv <= 8 or D % vec:
        return False
    lpk = D // vec
    return lpk <= 32 and 32 % lpk == 0 and (Hq // Hkv) * vec <= 32


# Static shared memory the vec kernel's combine may use (the limit is 48 KB): 16 warps at G = 4, D = 128.
_VEC_SMEM = 40 * 1024


def vec_config(blocks: int, G: int, D: int) -> tuple[int, int]:
    """(warps, keys per lane per trip) for `blocks` blocks; warps shrink until the combine's
    shared memory fits."""
    warps, kpl = next((w, k) for least, w, k in VEC_CONFIG if blocks >= least)
    while warps > 1 and warps * G * (D + 2) * 4 > _VEC_SMEM:
        warps //= 2
    return warps, kpl


def grouped_warps(Hq: int, Hkv: int, D: int) -> int:
    """Warps per block for the grouped kernel at these heads, or 0 where it does not apply:
    a group of one query head (nothing to share), more than 8 query heads per KV head (its
    registers), or a combine that would not fit in _GROUPED_SMEM."""
    G = Hq // Hkv if Hkv else 0
    if G < 2 or G > 8 or Hq % Hkv:
        return 0
    for warps in (8, 4, 2):
        if warps * G * (D + 2) * 4 <= _GROUPED_SMEM:
            return warps
    return 0


def takes(Hq: int, Hkv: int, D: int) -> bool:
    """Heads the kernels take: head dim a multiple of 32, query heads a multiple of KV heads."""
    return bool(D) and D % 32 == 0 and bool(Hkv) and Hq % Hkv == 0


def reference(q, k, v, start, end: int, scale: float):
    """MLX's masked attention with the kernel's semantics."""
    L, C = q.shape[2], k.shape[2]
    cols = mx.arange(C)[None, None]
    last = (end - L + mx.arange(L))[None, :, None]  # each query's own column
    mask = ((cols <= last) & (cols >= start[:, None, None]))[:, None]  # [B, 1, L, C]
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


