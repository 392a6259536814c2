"""The device's facts for the compiler's choice passes (compiler/target.py `Target`), probed once.

Each kernel's `check()` (runtime/kernels/) builds it and compares it with its reference in
this process, once, unless a record of this device and code holds their answers
(runtime/kernels/verdicts.py): then a restart builds only the kernels it uses, when it uses
them. Off CUDA every check answers "not a CUDA device" without building anything. The Engine
probes before it compiles, so the plan's choices are made from these facts and the runtime only
obeys them; `graphc inspect` probes the same way.
"""

from __future__ import annotations

import logging
import time

import mlx.core as mx

from graphc.compiler.target import Requested, Target
from graphc.contracts import cpu_blas

from . import compiled_decode_kv, kernels
from .cpu_lanes import cpu_lanes
from .config import EngineConfig
from .kernels import (decode_attention, gumbel_choose, quantized_attention, quantized_write, skinny_matmul, top_ranks,
                      verdicts)
from .speculative import speculator

log = logging.getLogger("graphc.load")
_checked_here = False
_blas_told = False


def probe_target(quantized: bool = False) -> Target:
    """This process's device and which kernels built and matched MLX here; the quantized attention
    and quantized KV write kernels' checks only where `quantized` KV is asked for (kv_bits, or a
    graph's `quantized` policy): their builds are a few dozen NVRTC compiles that no other engine needs."""
    global _checked_here
    cuda = kernels.available()
    stored = cuda and (_checked_here or verdicts.restore())
    if cuda and not stored:
        log.info("checking the CUDA kernels against MLX (first start on this device and code: a few minutes "
                 "on an H200; the verdicts are stored, so a restart skips this)")
        t0 = time.perf_counter()
    # each check's time in the log while they run for real: minutes of NVRTC builds, not silence
    timed = _timed if cuda and not stored else (lambda name, fn: fn())
    facts = []
    why = timed("decode attention", decode_attention.check)
    facts.append(("decode_attention", why, decode_attention.grouped_note() if why is None else ""))
    facts.append(("kv_write", timed("KV write", decode_attention.write_check) if why is None else
                   f"the attention kernel is off ({why})", ""))
    facts.append(("skinny_matmul", timed("skinny matmul", skinny_matmul.check), ""))
    if quantized:
        qa = timed("quantized attention", quantized_attention.check)
        facts.append(("quantized_attention", qa, f"{quantized_attention.KERNEL.note()}" if qa is None else ""))
        facts.append(("quantized_write", timed("quantized KV write", quantized_write.check) if qa is None else
                      f"the quantized attention kernel is off ({qa})", ""))
    tr = timed("top ranks", top_ranks.check)
    facts.append(("top_ranks", tr, top_ranks.note()))
    facts.append(("gumbel_choose", None if tr is None else tr, gumbel_choose.note() if tr is None else ""))
    if cuda and not stored:
        verdicts.store()
        _checked_here = True  # the checks answer from memory in this process from now on
        log.info("CUDA kernel checks done in %.1f s", time.perf_counter() - t0)
    device = "cuda" if cuda else ("gpu" if mx.default_device().type == mx.gpu else "cpu")
    global _blas_told
    if device == "cpu" and not _blas_told:  # float32 matmuls: ~20x apart (contracts/cpu_blas.py)
        log.info("CPU BLAS: %s", cpu_blas.NOTE)
        _blas_told = True
    ranks = mx.distributed.init().size() if mx.distributed.is_available() else 1
    lanes = cpu_lanes() if device == "cpu" and ranks == 1 else None  # (measured only where it can serve)
    return Target(device=device, kernels=tuple(facts), cuda_memory=bool(mx.cuda.is_available()),
                  cuda_adds=compiled_decode_kv.on_cuda(), cpu_lanes=(lanes.count, lanes.why) if lanes else (1, ""),
                  ranks=ranks)


def _timed(name: str, check):
    """Run one kernel check, logging what it answered and how long it took."""
    t0 = time.perf_counter()
    why = check()
    log.info("  %s kernel: %s (%.1f s)", name, "matches MLX" if why is None else f"off: {why}",
             time.perf_counter() - t0)
    return why


def requested_of(c: EngineConfig) -> Requested:
    """What `c` asks of the compiler's choice passes: decode overrides over the graph's `decode:`
    section, the speculative defaults (None fields resolved by the speculator's defaults:
    pipelined verify opt-in, the measured gate on), and how a prompt's final chunk runs."""
    spec = c.speculative
    method = (spec if isinstance(spec, str) or spec is None else
              spec.get("method") if isinstance(spec, dict) else getattr(spec, "method", str(spec)))
    if method is None and c.draft_model is not None:
        method = "draft_model"
    return Requested.of(
        {**(c.decode_options or {}), "compile": c.compile, "skinny_matmul": c.skinny_gemm}, speculative=method,
        spec_pipeline=speculator.default_pipeline() if c.spec_pipeline is None else bool(c.spec_pipeline),
        spec_adaptive=speculator.default_adaptive() if c.spec_adaptive is None else bool(c.spec_adaptive),
        final_chunk=c.final_chunk, pad_final_chunk=c.pad_final_chunk, prefill_lanes=c.prefill_lanes,
        linear_prefill=c.linear_prefill)


__all__ = ["probe_target", "requested_of"]
