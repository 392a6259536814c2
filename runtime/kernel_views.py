"""Eager forwards with their attention in the ragged kernel (runtime/kernels/decode_attention.py).

Why: on MLX's CUDA backend `mx.fast.scaled_dot_product_attention` takes a fused kernel for
one query (or a few) without an array mask. Two eager steps miss it:

- a speculative **verify** forward: L = k + 1 causal queries per row;
- a **decode step whose rows are left-padded** (rows that joined a running batch at
  different lengths, which continuous batching makes the common case): an array mask.

Both then fall back to a chain of kernels, two of them cuBLAS calls that each query cuBLAS's
heuristics on the host; on the H200 that cost ~175 us of host encode per layer against ~24 us
for the kernel, and small-batch steps are host-bound.

How: for one forward each layer's `FullKV` is wrapped in a view (`_KernelKV`) that
delegates mlx-lm's cache protocol to it and adds `run_layer` / `attend`
(contracts/decode_block.py). The fast lowering's attention op (compiler/ops/forward.py)
then runs every layer the architecture has an own block for (`ArchAdapter.own_block`: the
llama family's) through that block, whose attention reads the cache's whole buffer through
the kernel: each row's first valid column (its left padding) and the columns written so
far, causal among the L new ones. Layers without one run as mlx-lm's modules, unchanged.
Every other op is the one mlx-lm's block runs; the attention matches MLX's to rounding (the
kernel's `check()` compared them in this process before any use). Compiled steps
(runtime/compiled_decode.py) have their own fixed-shape caches and take the kernel there.
"""

from __future__ import annotations

import mlx.core as mx

from graphc.compiler.fused_block import llama_block, llama_not_own_block

from .cache.full import FullKV
from .cache.paged import PagedKV
from .kernels import decode_attention


# Every eager decode step over left-padded rows takes the kernel, at any batch size: MLX's attention
# with an array mask reads every row's padding on its slow path. On an H100 (MLX 0.32.4,
# benchmarks/probes/ragged_decode.py, Llama-3.2-1B heads, one layer): 64 rows of the serving mix's
# lengths (64-4096 tokens, 22% of 4,352 columns live) 2,109 us masked against 86 us in the kernel;
# 64 rows of one length padded by 240 columns 679 against 71 us; 16 rows 415 against 27 us. At the
# door (python -m graphc.benchmarks.step_timeline, 64 requests at once) a decode step of 64 rows
# went from 42 to 5.2 ms (median).


class _KernelKV:
    """One layer's FullKV as one eager forward sees it."""

    def __init__(self, inner: FullKV, blocks: dict, start: mx.array, ends: dict):
        self.inner = inner
        self._blocks = blocks  # {id(layer): block} (decode_attention.kernel_blocks)
        self.start = start  # int32 [B]: each row's first valid column
        self._ends = ends  # written columns -> int32 [1], one array for all layers of the forward

    def __getattr__(self, name):  # mlx-lm's cache protocol: offset, make_mask, state, ...
        return getattr(self.inner, name)

    def update_and_fetch(self, keys, values):
        return self.inner.update_and_fetch(keys, values)

    def run_layer(self, layer, h, mask):
        block = self._blocks.get(id(layer))
        return layer(h, mask, self.inner) if block is None else block(layer, h, self)

    def attend_new(self, q, k, v, scale):
        # Eager steps write through FullKV (MLX's slice update); only compiled steps write in the kernel.
        keys, values = self.update_and_fetch(k, v)
        return self.attend(q, keys, values, scale)

    def attend(self, q, k, v, scale):
        c = self.inner  # k, v are views of its buffers up to the written columns: read the buffers
        end = self._ends.get(c.idx)
        if end is None:
            end = self._ends[c.idx] = mx.array([c.idx], dtype=mx.int32)
        return decode_attention.ragged_attention(q, c.keys, c.values, self.start, end, scale)


class _PagedKernelKV:
    """One layer's PagedKV as one eager decode step sees it: the same cache, its llama blocks'
    attention of one query per row in the ragged kernel (PagedKV.attend_new's `kernel`)."""

    def __init__(self, inner: PagedKV, blocks: dict):
        self.inner = inner
        self._blocks = blocks

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run_layer(self, layer, h, mask):
        # PagedKV.run_layer with this view as the cache its llama block attends through
        if id(layer) not in self._blocks or llama_not_own_block(layer) is not None:
            return self.inner.run_layer(layer, h, mask)
        return llama_block(layer, None, h, self)

    def attend_new(self, q, k, v, scale):
        return self.inner.attend_new(q, k, v, scale, kernel=decode_attention.ragged_attention)


class KernelViews:
    """`views(caches)`: the caches one eager forward runs on (kernel views, or the caches
    themselves where they cannot take them); `note`: on, or why not (the bench prints it)."""

    def __init__(self, step):
        # The decode plan's "attention (eager steps)" choice (compiler/passes/decode_choices.py)
        # says whether the kernel serves and why; the blocks are the layers it fits.
        choice = step.plan.choice("attention (eager steps)")
        self.note = choice.why
        self.adapter = step.binding.adapter
        self.blocks = (decode_attention.kernel_blocks(self.adapter)
                       if choice.choice == "cuda decode kernel" else {})

    @property
    def on(self) -> bool:
        return bool(self.blocks)

    def warm(self, max_batch: int) -> int:
        """Each kernel build a decode step of 1..max_batch rows may take, launched once (Engine.warm_up,
        runtime/warmup.py; DecodeAttention.warm says why); how many. Heads and dtype are each layer's
        (the dtype its output projection computes in: a quantized one's scales)."""
        shapes = set()
        for layer in (lay for lay in self.adapter.layers if id(lay) in self.blocks):
            a = layer.self_attn
            dtype = getattr(a.o_proj, "scales", a.o_proj.weight).dtype
            shapes.add((a.n_heads, a.n_kv_heads, a.head_dim, dtype))
        return sum(decode_attention.KERNEL.warm(hq, hkv, d, dt, max_batch) for hq, hkv, d, dt in shapes)

    def __call__(self, caches: list) -> list:
        if not self.blocks or not caches or not all(type(c) is FullKV and c.keys is not None for c in caches):
            return caches
        start, ends = caches[0].left_pad_array(), {}
        return [_KernelKV(c, self.blocks, start, ends) for c in caches]

    def for_decode(self, step, inputs) -> list:
        """The caches a plain decode step runs on: views when its rows are left-padded and it runs
        eagerly (a compiled step that takes the batch has its own kernel path; rows that started
        together take MLX's fused one-query kernel, no mask needed)."""
        caches = inputs.caches
        if self.blocks and caches and all(type(c) is PagedKV for c in caches):
            return [_PagedKernelKV(c, self.blocks) for c in caches]
        if not self.blocks or not caches or type(caches[0]) is not FullKV or not any(caches[0].left_pad):
            return caches
        eligible = getattr(step, "eligible", None)  # runtime/compiled_decode.py
        if eligible is not None and eligible(inputs):
            return caches
        return self(caches)
