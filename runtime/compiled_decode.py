"""Compiled decode (`Engine(..., compile=True)`): the decode forward under `mx.compile`.

Why: a decode step is hundreds of small ops; building them through Python (mlx-lm's
modules, the graph lowering) costs host time every step, which is what bounds small
models at small batches. `mx.compile` traces the forward once per input shape and
replays it from C++ (and fuses elementwise chains), so the per-step build cost drops
(docs/performance.md, host table: about half at batch 64).

What makes the step compile-friendly (the shapes stop changing every step):
- KV stays in the `full` / `pool_backed` policies' `FullKV` buffers; a step attends
  over the whole capacity, each row limited to its valid columns (`left_pad[row]` up
  to the write column) — by a [B, 1, 1, C] mask for MLX's attention, or on CUDA by the
  ragged decode-attention kernel (runtime/kernels/decode_attention.py), which takes the first
  and end columns instead of a mask and reads only valid columns;
- the write column and RoPE positions are arrays (offset = idx - left_pad), not Python
  ints baked into the trace; the new K/V columns are written at the array column by
  the attention kernel itself, in place (CUDA, `kv_write_kernel`: `_FixedKV.attend_new`),
  else by `write_columns` (a scatter on CUDA, `mx.slice_update` elsewhere: see there why);
  these fixed-shape caches are runtime/compiled_decode_kv.py;
- capacities are bucketed (powers of two up to 256, then multiples of 256), so
  shapes change at most once per 256 steps; each distinct (batch size, capacity) is
  traced once and reused from mx.compile's cache. Batch sizes are not padded to
  buckets: that would cost a KV copy on every membership change, and the trace cache
  already holds one trace per batch size seen.
- where the architecture supplies a fused decode block (the adapter's `fused_decode`,
  compiler/fused_block.py: llama's runs q/k/v and gate/up as one matmul each), layers run
  through it; its fused weights are graphc's own arrays, the model is left untouched.

Exactness: masked columns get zero weight and the fused matmuls compute the same dot
products, so on the CPU the tokens are those of the uncompiled step
(tests/test_compiled_decode.py); on a GPU the kernel and the fused matmuls round
differently (the bench's `exact` workload reports how often tokens still agree).
Only the forward (embed, decoder, logits) is compiled; the head (edits, sampling,
logprobs) runs as lowered, so host edit rows and sampling work unchanged. Quantized KV
(`kv_bits`: the built-in QuantizedKV formats) compiles too, its codes, scales and biases at the
same capacity buckets (runtime/compiled_decode_quantized.py); batches whose caches are neither
plain `FullKV` nor those (other policies, subclasses) run uncompiled.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx

from graphc.compiler.fused_block import FusedBlocks
from graphc.compiler.lower import LoweredStep, StepContext, StepInputs
from graphc.compiler.ops.registry import is_model_dtype_key

from .compiled_decode_kv import bucket, cache_planes, fit_capacity, fixed_caches, store_planes
from .compiled_decode_quantized import layer_formats, quantized_note
from .kernels import decode_attention, skinny_matmul
from .measured_gate import ArmGate


def _mlx_matmul(x, w):
    return x @ w.T


# `Engine(compile="auto")`: batches up to this many rows decode compiled, larger ones eager.
# Why 64 and not less: a K/V write at an array column with `mx.slice_update` costs device time in
# proportion to the whole buffer (8.5 of the compiled step's 17.2 ms at 8B batch 64 under ncu),
# which made the compiled step lose at batch 64 (8B: 16.0-16.6 against 9.7-10.9 ms). With the
# scatter write (`write_columns`) the same step has 9.4 ms of device time against eager's 9.9,
# and per step it ran 7.9-8.2 against 7.8-9.1 ms
# (8B batch 64), 2.7-4.0 against 3.7-5.8 (1B batch 64), 5.0 against 5.9-6.3 (8B batch 1); through
# the public API at 8B batch 64 13.6 against eager 15.6 ms (H200). Larger
# batches have not been measured, so they stay eager; `compile="measured"` decides per batch.
AUTO_MAX_BATCH = 64

# ... and only while rows x KV capacity stays within this many columns. A compiled step attends
# over its fixed-capacity buffers with a mask, so on CUDA its attention is graphc's kernel; the
# eager step of rows that started together gets MLX's fused one-query kernel, which reads long
# contexts about twice as fast (H200, benchmarks/probes/gqa_attention.py, 8B shape: 57
# against 57 µs a layer at batch 64 and 272 columns, 145 against 89 at 1,040, 513 against 274 at
# 4,112; batch 16 at 4,112: 144 against 87). At 32 layers that loss passes what compiling saves
# (~2 ms a step at 8B batch 64) near 64 x 1,024 columns; below 32,768 it is within 0.3 ms.
AUTO_MAX_KV = 32768


def build_decode_step(step: LoweredStep):
    """The runtime's decode step for a decode plan: the compiled one when the plan's compile mode
    compiles, else the lowered step itself."""
    return CompiledDecode(step) if step.plan.choice("compile mode").choice != "eager" else step


class CompiledDecode:
    """Drop-in for the runner's decode `LoweredStep` (forward / head / node names), built from the
    plan's choices (`build_decode_step`).

    `max_batch`: larger batches run the eager step on the same caches (None: no limit);
    `max_kv`: so do batches whose rows x capacity bucket exceeds it (None: no limit).
    Both read and write the same `FullKV` buffers, so a batch may cross the limits between
    steps; the compiled side re-buckets the capacity when it takes a batch back.
    """

    def __init__(self, step: LoweredStep):
        # Everything below obeys the decode plan's choices (compiler/passes/decode_choices.py),
        # made at compile time from the graph's `decode:` options, the engine's overrides and the
        # device's facts (runtime/target.py): nothing here checks the device or a kernel again.
        plan = step.plan
        mode = plan.choice("compile mode").choice
        self.max_batch = AUTO_MAX_BATCH if mode == "auto" else None
        self.max_kv = AUTO_MAX_KV if mode == "auto" else None
        # compile="measured": a declared measured choice (its arms in the plan); per batch-size
        # bucket the runner's decode cycles are timed and the faster of the compiled and the eager
        # step runs (runtime/measured_gate.py), so compile is never kept where it measured slower.
        measured = plan.choice("compile mode")
        self.gate = ArmGate(arms=measured.arms) if measured.measured else None
        self.step = step
        self.hidden_node = step.hidden_node
        self.logits_node = step.logits_node
        self.plan = step.plan
        self.binding = step.binding
        # The architecture's fused decode block, if it has one (compiler/archs.py fused_decode).
        self.fused = (step.binding.adapter.fused_decode() if plan.option("fuse_projections")
                      else FusedBlocks.none("off (decode: {fuse_projections: false})"))
        attention = plan.choice("attention (compiled steps)")
        self.kernel = attention.choice == "cuda decode kernel"
        self.kernel_note = None if self.kernel else attention.why
        # Layers with no fused block (quantized projections) still take the kernel through the
        # architecture's own block: MLX's attention with an array mask falls back to several kernels.
        self.blocks = decode_attention.kernel_blocks(step.binding.adapter) if self.kernel else {}
        # The kernel also writes each step's K/V columns in place (no scatter launch per layer and plane).
        write = plan.choice("K/V write")
        self.write = write.choice == "in the attention kernel"
        self.write_note = None if self.write else write.why
        # The skinny matmul for the fused blocks' projections and the head (runtime/kernels/skinny_matmul.py).
        matmul = plan.choice("projections (compiled steps)")
        self.skinny = matmul.choice == "skinny kernel"
        self.skinny_note = None if self.skinny else matmul.why
        if self.skinny and plan.option("skinny_table"):
            skinny_matmul.load_table(plan.option("skinny_table"))  # a bad table fails here, not in a step
        self.matmul = skinny_matmul.matmul if self.skinny else _mlx_matmul
        # The fused blocks' residual adds as the o_proj / down_proj matmuls' C input: two launches
        # a layer fewer. CUDA only, where the step's numbers already differ from mlx-lm's by
        # rounding (the kernels above); on the CPU the step keeps mlx-lm's exact adds.
        residual = plan.choice("residual adds")
        self.residual = residual.choice != "separate add"
        self.residual_note = None if self.residual else residual.why
        # Batches of plain FullKV layers: (tokens, idx, left_pad, keys, values). With quantized KV
        # one compiled function per layer-format tuple (runtime/compiled_decode_quantized.py
        # layer_formats: None for FullKV, (bits, group_size) for quantized KV), fixed per engine.
        self._fn = mx.compile(self._traced_plain)
        self._fns: dict = {}
        # Speculative verify steps (runtime/speculative/): [B, L] tokens, the plan's verify node.
        self.verify_node = step.outputs.get("verify")
        self._verify_fns: dict = {}
        self.verify_steps = 0
        self.compiled_steps = 0
        self.fallback_steps = 0

    @staticmethod
    def _compiled(fns: dict, formats: tuple, fn):
        if formats not in fns:
            fns[formats] = mx.compile(partial(fn, formats))
        return fns[formats]

    def _traced_plain(self, tokens, idx, left_pad, keys, values):
        vals, planes = self._traced((None,) * len(keys), tokens, idx, left_pad, [list(kv) for kv in zip(keys, values)])
        return vals, [p[0] for p in planes], [p[1] for p in planes]

    def _traced(self, formats, tokens, idx, left_pad, planes):
        C = planes[0][0].shape[2]
        cols = mx.arange(C)
        mask = ((cols[None] <= idx) & (cols[None] >= left_pad[:, None]))[:, None, None, :]
        offset = idx - left_pad
        end = (idx + 1).reshape(1)
        shims = fixed_caches(self, formats, planes, idx, offset, mask, left_pad, end)
        ctx = self.step.forward(StepInputs(tokens, shims, matmul=self.matmul if self.skinny else None))
        vals = {k: v for k, v in ctx.values.items() if isinstance(v, mx.array)}
        for key in [k for k in vals if is_model_dtype_key(k)]:
            # A compiled function computes every output it returns, read or not: the logits' float32
            # cast is rebuilt lazily outside (forward), so a greedy step (argmax of the model-dtype
            # logits) never computes it.
            vals.pop(key[0], None)
        return vals, [s.planes for s in shims]

    def _traced_verify(self, formats, tokens, lengths, idx, left_pad, planes):
        # Query j of a row sees columns left_pad..idx + j: the cache's valid columns and the
        # verify positions up to its own (causal inside the L new ones).
        L, C = tokens.shape[1], planes[0][0].shape[2]
        cols = mx.arange(C)[None, None]
        last = (idx + mx.arange(L))[None, :, None]
        mask = ((cols <= last) & (cols >= left_pad[:, None, None]))[:, None]  # [B, 1, L, C]
        offset = idx - left_pad
        end = (idx + L).reshape(1)  # the kernel: query j sees columns up to end - L + j = idx + j
        shims = fixed_caches(self, formats, planes, idx, offset, mask, left_pad, end)
        ctx = self.step.forward(StepInputs(tokens, shims, all_positions=True, options={"draft_lengths": lengths},
                                           matmul=self.matmul if self.skinny else None))
        out = ctx.values[self.verify_node]
        return out.targets, out.accepted, [s.planes for s in shims]

    def verify(self, tokens: mx.array, lengths: list, caches: list):
        """A speculative verify forward, compiled: (targets [B, L], accepted [B]) lazy, the caches
        advanced by L columns; None where the batch is not eligible (the eager step runs it).
        One trace per (batch size, L, capacity bucket): the speculator pads L to a few sizes."""
        B, L = tokens.shape
        formats = layer_formats(caches)
        if self.verify_node is None or not self._within(B, caches, L) or formats is None:
            return None
        fit_capacity(caches, caches[0].idx + L)
        first = caches[0]
        idx = mx.array(first.idx, dtype=mx.int32)
        left_pad = first.left_pad_array()  # on the device already: no page migration a step
        fn = self._compiled(self._verify_fns, formats, self._traced_verify)
        targets, accepted, planes = fn(tokens, mx.array(lengths, dtype=mx.int32), idx, left_pad, cache_planes(caches))
        store_planes(caches, planes, L)
        self.verify_steps += 1
        return targets, accepted

    def _within(self, B: int, caches: list, L: int) -> bool:
        """B rows writing L columns fit the `max_batch` and `max_kv` limits."""
        if self.max_batch is not None and B > self.max_batch:
            return False
        return self.max_kv is None or not caches or B * bucket(caches[0].idx + L) <= self.max_kv

    def eligible(self, inputs: StepInputs) -> bool:
        caches = inputs.caches
        if not (inputs.tokens.ndim == 2 and inputs.tokens.shape[1] == 1 and layer_formats(caches) is not None):
            return False
        if not self._within(inputs.tokens.shape[0], caches, 1):
            return False
        return self.gate is None or self.gate.current(inputs.tokens.shape[0], self.gate.arm_names) == "compiled"

    def forward(self, inputs: StepInputs) -> StepContext:
        if not self.eligible(inputs):
            self.fallback_steps += 1
            return self.step.forward(inputs)
        caches = inputs.caches
        first = caches[0]
        fit_capacity(caches, first.idx + 1)
        idx = mx.array(first.idx, dtype=mx.int32)
        left_pad = first.left_pad_array()  # on the device already: no page migration a step
        formats = layer_formats(caches)
        if any(formats):
            fn = self._compiled(self._fns, formats, self._traced)
            vals, planes = fn(inputs.tokens, idx, left_pad, cache_planes(caches))
        else:
            vals, keys, values = self._fn(inputs.tokens, idx, left_pad, [c.keys for c in caches],
                                          [c.values for c in caches])
            planes = list(zip(keys, values))
        store_planes(caches, planes, 1)
        ctx = StepContext(self.step.binding, inputs)
        ctx.values.update(vals)
        for key in [k for k in vals if is_model_dtype_key(k)]:
            ctx.values[key[0]] = vals[key].astype(mx.float32)  # lazy: computed only if read (_traced)
        self.compiled_steps += 1
        return ctx

    def applied(self) -> dict:
        """What this step built and switched on, as the plan chose it (Engine.describe shows it):
        the fused blocks' count and the memory their weights hold are known only once built."""
        return {"fused_layers": len(self.fused), "fused": self.fused.note,
                "attention_kernel": (f"on ({decode_attention.grouped_note()})" if self.kernel
                                     else f"off ({self.kernel_note})"),
                "kv_write_kernel": "on (in the attention kernel)" if self.write else self.write_note,
                "residual_matmul": "on (mx.addmm)" if self.residual else self.residual_note,
                "skinny_matmul": "on" if self.skinny else f"off ({self.skinny_note})",
                "kv": quantized_note(self.binding.policies)}

    def head(self, ctx: StepContext, extra_edits=None):
        return self.step.head(ctx, extra_edits)

    def __call__(self, inputs: StepInputs):
        return self.head(self.forward(inputs))
