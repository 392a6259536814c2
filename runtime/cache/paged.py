"""`paged`: full-attention KV in fixed-size pages of one pool per layer; each row of a batch holds
the list of pages its tokens fill.

Why: the `full` / `pool_backed` rows of a decode batch are contiguous left-padded `[B, H, T, D]`
arrays, every row as wide as the longest: one 4,096-token prompt among fifteen of 256 held 8.7x
the KV its tokens need (docs/cpu-prefill.md). Here a row holds `page_tokens` (16) positions a
page, so what the batch holds is its tokens rounded up to a page per row, and rows that leave or
join move page lists, never KV.

The price is in attention: MLX's takes keys and values as `[B, H, T, D]` arrays, so every layer of
every step gathers the rows' pages into one (as wide as the longest row, right-padded with the
pool's zero page, masked). That array lives for the layer's attention only; what the batch keeps
is the pages. On CUDA a decode step gathers each group of similar length left-aligned and attends in the ragged
attention kernel (runtime/kernel_views.py); no kernel reads pages in place, and compiled decode
takes only `full` / `pool_backed` caches, so this policy is the memory-first layout, opt-in
(`graphs/dense_paged.yaml`), measured in docs/cache-policies.md.

Pages are reference-counted: `extract` (a row leaving as a batch of one) shares its pages, a cache
released by the garbage collector gives its pages back (`weakref.finalize`). Every cache of one
layer draws on that layer's pool (the policy's), so batches merge by concatenating page lists.
Prompts prefill one request at a time (`batch_prefill = False`: a left-padded batched prefill
would write pads into pages).
"""

from __future__ import annotations

import weakref

import mlx.core as mx
import numpy as np

from graphc.compiler.fused_block import llama_block, llama_not_own_block

from .base import CachePolicy, LayerCache, PolicyParam
from .device_ints import on_device
from .full import causal, to_mask_rank
from .page_pool import PagePool, release_rows
from .prefix_state import PrefixKind, PrefixState
from .registry import register_policy

class PagedKV(LayerCache):
    """A batch's rows of one layer: `pages[r]` the pool pages of row r, `lengths[r]` its tokens."""

    batch_prefill = False  # a left-padded batched prefill would write its pads into pages
    cheap_filter = True  # a row leaves by giving its pages back: no reason to keep it in place

    def __init__(self, pool: PagePool):
        self.pool = pool
        self.pages: list[list[int]] = [[]]
        self.lengths: list[int] = [0]
        self._table = None  # int32 [B, max pages] on the device, made when the pages change
        self._offsets = None
        # The pages go back to the pool when this cache is dropped (a request forgotten, a batch
        # reset after a fault); self.pages is only ever changed in place, so the finalizer sees it.
        weakref.finalize(self, release_rows, pool, self.pages)

    # -- what the model sees -------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.pages)

    @property
    def offset(self):
        """Each row's next position: an int for a batch of one, else int32 [B] (RoPE per row)."""
        if self.batch == 1:
            return self.lengths[0]
        if self._offsets is None:
            self._offsets = mx.array(self.lengths, dtype=mx.int32)
        return self._offsets

    def row_length(self, row: int) -> int:
        return self.lengths[row]

    def update_and_fetch(self, keys, values):
        """Write [B, H, L, D] new keys / values at each row's next L positions; return every row's
        keys and values gathered from its pages, [B, H, T, D] with T the longest row (right-padded)."""
        self._write(keys, values)
        return self._gathered()

    # -- graphc's own llama block: attention over each row's own pages ---------------------------
    def run_layer(self, layer, h, mask):
        """How the fast path runs a layer on this cache (compiler/ops/forward.py `_layers`): a llama
        block as graphc's own block (compiler/fused_block.py `llama_block`, the layer's own
        projections), its attention through `attend_new`; any other layer as the model's own, with
        the whole batch gathered (`update_and_fetch`)."""
        if llama_not_own_block(layer) is not None:
            return layer(h, mask, self)
        return llama_block(layer, None, h, self)

    def attend_new(self, q, k, v, scale, kernel=None):
        """Write this step's keys / values [B, Hkv, L, D], then attend each group of rows of similar
        length over its own pages only (`length_groups`): gathering every row to the longest made
        one long row cost every short one its length (16 rows, one of 4,384 positions among
        fifteen of 288: 16 x 4,384 columns gathered and attended where 8,700 hold tokens).

        `kernel`: the ragged attention kernel (runtime/kernels/decode_attention.py), which a decode
        step on CUDA passes in (runtime/kernel_views.py): for one query per row, each group is
        gathered left-aligned and attended in the kernel, which reads each row's own columns; MLX's
        attention with a mask over rows of different lengths takes its slow path on CUDA."""
        before = list(self.lengths)
        self._write(k, v)
        B, _, L, _ = q.shape
        groups = length_groups(self.lengths)
        outs = []
        for rows in groups:
            qg = q if len(groups) == 1 else q[on_device(rows)]
            if kernel is not None and L == 1:
                keys, values, start, T = self._rows_left(rows)
                outs.append(kernel(qg, keys, values, start, on_device([T]), scale))
                continue
            keys, values, T = self._rows(rows)
            outs.append(mx.fast.scaled_dot_product_attention(qg, keys, values, scale=scale,
                                                             mask=self._group_mask(rows, before, L, T)))
        if len(groups) == 1:
            return outs[0]
        order = np.argsort([r for g in groups for r in g])  # back to row order
        return mx.concatenate(outs)[on_device(order.tolist())]

    def _group_mask(self, rows: list[int], before: list[int], L: int, T: int):
        """The mask of a group's L queries over its T columns: none where every row has exactly T
        positions and one query, "causal" for one row, else query j of row r sees columns up to
        before[r] + j."""
        if L == 1 and all(before[r] + 1 == T for r in rows):
            return None
        if len(rows) == 1 and before[rows[0]] + L == T:
            return "causal"
        at = mx.array([before[r] for r in rows], dtype=mx.int32)[:, None, None, None] + mx.arange(L)[:, None]
        return mx.arange(T)[None, None, None] <= at

    def _write(self, keys, values) -> None:
        B, _, L, _ = keys.shape
        P = self.pool.page_tokens
        slots = np.empty((B, L), np.int64)
        for r in range(B):
            start, pages = self.lengths[r], self.pages[r]
            short = -(-(start + L) // P) - len(pages)
            if short > 0:
                pages.extend(self.pool.alloc(short))
                self._table = None
            pos = np.arange(start, start + L)
            slots[r] = np.asarray(pages, np.int64)[pos // P] * P + pos % P
            self.lengths[r] = start + L
        self._offsets = None
        flat = lambda x: x.transpose(0, 2, 1, 3).reshape(B * L, *x.shape[1:2], x.shape[3])  # noqa: E731
        self.pool.write(mx.array(slots.reshape(-1), dtype=mx.int32), flat(keys), flat(values))

    def _page_table(self) -> mx.array:
        """int32 [B, most pages a row holds]: each row's pages in order, then the zero page."""
        if self._table is None:
            width = max(max(len(p) for p in self.pages), 1)
            table = np.zeros((self.batch, width), np.int32)
            for r, pages in enumerate(self.pages):
                table[r, :len(pages)] = pages
            self._table = mx.array(table)
        return self._table

    def _gathered(self) -> tuple:
        """Keys and values [B, H, T, D] of every row's positions (T the longest row)."""
        keys, values, _ = self._rows(list(range(self.batch)))
        return keys, values

    def _rows(self, rows: list[int]) -> tuple:
        """Keys and values [len(rows), H, T, D] of these rows' positions, T the longest of them, and
        T. Whole pages are gathered (runs of page_tokens x H x D, not one element per index), then
        made contiguous: MLX's attention on the transposed view ran several times slower than on a
        contiguous copy (CPU, 16 rows x 4,368 positions x 8 heads x 64: 258 against 476 ms)."""
        P, T = self.pool.page_tokens, max(self.lengths[r] for r in rows)
        n = -(-T // P)
        table = self._page_table()
        table = table[:, :n] if len(rows) == self.batch else table[on_device(rows), :n]

        def gather(plane):
            pages = plane.reshape(-1, P, *plane.shape[1:])[table]  # [rows, n, P, H, D]
            return mx.contiguous(pages.reshape(len(rows), n * P, *plane.shape[1:])[:, :T].transpose(0, 2, 1, 3))

        return gather(self.pool.keys), gather(self.pool.values), T

    def _rows_left(self, rows: list[int]) -> tuple:
        """Keys and values [len(rows), H, T, D] of these rows' positions aligned to the right end
        (row r in columns T - length .. T - 1, the columns before it the zero page's first slot),
        each row's first column (int32), and T: the ragged kernel's layout. Gathered position by
        position on the device from the page table (a row's start is not a page boundary)."""
        P, T = self.pool.page_tokens, max(self.lengths[r] for r in rows)
        table = self._page_table()
        if len(rows) != self.batch:
            table = table[on_device(rows)]
        # by value: every layer's cache of the step has the same lengths, so its layers share one array
        start = on_device([T - self.lengths[r] for r in rows])
        pos = mx.arange(T)[None] - start[:, None]  # [rows, T]: the row's position of each column
        seen = pos >= 0
        pos = mx.maximum(pos, 0)
        slots = mx.where(seen, mx.take_along_axis(table, pos // P, axis=1) * P + pos % P, 0)

        def gather(plane):
            return mx.contiguous(plane[slots].transpose(0, 2, 1, 3))  # [rows, T, H, D] -> [rows, H, T, D]

        return gather(self.pool.keys), gather(self.pool.values), start, T

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        """Before this step's write of N positions per row: None / "causal" for one row (its keys are
        exactly its positions), else a boolean [B, 1, N, T] array: query j of row r sees the columns
        up to its own position, lengths[r] + j (and within `window_size` of it); columns past a
        row's end are the zero page's and never seen."""
        if self.batch == 1 and window_size is None:
            if N == 1:
                return None
            return causal(N, self.lengths[0]) if return_array else "causal"
        T = max(self.lengths) + N
        cols = mx.arange(T)[None, None]
        at = mx.array(self.lengths, dtype=mx.int32)[:, None, None] + mx.arange(N)[None, :, None]  # [B, N, 1]
        mask = cols <= at
        if window_size is not None:
            mask = mask & (cols > at - window_size)
        if self.batch == 1:
            return mask[0]
        return to_mask_rank(mask[:, None], self)

    # -- the rest of mlx-lm's cache protocol, for model code that reads it ---------------------
    @property
    def state(self):
        if self.empty():
            return None, None
        return self._gathered()

    def keys_and_values(self):
        return self.state

    def empty(self) -> bool:
        return not any(self.lengths)

    def is_trimmable(self) -> bool:
        return False

    # -- speculative decoding: remove rejected positions ------------------------------------------
    def trim_rows(self, counts: list[int]) -> None:
        """Drop the last counts[i] positions of row i; pages past a row's new end go back."""
        if len(counts) != self.batch or any(c < 0 or c > n for c, n in zip(counts, self.lengths)):
            raise ValueError(f"trim_rows: counts {counts} for rows of lengths {self.lengths}")
        P = self.pool.page_tokens
        for r, c in enumerate(counts):
            self.lengths[r] -= c
            keep = -(-self.lengths[r] // P)
            if keep < len(self.pages[r]):
                self.pool.release(self.pages[r][keep:])
                del self.pages[r][keep:]
                self._table = None
        self._offsets = None

    # -- batching: page lists move, KV does not ----------------------------------------------------
    def filter(self, rows: list[int]) -> None:
        gone = set(range(self.batch)) - set(rows)
        self.pool.release([p for r in gone for p in self.pages[r]])
        self.pages[:] = [self.pages[r] for r in rows]
        self.lengths[:] = [self.lengths[r] for r in rows]
        self._table = self._offsets = None

    def extend(self, other: "PagedKV") -> None:
        if other.pool is not self.pool:
            raise ValueError("paged caches of different layers' pools cannot join one batch")
        self.pages.extend(other.pages)
        self.lengths.extend(other.lengths)
        other.pages[:] = []  # its pages are this cache's now (its finalizer gives back nothing)
        other.lengths[:] = []
        self._table = self._offsets = None

    def extract(self, row: int) -> "PagedKV":
        out = PagedKV(self.pool)
        out.pages[:] = [list(self.pages[row])]
        out.lengths[:] = [self.lengths[row]]
        self.pool.retain(out.pages[0])
        return out

    # -- the prefix protocol's positions ---------------------------------------------------------
    def positions(self, row: int, start: int, end: int) -> tuple:
        """Keys and values of positions start..end-1 of `row`, each [H, n, D]."""
        return self.positions_rows([(row, start, end)])

    def positions_rows(self, spans: list) -> tuple:
        P = self.pool.page_tokens
        slots = np.concatenate([np.asarray(self.pages[r], np.int64)[np.arange(a, b) // P] * P + np.arange(a, b) % P
                                for r, a, b in spans])
        idx = mx.array(slots, dtype=mx.int32)
        return self.pool.keys[idx].swapaxes(0, 1), self.pool.values[idx].swapaxes(0, 1)

    def write_positions(self, keys: mx.array, values: mx.array) -> None:
        """A fresh batch of one takes [H, m, D] keys / values as its positions 0..m-1."""
        self.update_and_fetch(keys[None], values[None])

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.pages)) * self.pool.page_tokens * self.pool.bytes_per_slot

    def live_bytes(self) -> int:
        """Of nbytes, the bytes holding the rows' own tokens (runtime/kv_usage.py)."""
        return sum(self.lengths) * self.pool.bytes_per_slot


MAX_GROUPS = 4  # attention calls a layer makes at most (rows of similar length attend together)


def length_groups(lengths: list[int]) -> list[list[int]]:
    """Row indices in groups of similar length, shortest group first: a group grows while attending all
    its rows to its longest costs at most 1.5x their own positions (runtime/prefill_groups.py's rule
    for batched prompts); past MAX_GROUPS groups, the rows are cut into MAX_GROUPS of equal count."""
    order = sorted(range(len(lengths)), key=lambda r: lengths[r])
    groups: list[list[int]] = []
    for r in order:
        g = groups[-1] if groups else None
        if g is not None and lengths[r] * (len(g) + 1) <= 1.5 * (sum(lengths[i] for i in g) + lengths[r]):
            g.append(r)
        else:
            groups.append([r])
    if len(groups) > MAX_GROUPS:
        k = -(-len(order) // MAX_GROUPS)
        groups = [order[i:i + k] for i in range(0, len(order), k)]
    return [sorted(g) for g in groups]  # each group's rows in batch order (one group: the batch as is)


@register_policy("paged")
class PagedPolicy(CachePolicy):
    """Full-attention KV in pages of a per-layer pool (see the module docstring)."""

    LAYER_KINDS = ("full_attention",)
    PARAMS = {"page_tokens": PolicyParam(int, 16, "positions a page holds: a row holds at most page_tokens - 1 "
                                                  "more than its tokens")}
    prefix_kind = PrefixKind.TOKENS

    def __init__(self, layer, **params):
        super().__init__(layer, **params)
        if self.params["page_tokens"] < 1:
            raise ValueError(f"cache policy 'paged': page_tokens must be >= 1, got {self.params['page_tokens']}")
        self.pool = PagePool(self.params["page_tokens"])

    def new_cache(self) -> PagedKV:
        return PagedKV(self.pool)

    def prefix_capture(self, cache: PagedKV, row: int, start: int, end: int) -> PrefixState:
        return PrefixState(PrefixKind.TOKENS, start, end, cache.positions(row, start, end))

    def prefix_capture_rows(self, cache: PagedKV, spans: list) -> tuple:
        return cache.positions_rows(spans)

    def prefix_restore(self, state: PrefixState) -> PagedKV:
        out = PagedKV(self.pool)
        out.write_positions(*state.arrays)
        return out
