"""`full`: per-request contiguous KV that grows by doubling, on prefill and on decode writes.

Batched rows are left-padded so all rows write the same column; the mask hides
each row's padding. Growth doubles capacity, so a request that decodes T tokens
pays O(log T) reallocations, each O(T) — amortized O(1) per token.
"""

from __future__ import annotations

import mlx.core as mx

from .base import CachePolicy, LayerCache
from .registry import register_policy

MIN_CAPACITY = 64


class FullKV(LayerCache):
    def __init__(self, batch: int = 1, left_pad: list[int] | None = None):
        self.keys = None
        self.values = None
        self.left_pad = list(left_pad) if left_pad is not None else [0] * batch
        self.idx = 0  # columns written (padding included)
        self._offset = None

    # -- what the model sees -------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.left_pad)

    @property
    def offset(self):
        if not any(self.left_pad):
            return self.idx
        if self._offset is None:
            self._offset = mx.array([self.idx - p for p in self.left_pad], dtype=mx.int32)
        return self._offset

    def update_and_fetch(self, keys, values):
        n = keys.shape[2]
        need = self.idx + n
        if self.keys is None or need > self.keys.shape[2]:
            self._grow(keys, values, need)
        self.keys[..., self.idx:need, :] = keys
        self.values[..., self.idx:need, :] = values
        self.idx = need
        self._offset = None
        return self.keys[..., :need, :], self.values[..., :need, :]

    def _grow(self, keys, values, need: int):
        cap = MIN_CAPACITY if self.keys is None else self.keys.shape[2]
        while cap < need:
            cap *= 2
        B, H, _, D = keys.shape
        new_k = mx.zeros((B, H, cap, D), keys.dtype)
        new_v = mx.zeros((B, H, cap, values.shape[3]), values.dtype)
        if self.keys is not None and self.idx:
            new_k[..., : self.idx, :] = self.keys[..., : self.idx, :]
            new_v[..., : self.idx, :] = self.values[..., : self.idx, :]
        self.keys, self.values = new_k, new_v

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        if window_size is not None:
            raise ValueError("the 'full' policy cannot apply a sliding window; use 'windowed'")
        if not any(self.left_pad):
            if N == 1:
                return None
            return _causal(N, self.idx) if return_array else "causal"
        # [B, 1, N, idx+N]: causal, and never a row's own left padding.
        cols = mx.arange(self.idx + N)
        rows = mx.arange(self.idx, self.idx + N)[:, None]
        causal = rows >= cols[None]
        pad = mx.array(self.left_pad, dtype=mx.int32)[:, None, None, None]
        return causal[None, None] & (cols >= pad)

    # -- batching ---------------------------------------------------------------
    def filter(self, rows: list[int]) -> None:
        self.left_pad = [self.left_pad[r] for r in rows]
        self._offset = None
        if self.keys is None:
            return
        idx = mx.array(rows, dtype=mx.int32)
        self.keys, self.values = self.keys[idx], self.values[idx]
        # Drop the columns that are padding for every remaining row.
        shift = min(self.left_pad) if self.left_pad else 0
        if shift:
            self.keys = self.keys[..., shift:, :]
            self.values = self.values[..., shift:, :]
            self.idx -= shift
            self.left_pad = [p - shift for p in self.left_pad]

    def extend(self, other: "FullKV") -> None:
        if other.keys is None and self.keys is None:
            self.left_pad += other.left_pad
            self._offset = None
            return
        idx = max(self.idx, other.idx)
        cap = max(c.keys.shape[2] - c.idx for c in (self, other) if c.keys is not None) + idx
        ref = self.keys if self.keys is not None else other.keys
        ks, vs, pads = [], [], []
        for c in (self, other):
            shift = idx - c.idx  # right-align both at column idx
            if c.keys is None:
                k = mx.zeros((c.batch, ref.shape[1], cap, ref.shape[3]), ref.dtype)
                v = mx.zeros((c.batch, ref.shape[1], cap, ref.shape[3]), ref.dtype)
            else:
                body_k, body_v = c.keys[..., : c.idx, :], c.values[..., : c.idx, :]
                right = cap - idx
                k = mx.pad(body_k, [(0, 0), (0, 0), (shift, right), (0, 0)])
                v = mx.pad(body_v, [(0, 0), (0, 0), (shift, right), (0, 0)])
            ks.append(k)
            vs.append(v)
            pads += [p + shift for p in c.left_pad]
        self.keys = mx.concatenate(ks, axis=0)
        self.values = mx.concatenate(vs, axis=0)
        self.left_pad, self.idx, self._offset = pads, idx, None

    def extract(self, row: int) -> "FullKV":
        out = FullKV(1)
        if self.keys is not None:
            p = self.left_pad[row]
            out.keys = mx.contiguous(self.keys[row : row + 1, :, p : self.idx])
            out.values = mx.contiguous(self.values[row : row + 1, :, p : self.idx])
            out.idx = self.idx - p
        return out

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


def _causal(N: int, offset: int):
    cols = mx.arange(offset + N)
    rows = mx.arange(offset, offset + N)[:, None]
    return rows >= cols[None]


@register_policy("full")
class FullPolicy(CachePolicy):
    """Per-request contiguous KV over the whole context (full-attention layers)."""

    LAYER_KINDS = ("full_attention",)

    def new_cache(self) -> FullKV:
        return FullKV(1)
