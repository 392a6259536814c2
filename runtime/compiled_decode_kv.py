"""The fixed-shape caches a compiled decode trace runs on (runtime/compiled_decode.py), and the
capacity buckets their buffers live in.

Inside the trace each layer sees a `_FixedKV` (bf16 `FullKV` planes) or a `FixedQuantizedKV`
(runtime/compiled_decode_quantized.py): mlx-lm's cache protocol with the write column and RoPE
offsets as arrays, so one trace serves every step at a (batch size, capacity) shape. Outside it,
the caches' buffers are kept at bucketed capacities (`bucket`, `fit_capacity`) and the trace's
written planes are stored back (`store_planes`).
"""

from __future__ import annotations

import mlx.core as mx

from . import kernels
from .cache.full import MIN_CAPACITY, FullKV
from .compiled_decode_quantized import FixedQuantizedKV
from .kernels import decode_attention
from .trace_layers import TraceLayers


class _FixedKV(TraceLayers):
    """What an mlx-lm layer sees inside the trace: array offsets, a write at an array column.

    Also the cache a fused decode block runs through (contracts/decode_block.py)."""

    def __init__(self, keys, values, idx, offset, mask, start, end, fused, kernel, matmul, blocks=None,
                 write=False, residual=False):
        self.keys, self.values = keys, values
        self.idx, self.offset, self.mask = idx, offset, mask
        self.start, self.end = start, end  # first valid column per row, one past the last
        self.fused, self.kernel = fused, kernel
        # {id(layer): block} for unfused layers the kernel serves (decode_attention.kernel_blocks).
        self.blocks = blocks or {}
        self.matmul = matmul  # x @ w.T for the fused block's projections (MLX's or the skinny kernel)
        self.write = write  # attend_new writes the new columns inside the kernel (kv_write_kernel)
        self.residual = residual  # plus_matmul adds x in the matmul (residual_matmul)

    def plus_matmul(self, x, y, w):
        """x + y @ w.T for a fused block's residual: one matmul that takes x as its C input
        (`mx.addmm`; on CUDA cuBLAS adds it in the epilogue and rounds once), or the matmul and an add."""
        if self.residual:
            return mx.addmm(x, y, w.T)
        return x + self.matmul(y, w)

    @property
    def planes(self) -> list:
        return [self.keys, self.values]

    def update_and_fetch(self, k, v):
        self.keys = write_columns(self.keys, k, self.idx)
        self.values = write_columns(self.values, v, self.idx)
        return self.keys, self.values

    def attend_new(self, q, k, v, scale):
        """Write this step's keys / values and attend over the valid columns: on CUDA one kernel
        launch that writes them into the buffers in place (decode_attention.ragged_attention's
        `new`), else a scatter and the attention. In place is safe here: the buffers are plain
        row-contiguous `FullKV` arrays (`layer_formats`), every step is submitted before anything that
        reads a later column is built (runner._launch), and nothing reads a column past `idx`."""
        if self.write and self._kernel_takes(q, k):
            return decode_attention.ragged_attention(q, self.keys, self.values, self.start, self.end, scale, new=(k, v))
        keys, values = self.update_and_fetch(k, v)
        return self.attend(q, keys, values, scale)

    def _kernel_takes(self, q, k) -> bool:
        return self.kernel and q.shape[-1] % 32 == 0 and q.shape[1] % k.shape[1] == 0

    def run_block(self, layer, h):
        if self.kernel and id(layer) in self.blocks:  # e.g. quantized projections
            return self.blocks[id(layer)](layer, h, self)
        return None

    def attend(self, q, k, v, scale):
        if self._kernel_takes(q, k):
            return decode_attention.ragged_attention(q, k, v, self.start, self.end, scale)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=self.mask)


def write_columns(buf, new, idx):
    """`buf[:, :, idx:idx + L] = new` for an array column `idx` (new: [B, H, L, D]).

    Why not always `mx.slice_update(buf, new, idx, axes=(2,))`: at an array index MLX's CUDA
    backend runs it as a dynamic copy whose device time grows with the whole buffer, not with
    the L columns written — 92 µs per layer-write at batch 64 and capacity 256, 293 µs at
    1,024, against 8 µs for this scatter (H200, benchmarks/probes/kv_write.py). At
    Llama-3.1-8B batch 64 that copy was 8.5 of the compiled step's 17.2 ms of device time
    (ncu). On the CPU the slice update is the faster of the two
    (11 against 53 µs at batch 4), so it stays there."""
    if not _scatter_writes():
        return mx.slice_update(buf, new, idx, axes=(2,))
    L = new.shape[2]
    cols = (idx + mx.arange(L, dtype=idx.dtype)) if L > 1 else idx
    return mx.put_along_axis(buf, mx.broadcast_to(cols.reshape(1, 1, L, 1), new.shape), new, axis=2)


def on_cuda() -> bool:
    """MLX's CUDA backend is the default device: what switches on the device-only choices here."""
    return kernels.available()


def _scatter_writes() -> bool:  # its own name: tests force the scatter alone
    return on_cuda()


def fixed_caches(d, formats, planes, idx, offset, mask, start, end) -> list:
    """Each layer's fixed-shape cache for a trace of the CompiledDecode `d` (its fused blocks,
    kernels and matmul): `_FixedKV` over bf16 planes, `FixedQuantizedKV` over codes."""
    return [_FixedKV(p[0], p[1], idx, offset, mask, start, end, d.fused, d.kernel, d.matmul,
                     d.blocks, d.write, d.residual) if f is None else
            FixedQuantizedKV(p, f, idx, offset, mask, d.fused, d.matmul, d.residual, write_columns)
            for f, p in zip(formats, planes)]


CAPACITY_STEP = 256


def bucket(n: int) -> int:
    """Capacity for n columns: powers of two up to CAPACITY_STEP, then multiples of it.

    Finer than doubling at long contexts because every step attends over the whole
    capacity: the step bounds the wasted KV reads; each new capacity costs one copy and
    one trace (at most once per CAPACITY_STEP decode steps).
    """
    cap = MIN_CAPACITY
    while cap < n and cap < CAPACITY_STEP:
        cap *= 2
    if cap >= n:
        return cap
    return -(-n // CAPACITY_STEP) * CAPACITY_STEP


def fit_capacity(caches: list, need: int) -> None:
    """Every cache at a bucketed capacity of at least `need` columns."""
    for c in caches:
        cap = c.keys.shape[2]
        if cap < need or cap != bucket(cap):
            # Grow (or re-round after a filter shifted columns) to a bucketed capacity:
            # one copy now, then every step writes in place at a fixed shape.
            reshape_capacity(c, bucket(need))


def cache_planes(caches: list) -> list:
    """Each layer's arrays in its PLANES order: what a trace takes (keys, values; quantized: six)."""
    return [[getattr(c, name) for name in c.PLANES] for c in caches]


def store_planes(caches: list, planes: list, n: int) -> None:
    """The trace's written planes back into the caches, `n` columns further."""
    for c, arrays in zip(caches, planes):
        for name, a in zip(c.PLANES, arrays):
            setattr(c, name, a)
        c.idx += n


def reshape_capacity(c: FullKV, cap: int) -> None:
    """Copy `c`'s written columns into fresh [B, H, cap, ...] buffers, every plane (cap >= the columns needed)."""
    cap = max(cap, bucket(c.idx + 1))
    for name in c.PLANES:
        old = getattr(c, name)
        new = mx.zeros(old.shape[:2] + (cap,) + old.shape[3:], old.dtype)
        if c.idx:
            new[..., : c.idx, :] = old[..., : c.idx, :]
        else:  # zeros are one broadcast element: a kernel that writes in place needs a real buffer
            new = mx.contiguous(new)
        setattr(c, name, new)
