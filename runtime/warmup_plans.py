"""Warm-up of the prompt-chunk attention shapes on CUDA (part of `Engine.warm_up()`).

MLX's CUDA attention builds a cuDNN plan per exact (query length, key length, strides) the first
time it meets one, ~40 ms on an H200, and keeps them (MLX_CUDA_SDPA_CACHE_SIZE). The scheduler
makes a prompt's chunks come from a small set of shapes: each chunk starts and (but for a
prompt's last) ends on a multiple of Scheduler.CHUNK_ALIGN, the last is padded to one where
`pad_final_chunk` is on, and a batch-of-one cache's capacity follows from its length
(runtime/cache/full.py capacity_for). So the query lengths are multiples of 128 up to a step's
budget and the key lengths multiples of 128: a fresh server met them one by one under its
first traffic, and the steps that built one were the longest of a serving run
(docs/scheduling.md). Here each shape is built once before the server says ready: a chunk of q
tokens over a cache already holding o zero positions, for q = 128, 256, .. up to the budget a
step may spend while rows decode (that one first, at every offset) and o = 0, 128, ..,
WARM_CONTEXT - q, within WARM_SECONDS.

Only where every layer keeps plain FullKV rows (the shapes of sliding windows and recurrent
state differ); nothing here touches the prefix cache, the scheduler or the engine's counters:
the chunks run on throwaway caches through the compiled prefill step, as the runner runs them.
"""

from __future__ import annotations

import logging
import time

import mlx.core as mx

from graphc.compiler.lower import StepInputs

from .cache.full import FullKV
from .scheduler import Scheduler

log = logging.getLogger("graphc.server")

WARM_CONTEXT = 4096  # key lengths warmed: beyond it shapes are built as clients meet them
WARM_SECONDS = 20.0  # at most this long; the shapes left are built as clients meet them


def chunk_shapes(budget: int, prefill_chunk: int, context: int, align: int = Scheduler.CHUNK_ALIGN) -> list:
    """(query length, offset) pairs to warm, most frequent first: the decode-time budget's chunks
    at every offset, then the other aligned lengths (prompts' last chunks, what a step's budget
    leaves for a second prompt, idle steps up to one prefill chunk)."""
    top = min(prefill_chunk, context)
    first = min(max(align, budget - budget % align), top)
    qs = [first] + [q for q in range(align, top + 1, align) if q != first]
    return [(q, o) for q in qs for o in range(0, context - q + 1, align)]


def attention_plans(engine, *, context: int = WARM_CONTEXT, seconds: float = WARM_SECONDS,
                    force: bool = False) -> tuple[int, int]:
    """Run one prompt chunk of each shape of `chunk_shapes` on throwaway caches (on a GPU, or with
    `force`); (shapes run, shapes listed). Stops after `seconds`."""
    if not force and mx.default_device().type != mx.DeviceType.gpu:
        return 0, 0
    runner, sched = engine.runner, engine.scheduler
    fresh = runner.new_caches()
    if not fresh or any(type(c) is not FullKV for c in fresh):
        return 0, 0
    limit = int(engine.config.get("max_position_embeddings") or context)
    context = min(context, limit)
    budget = sched.step_tokens if isinstance(sched.step_tokens, int) else sched.step_tokens_floor
    shapes = chunk_shapes(budget, sched.prefill_chunk, context)
    step, t0, done = engine.compiled.prefill, time.perf_counter(), 0
    ref = None  # per layer (heads, head dim, dtype) of each plane, from the first chunk's caches
    for q, o in shapes:
        if done and time.perf_counter() - t0 > seconds:
            break
        if ref is None or o == 0:
            caches = runner.new_caches()
        else:
            caches = [FullKV.restored(tuple(mx.zeros((h, o, d), dtype=t) for h, d, t in planes)) for planes in ref]
        tokens = mx.zeros((1, q), dtype=mx.int32)
        ctx = step.forward(StepInputs(tokens, caches, final=False))
        mx.eval(step.fill_targets(ctx))
        if ref is None:
            ref = [[(x.shape[1], x.shape[3], x.dtype) for x in (c.keys, c.values)] for c in caches]
        done += 1
    log.info("warm-up: %d of %d prompt-chunk attention shapes (up to %d tokens of context) in %.1f s",
             done, len(shapes), context, time.perf_counter() - t0)
    return done, len(shapes)
