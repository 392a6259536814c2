"""Quantized KV (`kv_bits`, runtime/cache/quantized.py) inside the compiled decode trace.

The eager step runs a quantized layer on `QuantizedKV`: `update_and_fetch` quantizes the new
keys / values with `mx.quantize` and mlx-lm's attention, seeing the cache's `bits`, runs
`quantized_scaled_dot_product_attention` over the (codes, scales, biases) of the written columns.
The compiled step (runtime/compiled_decode.py) does the same at a fixed shape: the six planes
(codes, scales and biases of K and of V) stay at the capacity bucket, the new column's codes are
written in place at the array column `idx` (the same write as bf16 KV's: `write_columns`), and
the same quantized attention runs over the whole capacity with the step's [B, 1, L, C] mask.

Why that is the eager step's math: the codes are the same `mx.quantize` of the same keys; the
scores of the valid columns are the same per-column quantized dot products, masked columns get
`finfo.min` and so zero weight, and their values (zeros, or codes of an earlier row left after a
filter / trim) are finite, so they add nothing. Never the CUDA attention kernel: it reads float
K/V, not codes (the plan's `compile mode` choice says so).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import quantized_scaled_dot_product_attention

from .cache.full import FullKV
from .cache.quantized import format_of
from .trace_layers import TraceLayers


def layer_formats(caches: list) -> tuple | None:
    """Per layer None (plain FullKV) or (bits, group_size) (a built-in QuantizedKV format), or
    None for the whole batch when some layer is neither or not allocated yet: what a trace takes."""
    if not caches:
        return None
    out = []
    for c in caches:
        fmt = None if type(c) is FullKV else format_of(c)
        if (fmt is None and type(c) is not FullKV) or c.keys is None:
            return None
        out.append(fmt)
    return tuple(out)


def quantized_note(policies: list) -> str:
    """What the compiled step does with this binding's KV (Engine.describe()["built"]["kv"])."""
    q = [p for p in policies if getattr(p, "name", None) == "quantized"]
    if not q:
        return "bf16 / model-dtype KV (FullKV buffers at the capacity bucket)"
    fmts = sorted({(p.params["bits"], p.params["group_size"]) for p in q})
    what = ", ".join(f"{b} bits, group {g}" for b, g in fmts)
    return (f"quantized KV ({what}) in {len(q)} of {len(policies)} layers: codes, scales and biases at the "
            "capacity bucket, written in place, attention by mx.quantized_matmul (mlx-lm's quantized SDPA; "
            "never the CUDA attention kernel)")


class FixedQuantizedKV(TraceLayers):
    """What a quantized layer sees inside the trace (contracts/decode_block.py): the six planes at
    their capacity, array offsets, `bits` / `group_size` so mlx-lm's attention quantizes as the
    eager QuantizedKV does. `write_columns` is compiled_decode_kv.write_columns, passed in (its device rule)."""

    def __init__(self, planes: list, fmt: tuple, idx, offset, mask, fused, matmul, residual, write_columns):
        self.planes = list(planes)  # QuantizedKV.PLANES order: codes K, codes V, K scales/biases, V scales/biases
        self.bits, self.group_size = fmt
        self.idx, self.offset, self.mask = idx, offset, mask
        self.fused, self.matmul, self.residual = fused, matmul, residual
        self._write = write_columns

    def update_and_fetch(self, k, v):
        q = dict(group_size=self.group_size, bits=self.bits)
        kq, ks, kb = mx.quantize(k, **q)
        vq, vs, vb = mx.quantize(v, **q)
        self.planes = [self._write(buf, new, self.idx) for buf, new in zip(self.planes, (kq, vq, ks, kb, vs, vb))]
        kc, vc, ks, kb, vs, vb = self.planes
        return (kc, ks, kb), (vc, vs, vb)

    def attend_new(self, q, k, v, scale):
        keys, values = self.update_and_fetch(k, v)
        return self.attend(q, keys, values, scale)

    def attend(self, q, k, v, scale):
        return quantized_scaled_dot_product_attention(q, k, v, scale=scale, mask=self.mask,
                                                      group_size=self.group_size, bits=self.bits)

    def plus_matmul(self, x, y, w):
        return mx.addmm(x, y, w.T) if self.residual else x + self.matmul(y, w)

