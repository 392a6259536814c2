"""Eager verify forwards with their attention in the ragged kernel (runtime/kernels/decode_attention.py).

Why: a verify forward has L = k + 1 causal queries per row, and MLX's CUDA attention takes
its fused kernel only for a query or two without an array mask; for L = 9 it falls back
to several kernels, two of them cuBLAS calls that each ask cuBLAS's heuristics on the host.
A verify step is host-bound (its device time is a fraction of a millisecond at batch 1), and
on the H200 that fallback cost ~175 us of host encode per layer against ~24 us for the
kernel: a third of a SmolLM2 verify step (docs/performance.md, run 12).

How: for one verify forward each layer's `FullKV` is wrapped in a view (`_KernelKV`) that
delegates mlx-lm's cache protocol to it and adds `run_layer` / `attend`
(contracts/decode_block.py). The fast lowering's attention op (compiler/ops/forward.py)
then runs every layer the architecture has an own block for (`ArchAdapter.own_block`: the
llama family's) through that block, whose attention reads the cache's whole buffer through
the kernel: each row's first valid column (its left padding) and the columns written so
far, causal among the L new ones. Layers without one run as mlx-lm's modules, unchanged.
Every other op is the one mlx-lm's block runs; the attention matches MLX's to rounding (the
kernel's `check()` compared them in this process before any use).
"""

from __future__ import annotations

import mlx.core as mx

from ..cache.full import FullKV


class _KernelKV:
    """One layer's FullKV as one verify forward sees it."""

    def __init__(self, inner: FullKV, blocks: dict, start: mx.array):
        self.inner = inner
        self._blocks = blocks  # {id(layer): block} (decode_attention.kernel_blocks)
        self.start = start  # int32 [B]: each row's first valid column

    def __getattr__(self, name):  # mlx-lm's cache protocol: offset, make_mask, state, ...
        return getattr(self.inner, name)

    def update_and_fetch(self, keys, values):
        return self.inner.update_and_fetch(keys, values)

    def run_layer(self, layer, h, mask):
        block = self._blocks.get(id(layer))
        return layer(h, mask, self.inner) if block is None else block(layer, h, self)

    def attend(self, q, k, v, scale):
        from ..kernels.decode_attention import ragged_attention

        c = self.inner  # k, v are views of its buffers up to the written columns: read the buffers
        return ragged_attention(q, c.keys, c.values, self.start, mx.array([c.idx], dtype=mx.int32), scale)


class KernelViews:
    """`views(caches)`: the caches one eager verify forward runs on (kernel views, or the caches
    themselves where they cannot take them); `note`: on, or why not (the bench prints it)."""

    def __init__(self, step, enabled: bool = True):
        from ..kernels import decode_attention

        binding = step.binding
        adapter = getattr(binding, "adapter", None)
        self.blocks = {}
        if not enabled:
            self.note = "off (decode: {attention_kernel: false})"
        elif binding.lowering != "fast" or adapter is None:
            self.note = "off (the generic lowering runs the model's own forward)"
        elif not (blocks := decode_attention.kernel_blocks(adapter)):
            self.note = f"off ({type(adapter).__name__} runs no layer of this model as its own block)"
        elif (why := decode_attention.check()) is not None:
            self.note = f"off ({why})"
        else:
            self.blocks = blocks
            self.note = f"on ({len(blocks)} of {len(adapter.layers)} layers)"

    @property
    def on(self) -> bool:
        return bool(self.blocks)

    def __call__(self, caches: list) -> list:
        if not self.blocks or not caches or not all(type(c) is FullKV and c.keys is not None for c in caches):
            return caches
        start = mx.array(caches[0].left_pad, dtype=mx.int32)
        return [_KernelKV(c, self.blocks, start) for c in caches]
