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

Batched prefills (several whole prompts in one left-padded forward) have shapes of their own,
(rows, aligned width) with an array mask: `batched_plans` builds those within BATCHED_SECONDS,
the ones a step's budget holds while rows decode first.

What the time caps leave is not dropped: each shape left over goes on the engine's idle queue
(`Engine.warm_idle`), which the engine thread runs one shape at a time while no request is in
the engine (runtime/async_engine.py), so a server that idles after it starts builds the rest
before clients meet them. It starts only after the engine has been idle for
AsyncEngine.IDLE_WARM_AFTER_S (0.5 s), so a client that sends its next request as soon as an answer
ends finds the engine free; a request that arrives during a shape waits for that one shape at most.

A conversation's next turn meets a shape no warm-up listed once its context passes
WARM_CONTEXT: its prompt is admitted on a hit as long as the previous turn (cut to a multiple of
the alignment), and its new text runs as one chunk of some aligned length from there, a new
(query length, key length) pair each turn (~50-70 ms of plan on an H100 against a warm 32k turn's
~110 ms: docs/agent-replay.md#32k-tokens). With `warm_continuations` (opt-in: `graphc serve
--warm-continuations`), when a request ends `ContinuationWarmUp` puts the shapes its continuation
would meet (`continuation_shapes`) at the front of the idle queue: the engine builds them in the
pause before the next turn (an agent's tool call, a user's reading), the shortest new texts
first. Each is built by the first layer alone (every layer meets the same attention shape), so
a request that arrives during one waits for about one plan build, not a forward over the whole
stack. Nothing is built while requests run, and a shape already listed is not listed again.

Only where every layer keeps plain FullKV rows (the shapes of sliding windows and recurrent
state differ); nothing here touches the prefix cache, the scheduler or the engine's counters:
the chunks run on throwaway caches through the compiled prefill step, as the runner runs them.
"""

from __future__ import annotations

import collections
import functools
import logging
import time

import mlx.core as mx

from graphc.compiler.lower import StepInputs

from .cache.full import FullKV
from .scheduler import Scheduler

log = logging.getLogger("graphc.server")

WARM_CONTEXT = 4096  # key lengths warmed: beyond it shapes are built as clients meet them
WARM_SECONDS = 20.0  # at most this long; the shapes left are built as clients meet them
BATCHED_SECONDS = 10.0  # the batched prefills' shapes (batched_plans), after those
CONTINUATION_OFFSETS = 2  # hits tried per ended request: the aligned end, and one alignment short
CONTINUATION_LISTED = 1024  # shapes remembered as listed: under MLX_CUDA_SDPA_CACHE_SIZE (contracts/mlx_env.py)
# The idle queue's length at most, the oldest (least likely) dropped: a server that never idles
# would otherwise queue shapes for every request it serves.
CONTINUATION_QUEUED = 1024
# A batched group's padded width times its rows may pass the step's budget: the budget counts
# real tokens, and a group pads up to a third of its work (runtime/prefill_groups.py).
BATCHED_SLACK = 1.5


def chunk_shapes(budget: int, prefill_chunk: int, context: int, align: int = Scheduler.CHUNK_ALIGN) -> list:
    """(query length, offset) pairs to warm, most frequent first: the decode-time budget's chunks
    at every offset, then the other aligned lengths (prompts' last chunks, what a step's budget
    leaves for a second prompt, idle steps up to one prefill chunk)."""
    top = min(prefill_chunk, context)
    first = min(max(align, budget - budget % align), top)
    qs = [first] + [q for q in range(align, top + 1, align) if q != first]
    return [(q, o) for q in qs for o in range(0, context - q + 1, align)]


def continuation_shapes(length: int, prefill_chunk: int, limit: int, align: int = Scheduler.CHUNK_ALIGN,
                        offsets: int = CONTINUATION_OFFSETS) -> list:
    """(query length, offset) pairs the next turn of a conversation whose request ended at `length`
    tokens (prompt + output) would meet: the prefix cache holds all but the last token, so the next
    prompt is admitted on a hit cut to the alignment at that end, or a block short where the chat
    template renders the answer's end differently; its new text then runs from there as a chunk of
    align, 2 * align, .. prefill_chunk tokens (shortest first: a tool result or a user's message
    is more often short). Key lengths past `limit` (the model's context) are left out."""
    if align <= 1:
        return []  # hits not cut to an alignment: the offset is not known in advance
    end = (length - 1) - (length - 1) % align
    return [(q, o) for o in range(end, max(end - offsets * align, 0), -align)
            for q in range(align, prefill_chunk + 1, align) if o + q <= limit]


class ContinuationWarmUp:
    """Lists the shapes of a conversation's next turn on the engine's idle queue when a request
    ends (`Engine` calls `ended`; see the module docstring). `run(q, o)` builds one shape; `listed`
    the shapes listed so far (the warm-up's own too), oldest first, at most CONTINUATION_LISTED."""

    def __init__(self, engine, run, listed, limit: int):
        self.engine, self.run, self.limit = engine, run, limit
        self.listed: collections.OrderedDict = collections.OrderedDict.fromkeys(listed)

    def ended(self, req) -> None:
        """After `req` ended: its continuation's shapes not listed before go to the idle queue's
        front, the shortest new text at the most likely hit first. Not for a failed request."""
        if req.finish_reason not in ("stop", "length"):
            return
        sched = self.engine.scheduler
        new = [s for s in continuation_shapes(req.num_tokens, sched.prefill_chunk, self.limit, sched.hit_align)
               if s not in self.listed]
        for s in new:
            self.listed[s] = None
        while len(self.listed) > CONTINUATION_LISTED:  # forget the oldest: MLX's plan cache may have too
            self.listed.popitem(last=False)
        queue = self.engine.idle_warm
        queue.extendleft(functools.partial(self.run, *s) for s in reversed(new))
        while len(queue) > CONTINUATION_QUEUED:
            queue.pop()


def attention_plans(engine, *, context: int = WARM_CONTEXT, seconds: float = WARM_SECONDS,
                    force: bool = False) -> tuple[int, int]:
    """Run one prompt chunk of each shape of `chunk_shapes` on throwaway caches (on a GPU, or with
    `force`); (shapes run, shapes listed). Stops after `seconds`; the rest go on `engine.idle_warm`.
    With `warm_continuations` on, where the prefix cache cuts hits to the alignment, it also sets
    `engine.continuation`, which lists the next turn's shapes when a request ends
    (`ContinuationWarmUp`)."""
    engine.continuation = None
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
    step = engine.compiled.prefill
    ref = []  # per layer (heads, head dim, dtype) of each plane, from the first chunk's caches

    def run(q: int, o: int) -> None:
        if not ref or o == 0:
            caches = runner.new_caches()
        else:
            caches = [FullKV.restored(tuple(mx.zeros((h, o, d), dtype=t) for h, d, t in planes)) for planes in ref]
        tokens = mx.zeros((1, q), dtype=mx.int32)
        ctx = step.forward(StepInputs(tokens, caches, final=False))
        mx.eval(step.fill_targets(ctx))
        if not ref:
            ref.extend([[(x.shape[1], x.shape[3], x.dtype) for x in (c.keys, c.values)] for c in caches])

    done, took = _run_capped(engine, run, shapes, seconds)
    log.info("warm-up: %d of %d prompt-chunk attention shapes (up to %d tokens of context) in %.1f s%s",
             done, len(shapes), context, took, _left_note(len(shapes) - done))
    if engine.engine_config.warm_continuations and engine.prefix is not None and sched.hit_align > 1:
        one = _one_layer(engine, ref) if done else None
        engine.continuation = ContinuationWarmUp(engine, one or run, shapes, limit)
    return done, len(shapes)


def _one_layer(engine, ref: list):
    """`run(q, o)` for a chunk of q tokens over o cached positions through the first layer only, as
    the prefill's layer loop runs it (compiler/ops/forward.py: the model's own layer, the cache's
    mask): the attention call of every layer has the same shapes and layouts where every layer's
    cache planes do (`ref`, from a chunk the warm-up ran). None where they differ."""
    if not ref or any(planes != ref[0] for planes in ref):
        return None
    layer, planes = engine.compiled.prefill.binding.adapter.layers[0], ref[0]

    def run(q: int, o: int) -> None:
        cache = FullKV.restored(tuple(mx.zeros((h, o, d), dtype=t) for h, d, t in planes))
        h = engine.compiled.prefill.binding.adapter.embed(mx.zeros((1, q), dtype=mx.int32))
        mx.eval(layer(h, cache.make_mask(q), cache), cache.keys, cache.values)
    return run


def _run_capped(engine, run, shapes: list, seconds: float) -> tuple[int, float]:
    """run(*shape) for each shape until `seconds` have passed (at least one); the rest go on the
    engine's idle queue. (shapes run now, seconds taken)."""
    t0, done = time.perf_counter(), 0
    for shape in shapes:
        if done and time.perf_counter() - t0 > seconds:
            break
        run(*shape)
        done += 1
    engine.idle_warm.extend(functools.partial(run, *shape) for shape in shapes[done:])
    return done, time.perf_counter() - t0


def _left_note(left: int) -> str:
    return f"; {left} more while the server is idle" if left else ""


def batched_shapes(budget: int, burst_step: int, prefill_chunk: int, max_batch: int,
                   align: int = Scheduler.CHUNK_ALIGN) -> list:
    """(rows, width) pairs to warm for batched prefills of whole prompts (every row left-padded
    to an aligned width, so the query and key lengths are both `width`), those that fit a step's
    budget while rows decode first (they stall running streams), then those of a burst's steps."""
    def pairs(tokens: int) -> list:
        top = int(tokens * BATCHED_SLACK)
        return [(b, w) for w in range(align, prefill_chunk + 1, align) for b in range(2, max_batch + 1)
                if b * w <= top]

    first = pairs(budget)
    seen = set(first)
    return first + [x for x in pairs(max(budget, burst_step)) if x not in seen]


def batched_plans(engine, *, seconds: float = BATCHED_SECONDS, force: bool = False) -> tuple[int, int]:
    """Run one batched prefill forward of each shape of `batched_shapes` on throwaway caches, as
    runtime/batched_prefill.py builds them (left padding, so the mask is an array as there, and
    the final chunk whole or split as the plan says); (shapes run, shapes listed). On a GPU (or
    with `force`), where prompts are batched at all; stops after `seconds`. Batched prefills at
    the door were steps of 53-167 ms (a run's median) against ~20 ms for a one-prompt chunk
    (docs/scheduling.md): the chunk warm-up above builds one-row shapes only."""
    if not force and mx.default_device().type != mx.DeviceType.gpu:
        return 0, 0
    runner, sched = engine.runner, engine.scheduler
    if not sched.batch_prefill:
        return 0, 0
    budget = sched.step_tokens if isinstance(sched.step_tokens, int) else sched.step_tokens_floor
    shapes = batched_shapes(budget, sched.BURST_STEP_TOKENS, sched.prefill_chunk, sched.max_batch)
    step, policies = runner.batched.step, runner.batched.policies
    whole = runner.final_chunk.whole or not runner.final_chunk.align

    def run(b: int, w: int) -> None:
        pads = [1] + [0] * (b - 1)  # one row shorter: left padding, as nearly every real group has
        caches = [type(p.new_cache())(b, pads) for p in policies]
        # split pads the columns before the last to the alignment: a group is w + 1 wide there
        tokens = mx.zeros((b, w if whole else w + 1), dtype=mx.int32)
        if not whole:  # split: the aligned part, then the last column alone (runtime/batched_prefill.py)
            step.forward(StepInputs(tokens[:, :-1], caches, final=False))
            tokens = tokens[:, -1:]
        ctx = step.forward(StepInputs(tokens, caches, final=False))
        mx.eval(step.fill_targets(ctx))

    done, took = _run_capped(engine, run, shapes, seconds)
    log.info("warm-up: %d of %d batched-prefill shapes in %.1f s%s", done, len(shapes), took,
             _left_note(len(shapes) - done))
    return done, len(shapes)
