"""Compiled decode: the lowered decode step's forward under `mx.compile`, on fixed-shape KV.

Why: a decode step is hundreds of small ops; building them through Python (mlx-lm's
modules, the graph lowering) costs host time every step, which is what bounds small
models at small batches. `mx.compile` traces the forward once per input shape and
replays it from C++ (and fuses elementwise chains), so the per-step host cost drops.

What makes the step compile-friendly (the shapes stop changing every step):
- KV stays in the `full` policy's buffers (`FullKV`: capacity grows by doubling), and
  a step attends over the whole capacity with a [B, 1, 1, C] mask — `cols <= idx` and
  `cols >= left_pad[row]` — instead of slicing `[:idx+1]`;
- the write column and RoPE positions are arrays (`mx.slice_update` at an array
  index; offset = idx - left_pad), not Python ints baked into the trace;
- capacities are bucketed (powers of two up to 256, then multiples of 256), so
  shapes change at most once per 256 steps; each distinct (batch size, capacity) is
  traced once and then reused from mx.compile's cache (batch sizes are not padded to buckets: a bucketed batch would
  pay a KV copy on every membership change; the trace cache makes that unnecessary).

Exactness: masked columns get zero weight, so the tokens are those of the
uncompiled step (tests/test_compiled_decode.py checks greedy tokens are identical).
Only the forward (embed, decoder, logits) is compiled; the head (edits, sampling,
logprobs) runs as lowered, so host edit rows and sampling packs work unchanged.
Batches whose caches are not `FullKV` (other policies) run uncompiled.
"""

from __future__ import annotations

import mlx.core as mx

from graphc.compiler.lower import LoweredStep, StepContext, StepInputs

from .cache.full import MIN_CAPACITY, FullKV


class _FixedKV:
    """What an mlx-lm layer sees inside the trace: array offsets, a write at an array column."""

    def __init__(self, keys, values, idx, offset, mask):
        self.keys, self.values = keys, values
        self.idx, self.offset, self.mask = idx, offset, mask

    def update_and_fetch(self, k, v):
        self.keys = mx.slice_update(self.keys, k, self.idx, axes=(2,))
        self.values = mx.slice_update(self.values, v, self.idx, axes=(2,))
        return self.keys, self.values

    def make_mask(self, N, window_size=None, return_array=False):
        if window_size is not None:
            raise ValueError("compiled decode serves full-attention layers only")
        return self.mask


CAPACITY_STEP = 256


def _bucket(n: int) -> int:
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


class CompiledDecode:
    """Drop-in for the runner's decode `LoweredStep` (forward / head / node names)."""

    def __init__(self, step: LoweredStep):
        self.step = step
        self.hidden_node = step.hidden_node
        self.logits_node = step.logits_node
        self.plan = step.plan
        self.binding = step.binding
        self._fn = mx.compile(self._traced)
        self.compiled_steps = 0
        self.fallback_steps = 0

    def _traced(self, tokens, idx, left_pad, keys, values):
        C = keys[0].shape[2]
        cols = mx.arange(C)
        mask = ((cols[None] <= idx) & (cols[None] >= left_pad[:, None]))[:, None, None, :]
        offset = idx - left_pad
        shims = [_FixedKV(k, v, idx, offset, mask) for k, v in zip(keys, values)]
        ctx = self.step.forward(StepInputs(tokens, shims))
        vals = {k: v for k, v in ctx.values.items() if isinstance(v, mx.array)}
        return vals, [s.keys for s in shims], [s.values for s in shims]

    def eligible(self, inputs: StepInputs) -> bool:
        caches = inputs.caches
        return (inputs.tokens.ndim == 2 and inputs.tokens.shape[1] == 1 and bool(caches)
                and all(type(c) is FullKV and c.keys is not None for c in caches))

    def forward(self, inputs: StepInputs) -> StepContext:
        if not self.eligible(inputs):
            self.fallback_steps += 1
            return self.step.forward(inputs)
        caches = inputs.caches
        first = caches[0]
        need = first.idx + 1
        for c in caches:
            cap = c.keys.shape[2]
            if cap < need or cap != _bucket(cap):
                # Grow (or re-round after a filter shifted columns) to a bucketed capacity:
                # one copy now, then every step writes in place at a fixed shape.
                _reshape_capacity(c, _bucket(need))
        idx = mx.array(first.idx, dtype=mx.int32)
        left_pad = mx.array(first.left_pad, dtype=mx.int32)
        vals, keys, values = self._fn(inputs.tokens, idx, left_pad,
                                      [c.keys for c in caches], [c.values for c in caches])
        for c, k, v in zip(caches, keys, values):
            c.keys, c.values = k, v
            c.idx += 1
            c._offset = None
        ctx = StepContext(self.step.binding, inputs)
        ctx.values.update(vals)
        self.compiled_steps += 1
        return ctx

    def head(self, ctx: StepContext, extra_edits=None):
        return self.step.head(ctx, extra_edits)

    def __call__(self, inputs: StepInputs):
        return self.head(self.forward(inputs))


def _reshape_capacity(c: FullKV, cap: int) -> None:
    """Copy `c`'s written columns into fresh [B, H, cap, D] buffers (cap >= c.idx + 1)."""
    B, H, _, D = c.keys.shape
    Dv = c.values.shape[3]
    cap = max(cap, _bucket(c.idx + 1))
    k = mx.zeros((B, H, cap, D), c.keys.dtype)
    v = mx.zeros((B, H, cap, Dv), c.values.dtype)
    if c.idx:
        k[..., : c.idx, :] = c.keys[..., : c.idx, :]
        v[..., : c.idx, :] = c.values[..., : c.idx, :]
    c.keys, c.values = k, v
