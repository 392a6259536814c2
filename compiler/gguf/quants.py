"""ggml block types -> MLX: kept as MLX affine quantization where that is exact, widened otherwise.

MLX's affine quantization holds w = scale·q + bias per group of 32, 64 or 128 values of a
row (q of 2-8 bits). A ggml type maps onto it without loss when each 32-value run of a row
has one scale and one offset:

- Q4_0 d·(q−8), Q4_1 d·q+m, Q5_0 d·(q−16), Q5_1 d·q+m, Q8_0 d·q (q signed): blocks of 32.
- Q4_K / Q5_K: 256-value super-blocks of eight 32-value sub-blocks, each with 6-bit scale sc
  and min m: w = (d·sc)·q − dmin·m, so scale = d·sc and bias = −dmin·m.

Q2_K, Q3_K and Q6_K give every 16 values their own scale (MLX's smallest group is 32), and
IQ4_NL / IQ4_XS map q through a non-linear table: none has an exact MLX form, so they are
dequantized ("widened"). The decoders follow ggml-quants.c's block layouts; the tests check
them bit for bit against the `gguf` package's dequantizer.
"""

from __future__ import annotations

import attrs
import numpy as np

QK_K = 256
# type name -> (values per block, bytes per block), as ggml's type traits.
BLOCKS = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}
KEPT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
PLAIN = {"F32", "F16", "BF16"}
WIDENED = {"Q2_K", "Q3_K", "Q6_K", "IQ4_NL", "IQ4_XS"}
GROUP_SIZE = 32
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def bits_per_weight(type_name: str) -> float:
    n, size = BLOCKS[type_name]
    return size * 8 / n


@attrs.frozen
class Affine:
    """q (uint8, rows × cols) with one scale and bias per 32 values (float32, rows × cols/32)."""

    q: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int

    def dequantize(self) -> np.ndarray:
        s = np.repeat(self.scales, GROUP_SIZE, axis=-1)
        b = np.repeat(self.biases, GROUP_SIZE, axis=-1)
        return self.q.astype(np.float32) * s + b


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values < 2**bits -> MLX's packed uint32 rows (an LSB-first bit stream per row)."""
    q = np.ascontiguousarray(q, dtype=np.uint8)
    if bits == 8:  # byte i of the little-endian stream is value i
        return q.view(np.uint32)
    if bits == 4:  # low nibble first
        return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4)).view(np.uint32)
    rows = q.reshape(-1, q.shape[-1])
    stream = ((rows[..., None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8).reshape(rows.shape[0], -1)
    return np.packbits(stream, axis=-1, bitorder="little").view(np.uint32).reshape(*q.shape[:-1], -1)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, n_runs: int) -> np.ndarray:
    """Bytes (n, n_runs·L) -> (n, n_runs, 2, L): low nibbles first, then high, per run of L bytes."""
    qs = qs.reshape(qs.shape[0], n_runs, 1, -1)
    return (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins (get_scale_min_k4)."""
    s = s.reshape(-1, 3, 4)
    lo, hi, mix = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 63, (mix & 15) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), m.astype(np.float32)


def _bits5(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 4 bytes of high bits -> (n, 32) bit i of the little-endian uint32."""
    word = np.ascontiguousarray(qh).view(np.uint32)
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _affine_blocks(name: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (n, bytes) -> q (n, block values), scale and bias (n, block values / 32)."""
    n = b.shape[0]
    if name == "Q8_0":
        d = _f16(b[:, 0:2])
        q = (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q, d, -128 * d
    if name in ("Q4_0", "Q4_1"):
        d = _f16(b[:, 0:2])
        m = _f16(b[:, 2:4]) if name == "Q4_1" else -8 * d
        q = _nibbles(b[:, 4 if name == "Q4_1" else 2:], 1).reshape(n, 32)
        return q, d, m
    if name in ("Q5_0", "Q5_1"):
        d = _f16(b[:, 0:2])
        off = 4 if name == "Q5_1" else 2
        m = _f16(b[:, 2:4]) if name == "Q5_1" else -16 * d
        q = _nibbles(b[:, off + 4:], 1).reshape(n, 32) | (_bits5(b[:, off:off + 4]) << 4)
        return q, d, m
    # Q4_K / Q5_K: d, dmin, 12 scale bytes, [Q5_K: 32 bytes of high bits], 128 bytes of nibbles
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scale_min(b[:, 4:16])
    if name == "Q4_K":
        q = _nibbles(b[:, 16:], 4).reshape(n, 8, 32)
    else:
        high = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
        q = _nibbles(b[:, 48:], 4).reshape(n, 8, 32) | (high << 4)
    return q.reshape(n, QK_K), d * sc, -(dmin * m)


def _dense_blocks(name: str, b: np.ndarray) -> np.ndarray:
    """Blocks (n, bytes) of a type with no exact MLX form -> float32 (n, block values)."""
    n = b.shape[0]
    if name == "Q6_K":  # ql[128] qh[64] scales[16] (int8) d
        ql = _nibbles(b[:, :128], 2).reshape(n, 8, 32)
        qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        q = (ql | (qh.reshape(n, 8, 32) << 4)).astype(np.float32) - 32
        scale = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
        return (scale.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, QK_K)
    if name == "Q3_K":  # hmask[32] qs[64] scales[12] d
        lo = (b[:, 96:104].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)) & 15
        hi = (b[:, 104:108].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & 3
        sc = (lo.reshape(n, 16) | (hi.reshape(n, 16) << 4)).astype(np.float32) - 32
        low = (b[:, 32:96].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        # a set hmask bit means no −4 offset
        high = (b[:, :32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
        q = low.reshape(n, 16, 16).astype(np.float32) - 4 * (1 - high.reshape(n, 16, 16).astype(np.float32))
        return ((_f16(b[:, 108:110]) * sc).reshape(n, 16, 1) * q).reshape(n, QK_K)
    if name == "Q2_K":  # scales[16] (4-bit scale | 4-bit min) qs[64] d dmin
        s = b[:, :16]
        dl = (_f16(b[:, 80:82]) * (s & 15).astype(np.float32)).reshape(n, 16, 1)
        ml = (_f16(b[:, 82:84]) * (s >> 4).astype(np.float32)).reshape(n, 16, 1)
        q = (b[:, 16:80].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        return (dl * q.reshape(n, 16, 16).astype(np.float32) - ml).reshape(n, QK_K)
    if name == "IQ4_NL":  # d, 16 bytes of table indices
        return _f16(b[:, :2]) * IQ4_VALUES[_nibbles(b[:, 2:], 1).reshape(n, 32)]
    if name == "IQ4_XS":  # d, scales_h (u16), scales_l[4], qs[128]
        sh = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
        sh = ((sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)
        sl = ((b[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], np.uint8).reshape(1, 1, 2)) & 15).reshape(n, 8)
        dl = _f16(b[:, :2]) * ((sl | (sh << 4)).astype(np.float32) - 32)
        q = IQ4_VALUES[_nibbles(b[:, 8:], 8).reshape(n, 8, 32)]
        return (dl.reshape(n, 8, 1) * q).reshape(n, QK_K)
    raise KeyError(name)


def decode(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> Affine | np.ndarray:
    """The raw bytes of one tensor -> Affine (kept types) or a float32/16 array of `shape`."""
    cols = shape[-1]
    if type_name in PLAIN:
        dt = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[type_name]
        arr = np.asarray(raw).view(dt).reshape(shape)
        return (arr.astype(np.uint32) << 16).view(np.float32) if type_name == "BF16" else arr
    n, size = BLOCKS[type_name]
    blocks = np.asarray(raw).reshape(-1, size)
    if type_name in KEPT_BITS:
        q, s, b = _affine_blocks(type_name, blocks)
        lead = tuple(shape[:-1])  # stacked experts keep their leading dimension
        return Affine(q.reshape(*lead, cols), s.reshape(*lead, cols // GROUP_SIZE),
                      b.reshape(*lead, cols // GROUP_SIZE), KEPT_BITS[type_name])
    return _dense_blocks(type_name, blocks).reshape(shape)
