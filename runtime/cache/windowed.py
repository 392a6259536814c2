"""`windowed`: per-request KV bounded by the sliding window (sliding-attention layers).

Layout. Rows of a batch share one contiguous buffer [B, H, cap, D], right-aligned: every
row writes its next token at column `idx`, so a decode step is one slice-update per layer.
Each row keeps two host ints: `pos0[b]`, the absolute position held in column 0 (offsets
stay absolute, so RoPE positions never change), and `lo[b]`, its first column holding
data (left padding, or the columns a restored prefix does not fill).

Bounded memory. While the buffer holds fewer than `window + max(N, window)` columns it
grows by doubling; past that, a write *compacts* first: the last `window` columns move
to the front of a fresh buffer of exactly that bound. In steady decode (N = 1) the bound
is 2 x window and a compaction happens once every `window` tokens and copies `window`
columns: amortized O(1) per token. The query at position p needs keys p-window+1..p,
so keeping `window` columns is always enough (and is what a prefix boundary captures).

Keys returned and masks. `update_and_fetch` returns only the columns some query of this
write can see: for N new tokens, the last N + window - 1 (all of them, while fewer are
held). A decode step therefore attends over exactly `window` keys and needs no window
mask; the mask is only about padding. `make_mask` predicts the same columns, so its width
always equals the number of keys returned. While the window cannot bind (every returned
key is within `window` of every query) and no row is padded, it returns None (N = 1) or
"causal" — the fused attention path, no materialized mask.
"""

from __future__ import annotations

import mlx.core as mx

from .base import CachePolicy, LayerCache
from .device_ints import offsets, on_device
from .full import to_mask_rank
from .prefix_state import PrefixKind, PrefixState
from .registry import register_policy

MIN_CAPACITY = 64


class WindowedKV(LayerCache):
    def __init__(self, window: int, batch: int = 1):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.keys = None
        self.values = None
        self.idx = 0  # columns written (the next write goes here for every row)
        self.pos0 = [0] * batch  # absolute position of column 0, per row
        self.lo = [0] * batch  # first column with data, per row
        self._offset = None

    # -- what the model sees -------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.pos0)

    @property
    def offset(self):
        base = self.pos0[0] + self.idx if self.pos0 else self.idx
        if all(p == self.pos0[0] for p in self.pos0):
            return base
        if self._offset is None:
            # Rows differ by pos0[b] - pos0[0], which only batching edits change (a ring shift
            # moves every row alike): a device array made once per value, plus a scalar, once a
            # step for all layers.
            self._offset = offsets(on_device([p - self.pos0[0] for p in self.pos0]), base, 1)
        return self._offset

    def row_length(self, row: int) -> int:
        """Tokens of context row `row` has seen (its next absolute position)."""
        return self.pos0[row] + self.idx

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _layout(self, n: int) -> tuple[int | None, int]:
        """(new capacity or None, columns dropped from the front) before writing n columns.

        Pure: make_mask (called before the layers run) and update_and_fetch must agree.
        """
        need = self.idx + n
        if need <= self.capacity:
            return None, 0
        bound = self.window + max(n, self.window)
        if need <= bound:
            cap = max(self.capacity * 2, MIN_CAPACITY)
            while cap < need:
                cap *= 2
            return min(cap, bound), 0
        # need > bound >= window + n, so idx > window: keep the last `window` columns.
        return bound, self.idx - self.window

    def _key_range(self, n: int, idx: int) -> int:
        """First column returned for a write of n columns at `idx` (after compaction)."""
        return max(0, idx + n - (n + self.window - 1))

    def update_and_fetch(self, keys, values):
        n = keys.shape[2]
        cap, shift = self._layout(n)
        if cap is not None:
            self._realloc(keys, values, cap, shift)
        end = self.idx + n
        self.keys[..., self.idx:end, :] = keys
        self.values[..., self.idx:end, :] = values
        self.idx = end
        self._offset = None
        s = self._key_range(n, end - n)
        self._fetched = (s, end)
        return self.keys[..., s:end, :], self.values[..., s:end, :]

    def keys_and_values(self):
        """What the last update_and_fetch returned: KV-sharing layers (gemma3n) attend over the
        same keys as the layer that wrote them, with the same mask."""
        s, end = getattr(self, "_fetched", (0, self.idx))
        return self.keys[..., s:end, :], self.values[..., s:end, :]

    def _realloc(self, keys, values, cap: int, shift: int) -> None:
        if self.keys is None:
            B, H, _, D = keys.shape
            self.keys = mx.zeros((B, H, cap, D), keys.dtype)
            self.values = mx.zeros((B, H, cap, values.shape[3]), values.dtype)
            return
        keep = self.idx - shift
        pad = [(0, 0), (0, 0), (0, cap - keep), (0, 0)]
        self.keys = mx.pad(self.keys[..., shift:self.idx, :], pad)
        self.values = mx.pad(self.values[..., shift:self.idx, :], pad)
        if shift:
            self.idx = keep
            self.pos0 = [p + shift for p in self.pos0]
            self.lo = [max(0, l - shift) for l in self.lo]

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        w = window_size or self.window
        if w > self.window:
            raise ValueError(f"mask window {w} is larger than the cache's window {self.window}")
        _, shift = self._layout(N)
        idx = self.idx - shift
        lo = [max(0, l - shift) for l in self.lo]
        end = idx + N
        s = self._key_range(N, idx)
        padded = any(l > s for l in lo)
        if not padded and not return_array and end - s <= w:
            return None if N == 1 else "causal"  # the window cannot bind: fused path
        q = mx.arange(idx, end)[:, None]
        k = mx.arange(s, end)[None]
        mask = (q >= k) & (q < k + w)
        if padded:
            lo_a = on_device(lo)[:, None, None, None]  # the same values step after step: one array
            mask = to_mask_rank(mask[None, None] & (k[None, None] >= lo_a), self)
        return mask

    # -- the rest of mlx-lm's cache protocol, for model code that reads it ---------------------
    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def max_size(self) -> int:  # RotatingKVCache's name for the window
        return self.window

    # -- batching ---------------------------------------------------------------
    def filter(self, rows: list[int]) -> None:
        self.pos0 = [self.pos0[r] for r in rows]
        self.lo = [self.lo[r] for r in rows]
        self._offset = None
        if self.keys is not None:
            idx = mx.array(rows, dtype=mx.int32)
            self.keys, self.values = self.keys[idx], self.values[idx]

    def extend(self, other: "WindowedKV") -> None:
        """Append other's rows. Only the last `window` columns of each side can still be
        attended to, so the merged buffer keeps just those (right-aligned) at the steady
        2 x window capacity."""
        if other.window != self.window:
            raise ValueError(f"cannot merge windowed caches of windows {self.window} and {other.window}")
        parts = [c for c in (self, other) if c.keys is not None]
        if not parts:
            self.pos0 += other.pos0
            self.lo += other.lo
            self._offset = None
            return
        ref = parts[0].keys
        keeps = [min(c.idx, self.window) for c in (self, other)]
        K = max(keeps)
        cap = max(2 * self.window, K)
        ks, vs, pos0, lo = [], [], [], []
        for c, keep in zip((self, other), keeps):
            drop, left = c.idx - keep, K - keep
            if c.keys is None:
                shape = (c.batch, ref.shape[1], cap, ref.shape[3])
                ks.append(mx.zeros(shape, ref.dtype))
                vs.append(mx.zeros(shape[:3] + (parts[0].values.shape[3],), ref.dtype))
            else:
                pad = [(0, 0), (0, 0), (left, cap - K), (0, 0)]
                ks.append(mx.pad(c.keys[..., drop:c.idx, :], pad))
                vs.append(mx.pad(c.values[..., drop:c.idx, :], pad))
            pos0 += [p + drop - left for p in c.pos0]
            lo += [max(0, l - drop) + left for l in c.lo]
        self.keys = mx.concatenate(ks, axis=0)
        self.values = mx.concatenate(vs, axis=0)
        self.idx, self.pos0, self.lo, self._offset = K, pos0, lo, None

    def extract(self, row: int) -> "WindowedKV":
        out = WindowedKV(self.window, 1)
        if self.keys is not None:
            lo = self.lo[row]
            out.keys = mx.contiguous(self.keys[row:row + 1, :, lo:self.idx])
            out.values = mx.contiguous(self.values[row:row + 1, :, lo:self.idx])
            out.idx = self.idx - lo
            out.pos0 = [self.pos0[row] + lo]
        return out

    # -- prefix cache ------------------------------------------------------------
    def positions(self, row: int, start: int, end: int) -> tuple[mx.array, mx.array, int]:
        """Keys and values [H, n, D] of absolute positions start..end-1 of `row`, clamped to what
        the buffer still holds (its first position is returned third). `end` <= row_length(row).

        Copies (a view would keep the whole buffer alive for as long as the prefix cache holds it)."""
        if end > self.row_length(row):
            raise ValueError(f"row {row} has seen {self.row_length(row)} positions, not {end}")
        first = self.pos0[row] + self.lo[row]  # the oldest position still held
        start = max(start, first, 0)
        c0, c1 = start - self.pos0[row], end - self.pos0[row]
        return mx.array(self.keys[row, :, c0:c1]), mx.array(self.values[row, :, c0:c1]), start

    @classmethod
    def restored(cls, window: int, keys: mx.array, values: mx.array, start: int) -> "WindowedKV":
        """A batch-of-one cache holding positions start..start+w-1 (keys [H, w, D])."""
        out = cls(window, 1)
        w = keys.shape[1]
        cap = max(2 * window, w)
        pad = [(0, 0), (0, 0), (0, cap - w), (0, 0)]
        out.keys = mx.pad(keys[None], pad)
        out.values = mx.pad(values[None], pad)
        out.idx = w
        out.pos0 = [start]
        return out

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


@register_policy("windowed")
class WindowedPolicy(CachePolicy):
    """Per-request KV bounded by the layer's sliding window: 2 x window in steady decode."""

    LAYER_KINDS = ("sliding_attention",)
    prefix_kind = PrefixKind.TAIL  # the prefix cache keeps the last `window` positions at boundaries

    @classmethod
    def check_layer(cls, layer) -> str | None:
        problem = super().check_layer(layer)
        if problem is None and not layer.window:
            return f"policy '{cls.name}' needs the layer's sliding window, and the model config has none"
        return problem

    @property
    def window(self) -> int:
        return int(self.layer.window)

    def bytes_per_request(self, context: int) -> int:
        # Steady state: the 2 x window buffer (a short context holds at most its length).
        return self.bytes_per_token() * min(context, 2 * self.window)

    def describe(self) -> str:
        return f"{self.name}(window={self.window})"

    def new_cache(self) -> WindowedKV:
        return WindowedKV(self.window, 1)

    # -- the prefix protocol (runtime/cache/prefix_state.py) -----------------------------
    def prefix_tail(self) -> int:
        return self.window

    def prefix_capture(self, cache: WindowedKV, row: int, start: int, end: int) -> PrefixState:
        # Positions the window already dropped are not there to give: the state starts later
        # (the prefix cache then keeps no window at that boundary).
        k, v, first = cache.positions(row, start, end)
        return PrefixState(PrefixKind.TAIL, first, end, (k, v))

    def prefix_restore(self, state: PrefixState) -> WindowedKV:
        return WindowedKV.restored(self.window, *state.arrays, state.start)
