"""`full`: per-request contiguous KV that grows in fixed steps, on prefill and on decode writes.

Batched rows are left-padded so all rows write the same column; the mask hides
each row's padding. Capacity is bucketed like mlx-lm's KVCache step: powers of two up to
CAPACITY_STEP (256) columns, then multiples of it (`capacity_for`). Doubling wasted up to half
the buffer at long contexts, and every row of a batch pays for the longest row's capacity (one
4,128-token row among 15 short ones held 8,192 columns in all 16 rows); a fixed step wastes at
most 255 columns a row, and costs one copy per 256 decode steps (amortized O(B x T / 256)).
The compiled decode path (runtime/compiled_decode_kv.py) buckets capacities the same way, so its
traces see the shapes this makes.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .base import CachePolicy, LayerCache
from .device_ints import offsets, on_device
from .registry import register_policy
from .row_copies import MAX_COPY_RUNS, gather_rows, row_runs

MIN_CAPACITY = 64
CAPACITY_STEP = 256


def capacity_for(n: int) -> int:
    """Columns to allocate for n: powers of two from MIN_CAPACITY up to CAPACITY_STEP, then the
    next multiple of CAPACITY_STEP (runtime/compiled_decode_kv.py's bucket, the same rule)."""
    cap = MIN_CAPACITY
    while cap < n and cap < CAPACITY_STEP:
        cap *= 2
    return cap if cap >= n else -(-n // CAPACITY_STEP) * CAPACITY_STEP


class FullKV(LayerCache):
    # Arrays laid out [B, H, T, ...]: every batching op (grow, filter, extend, extract)
    # applies to each. A subclass that stores more per token (quantization scales, see
    # examples/kv_int8_policy.py) lists its extra planes here and reuses all of it.
    PLANES: tuple[str, ...] = ("keys", "values")
    # Plain left-padded rows: several prompts may share one prefill forward (compiler/selfcheck.py
    # batch_prefill_ok reads this; a subclass whose rows are not plain says False).
    batch_prefill = True

    def __init__(self, batch: int = 1, left_pad: list[int] | None = None):
        for name in self.PLANES:
            setattr(self, name, None)
        self.left_pad = list(left_pad) if left_pad is not None else [0] * batch
        self.idx = 0  # columns written (padding included)
        self._offset = None
        self._offset_idx = 0  # the idx `_offset` was built for: a write that moves idx (a compiled
        # step advancing the buffers in place) makes it stale without telling the cache

    # Each row's left padding: a host list (what batching edits), and the same as a device array
    # made once per value (left_pad_array; assigning the list drops it).
    @property
    def left_pad(self) -> list[int]:
        return self._left_pad

    @left_pad.setter
    def left_pad(self, pads: list[int]) -> None:
        self._left_pad = pads
        self._left_pad_dev = None

    def left_pad_array(self) -> mx.array:
        """int32 [B] on the device: what a step's arrays (masks, offsets, the kernels' first
        valid column) are built from, never a fresh host array per step (cache/device_ints.py)."""
        if self._left_pad_dev is None:
            self._left_pad_dev = on_device(self._left_pad)
        return self._left_pad_dev

    # -- what the model sees -------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.left_pad)

    @property
    def offset(self):
        if not any(self.left_pad):
            return self.idx
        if self._offset is None or self._offset_idx != self.idx:
            self._offset = offsets(self.left_pad_array(), self.idx, -1)  # shared by the step's layers
            self._offset_idx = self.idx
        return self._offset

    def row_length(self, row: int) -> int:
        return self.idx - self.left_pad[row]

    def update_and_fetch(self, keys, values):
        out = self.append({"keys": keys, "values": values})
        return out["keys"], out["values"]

    def append(self, new: dict) -> dict:
        """Write one [B, H, n, ...] array per plane at column idx; return every plane's [.., :idx+n, :]."""
        n = new["keys"].shape[2]
        need = self.idx + n
        if self.keys is None or need > self.keys.shape[2]:
            self._grow(new, need)
        for name, x in new.items():
            getattr(self, name)[..., self.idx:need, :] = x
        self.idx = need
        self._offset = None
        return {name: getattr(self, name)[..., :need, :] for name in self.PLANES}

    def grows_next(self, n: int = 1) -> bool:
        """Whether writing `n` more columns copies every row into wider buffers (`_grow`)."""
        return self.keys is not None and self.idx + n > self.keys.shape[2]

    def _grow(self, new: dict, need: int):
        cap = capacity_for(need)
        for name in self.PLANES:
            x = new[name]
            grown = mx.zeros(x.shape[:2] + (cap,) + x.shape[3:], x.dtype)
            old = getattr(self, name)
            if old is not None and self.idx:
                grown[..., : self.idx, :] = old[..., : self.idx, :]
            setattr(self, name, grown)

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        """mlx-lm's KVCache / BatchKVCache mask semantics, over this cache's columns: None for one
        unpadded token, "causal" for the fused path, else a boolean array — [N, idx+N], or
        [B, 1, N, idx+N] when rows are padded; a window (models that slide over a full cache,
        e.g. gemma2) always gives an array, as mlx-lm's does."""
        padded = any(self.left_pad)
        if not padded and window_size is None:
            if N == 1:
                return None
            return causal(N, self.idx) if return_array else "causal"
        mask = causal(N, self.idx)
        if window_size is not None:
            cols = mx.arange(self.idx + N)[None]
            rows = mx.arange(self.idx, self.idx + N)[:, None]
            mask = mask & (rows < cols + window_size)
        if not padded:
            return mask
        # Never a row's own left padding.
        pad = self.left_pad_array()[:, None, None, None]
        return to_mask_rank(mask[None, None] & (mx.arange(self.idx + N) >= pad), self)

    # -- the rest of mlx-lm's cache protocol, for model code that reads it ---------------------
    @property
    def state(self):
        if self.keys is None:
            return None, None
        return self.keys[..., : self.idx, :], self.values[..., : self.idx, :]

    def keys_and_values(self):  # afm7's KV-reuse layers read the last cache's keys this way
        return self.state

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def left_padding(self) -> mx.array:
        return self.left_pad_array()

    # -- speculative decoding: remove rejected positions (runtime/speculative/) ----------
    def trim_rows(self, counts: list[int]) -> None:
        """Drop the last counts[i] written positions of row i. The batch keeps one write column,
        so the common part (the smallest count) moves idx back; a row that drops more is shifted
        right by the difference and its left padding grows by as much (one gather over the
        written columns, only when the counts differ)."""
        if len(counts) != self.batch:
            raise ValueError(f"trim_rows: {len(counts)} counts for a batch of {self.batch} rows")
        m = min(counts) if counts else 0
        extra = [c - m for c in counts]
        if any(c < 0 or c > self.row_length(r) for r, c in enumerate(counts)):
            raise ValueError(f"trim_rows: counts {counts} exceed the rows' lengths")
        self.idx -= m
        self._offset = None
        if not any(extra) or self.keys is None:
            return
        cols = mx.arange(self.idx)[None] - mx.array(extra, dtype=mx.int32)[:, None]  # [B, idx]
        src = mx.maximum(cols, 0)[:, None, :, None]
        for name in self.PLANES:
            x = getattr(self, name)
            moved = mx.take_along_axis(x[..., : self.idx, :], src, axis=2)
            x[..., : self.idx, :] = moved
        self.left_pad = [p + e for p, e in zip(self.left_pad, extra)]

    # -- batching ---------------------------------------------------------------
    def filter(self, rows: list[int]) -> None:
        self.left_pad = [self.left_pad[r] for r in rows]
        self._offset = None
        if self.keys is None:
            return
        # Drop the columns that are padding for every remaining row.
        shift = min(self.left_pad) if self.left_pad else 0
        runs = row_runs(rows)
        copy_runs = runs and len(runs) <= MAX_COPY_RUNS and mx.default_device().type == mx.DeviceType.gpu
        for name in self.PLANES:
            # A contiguous result, not a view: kernels that read the whole buffer (the ragged
            # attention kernel, runtime/kernel_views.py) would otherwise copy it on every step.
            # On a GPU, kept rows that are a few runs (rows leave a step at a time) are copied one
            # run at a time, plain memory copies; more runs take gather_rows. On the CPU the
            # gather by row index is the fastest way (benchmarks/probes/row_filter.py).
            x = getattr(self, name)
            if not copy_runs:
                setattr(self, name, gather_rows(x, rows, first=shift))
                continue
            x = x[..., shift:, :] if shift else x
            if len(runs) == 1:
                setattr(self, name, mx.contiguous(x[runs[0][0]:runs[0][1]]))
            else:
                setattr(self, name, mx.concatenate([x[a:b] for a, b in runs], axis=0))
        if shift:
            self.idx -= shift
            self.left_pad = [p - shift for p in self.left_pad]

    def extend(self, other: "FullKV") -> None:
        self.extend_all([other])

    def extend_all(self, others: list, keep: list[int] | None = None) -> None:
        """Append the rows of every cache in `others`, in order, in one copy: a step's prompts join
        the batch together, so merging them one by one would copy the rows gathered so far again
        for each. `keep`: only these rows of this cache stay (a filter done by the same copy; the
        batch's vacant rows, runtime/batch_rows.py)."""
        if keep is not None and self.keys is None:
            self.left_pad = [self.left_pad[r] for r in keep]
            keep = None
        parts = [(self, keep), *((o, None) for o in others)]
        if all(c.keys is None for c, _ in parts):
            self.left_pad = [p for c, _ in parts for p in c.left_pad]
            self._offset = None
            return
        # Per part: its rows' padding, and the first column any of them reads (a kept subset drops
        # the columns that are padding for all of it, as filter does).
        pads = [c.left_pad if rows is None else [c.left_pad[r] for r in rows] for c, rows in parts]
        firsts = [0 if rows is None or c.keys is None else min(p) for (c, rows), p in zip(parts, pads)]
        idx = max(c.idx - f for (c, _), f in zip(parts, firsts))
        # Room for the next decode write, in capacity_for's steps (not the larger headroom of the
        # parts: a row prefilled alone must not widen every row of the batch).
        cap = capacity_for(idx + 1)
        ref = next(c for c, _ in parts if c.keys is not None)
        B = sum(len(p) for p in pads)
        out_pads, row = [], 0
        # One fresh buffer per plane and one write of each part's columns into it, right-aligned at
        # column idx (a pad of each part then a concatenate copied every row twice).
        out = {name: mx.zeros((B,) + getattr(ref, name).shape[1:2] + (cap,) + getattr(ref, name).shape[3:],
                              getattr(ref, name).dtype) for name in self.PLANES}
        for (c, rows), p, first in zip(parts, pads, firsts):
            n = c.idx - first
            shift = idx - n
            if c.keys is not None and n:
                runs = [(0, c.batch)] if rows is None else row_runs(rows)
                for name in self.PLANES:
                    x = getattr(c, name)
                    if len(runs) > MAX_COPY_RUNS:  # scattered rows: one gather
                        out[name][row:row + len(p), :, shift:idx] = gather_rows(x, rows)[..., first:c.idx, :]
                        continue
                    at = row
                    for a, b in runs:
                        out[name][at:at + b - a, :, shift:idx] = x[a:b, :, first:c.idx]
                        at += b - a
            out_pads += [q - first + shift for q in p]
            row += len(p)
        for name in self.PLANES:
            setattr(self, name, mx.contiguous(out[name]))
        self.left_pad, self.idx, self._offset = out_pads, idx, None

    def can_fill(self, others: list) -> bool:
        """Whether `fill_rows` can write every row of `others` into rows of this batch in place:
        each ends at this batch's write column, so it must hold at most `idx` positions."""
        return self.keys is not None and all(
            type(o) is type(self) and o.keys is not None and o.idx - min(o.left_pad) <= self.idx for o in others)

    def fill_rows(self, slots: list[int], others: list) -> None:
        """Write the rows of `others`, in order, into rows `slots` of this batch (rows left vacant,
        runtime/batch_rows.py), right-aligned at the write column: a copy of the joining rows'
        own positions only, where `extend_all` copies every row of the batch into new buffers.
        What an old row left to the left of the new one's padding is never read (every reader
        starts at left_pad)."""
        pads, at = list(self.left_pad), iter(slots)
        for o in others:
            for j, p in enumerate(o.left_pad):
                r, n = next(at), o.idx - p
                for name in self.PLANES:
                    getattr(self, name)[r:r + 1, :, self.idx - n:self.idx] = getattr(o, name)[j:j + 1, :, p:o.idx]
                pads[r] = self.idx - n
        self.left_pad, self._offset = pads, None

    def vacate(self, rows: list[int]) -> None:
        """Rows whose requests ended but that stay in the batch (runtime/batch_rows.py): each attends
        to the column it writes next only, and holds no live token (kv_usage)."""
        pads = list(self.left_pad)
        for r in rows:
            pads[r] = self.idx
        self.left_pad = pads
        self._offset = None

    def extract(self, row: int) -> "FullKV":
        out = type(self)(1)
        if self.keys is not None:
            p = self.left_pad[row]
            for name in self.PLANES:
                setattr(out, name, mx.contiguous(getattr(self, name)[row : row + 1, :, p : self.idx]))
            out.idx = self.idx - p
        return out

    # -- prefix protocol helpers (a TOKENS policy's capture / restore, over every plane) --------
    def positions(self, row: int, start: int, end: int) -> tuple:
        """Every plane of absolute positions start..end-1 of `row`, each [H, n, ...] (views: the
        pool write that consumes them is queued right away)."""
        p = self.left_pad[row]
        return tuple(getattr(self, name)[row, :, p + start:p + end] for name in self.PLANES)

    def positions_rows(self, spans: list) -> tuple:
        """positions() of several (row, start, end) spans in one gather per plane, each [H, n, ...]
        with the spans one after the other (a batch's leaving rows go to the pool together)."""
        rows = np.concatenate([np.full(end - start, row, dtype=np.int32) for row, start, end in spans])
        cols = np.concatenate([np.arange(self.left_pad[row] + start, self.left_pad[row] + end, dtype=np.int32)
                               for row, start, end in spans])
        r, c = mx.array(rows), mx.array(cols)
        return tuple(getattr(self, name)[r, :, c].swapaxes(0, 1) for name in self.PLANES)

    @classmethod
    def restored(cls, planes: tuple) -> "FullKV":
        """A batch-of-one cache holding positions 0..m-1 (`planes` in PLANES order, [H, m, ...])."""
        m = planes[0].shape[1]
        cap = capacity_for(m + 1)
        out = cls(1)
        for name, x in zip(cls.PLANES, planes):
            setattr(out, name, mx.pad(x[None], [(0, 0), (0, 0), (0, cap - m)] + [(0, 0)] * (x.ndim - 2)))
        out.idx = m
        return out

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else sum(getattr(self, n).nbytes for n in self.PLANES)

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


def to_mask_rank(mask, cache):
    """A per-row mask [B, 1, N, T], or [B, 1, 1, N, T] for models whose attention scores are
    [B, kv_heads, repeats, N, T] (gemma2 with grouped heads); the binding sets `mask_rank`
    on the caches when the self-check found the model needs it (compiler/compile.py)."""
    return mask[:, None] if getattr(cache, "mask_rank", 4) == 5 else mask


def causal(N: int, offset: int):
    """Boolean [N, offset + N]: query i (at position offset + i) sees the columns up to its own."""
    cols = mx.arange(offset + N)
    rows = mx.arange(offset, offset + N)[:, None]
    return rows >= cols[None]


@register_policy("full")
class FullPolicy(CachePolicy):
    """Per-request contiguous KV over the whole context (full-attention layers)."""

    LAYER_KINDS = ("full_attention",)

    def new_cache(self) -> FullKV:
        return FullKV(1)

    def prefix_unsupported(self) -> str:
        # On purpose: `full` is the no-sharing baseline (graphs/dense_noprefix.yaml).
        return f"policy '{self.name}' keeps each request's KV to itself (pool_backed shares prefixes)"
