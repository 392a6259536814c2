"""The warm-up of prompt-chunk attention shapes (runtime/warmup_plans.py): which shapes, and that
running them leaves the engine as it was (no prefix entries, no counters, same greedy tokens)."""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.scheduler import Scheduler
from graphc.runtime.warmup_plans import (CONTINUATION_LISTED, CONTINUATION_QUEUED, attention_plans, batched_plans, batched_shapes,
                                         chunk_shapes, continuation_shapes)
from helpers import random_prompts


def test_shapes_are_aligned_and_the_budget_comes_first():
    shapes = chunk_shapes(budget=1024, prefill_chunk=2048, context=4096)
    a = Scheduler.CHUNK_ALIGN
    assert shapes[0] == (1024, 0)
    assert [o for q, o in shapes if q == 1024] == list(range(0, 4096 - 1024 + 1, a))  # every offset first
    assert all(q % a == 0 and o % a == 0 and q + o <= 4096 and q <= 2048 for q, o in shapes)
    assert {q for q, _ in shapes} == set(range(a, 2048 + 1, a))
    assert len(shapes) == len(set(shapes))
    # an unaligned budget rounds down; a budget past the chunk is the chunk
    assert chunk_shapes(300, 2048, 1024)[0] == (256, 0)
    assert chunk_shapes(4096, 512, 1024)[0] == (512, 0)


def test_off_the_gpu_nothing_runs_unless_forced(model_dir):
    eng = Engine.load(model_dir("llama"))
    assert attention_plans(eng) == (0, 0)  # the CPU: no cuDNN plans to build


def test_running_the_shapes_changes_nothing(model_dir):
    eng = Engine.load(model_dir("llama"))
    prompts = random_prompts(3, int(eng.vocab_size), [200, 90, 333], seed=5)
    p = SamplingParams(max_tokens=6, temperature=0.0)
    ref = [o.token_ids for o in Engine.load(model_dir("llama")).generate(prompts, p)]
    stats, cache = dict(eng.stats), eng.cache_stats()
    done, listed = attention_plans(eng, context=512, force=True)
    assert done == listed == len(chunk_shapes(eng.scheduler.step_tokens_floor, eng.scheduler.prefill_chunk, 512))
    assert eng.stats == stats and not eng.has_unfinished()
    assert eng.cache_stats() == cache  # no prefix entries, no pool writes
    assert [o.token_ids for o in eng.generate(prompts, p)] == ref


def test_the_time_limit_stops_it_and_the_rest_is_built_when_idle(model_dir):
    eng = Engine.load(model_dir("llama"))
    prompts = random_prompts(2, int(eng.vocab_size), [200, 90], seed=6)
    p = SamplingParams(max_tokens=6, temperature=0.0)
    ref = [o.token_ids for o in Engine.load(model_dir("llama")).generate(prompts, p)]
    done, listed = attention_plans(eng, context=512, seconds=0.0, force=True)
    assert done == 1 < listed  # the first shape runs, then the clock says stop
    assert len(eng.idle_warm) == listed - 1  # the rest wait for idle time
    stats = dict(eng.stats)
    eng.add_request(prompts[0], p)
    assert eng.warm_idle(seconds=60) == 0  # never while a request is in the engine
    while eng.has_unfinished():
        eng.step()
    eng.stats.clear()
    eng.stats.update(stats)
    assert eng.warm_idle() == 1  # at least one, then the clock
    assert eng.warm_idle(seconds=60) == listed - 2 and not eng.idle_warm
    assert eng.stats == stats and [o.token_ids for o in eng.generate(prompts, p)] == ref


def test_a_failing_idle_shape_stops_the_idle_warm_up_not_the_engine(model_dir, caplog):
    eng = Engine.load(model_dir("llama"))
    ran = []

    def boom():
        raise RuntimeError("no plan")
    eng.idle_warm.extend([lambda: ran.append(1), boom, lambda: ran.append(2)])
    with caplog.at_level("WARNING", logger="graphc.server"):
        assert eng.warm_idle(seconds=60) == 1
    assert ran == [1] and not eng.idle_warm and "idle warm-up stopped" in caplog.text


def test_batched_shapes_fit_the_budget_first_then_the_burst():
    shapes = batched_shapes(budget=1024, burst_step=8192, prefill_chunk=2048, max_batch=64)
    a = Scheduler.CHUNK_ALIGN
    assert len(shapes) == len(set(shapes))
    assert all(2 <= b <= 64 and w % a == 0 and w <= 2048 and b * w <= 1.5 * 8192 for b, w in shapes)
    first = [x for x in shapes if x[0] * x[1] <= 1.5 * 1024]
    assert shapes[:len(first)] == first and (2, 768) in first and (12, 128) in first
    assert (64, 128) in shapes and (6, 2048) in shapes and (7, 2048) not in shapes
    assert batched_shapes(1024, 8192, 2048, max_batch=1) == []  # one row a batch: nothing to batch


@pytest.mark.parametrize("kw", [{}, {"pad_final_chunk": True, "final_chunk": "split"},
                                {"pad_final_chunk": True, "final_chunk": "whole"}])
def test_batched_shapes_run_on_throwaway_caches(model_dir, kw):
    eng = Engine.load(model_dir("llama"), max_batch=4, prefill_chunk=256, **kw)
    assert batched_plans(eng) == (0, 0)  # the CPU: nothing to build
    prompts = random_prompts(3, int(eng.vocab_size), [200, 90, 33], seed=6)
    p = SamplingParams(max_tokens=6, temperature=0.0)
    fresh = Engine.load(model_dir("llama"), max_batch=4, prefill_chunk=256, **kw)
    ref = [o.token_ids for o in fresh.generate(prompts, p)]
    stats, cache = dict(eng.stats), eng.cache_stats()
    s = eng.scheduler
    listed = batched_shapes(s.step_tokens_floor, s.BURST_STEP_TOKENS, 256, 4)
    assert batched_plans(eng, force=True) == (len(listed), len(listed)) and listed
    assert batched_plans(eng, force=True, seconds=0.0) == (1, len(listed))  # the clock stops it after one
    assert eng.stats == stats and not eng.has_unfinished() and eng.cache_stats() == cache
    assert [o.token_ids for o in eng.generate(prompts, p)] == ref


def test_no_batched_shapes_where_prompts_are_not_batched(model_dir):
    eng = Engine.load(model_dir("llama"), batch_prefill=False)
    assert batched_plans(eng, force=True) == (0, 0)


@pytest.mark.parametrize("final_chunk", ["whole", "split"])
def test_the_warmed_batched_shapes_are_those_a_batched_prefill_runs(model_dir, final_chunk):
    """A real batched prefill of two prompts (padded as on a GPU) runs forwards of some (rows,
    width); the warm-up must have run those same widths (split: an aligned forward, then one column)."""
    eng = Engine.load(model_dir("llama"), max_batch=4, prefill_chunk=256, pad_final_chunk=True,
                      final_chunk=final_chunk, prefill_lanes=1)
    step, seen = eng.runner.batched.step, []
    plain = step.forward

    def record(inputs):
        seen.append(tuple(inputs.tokens.shape))
        return plain(inputs)

    step.forward = record
    try:
        eng.generate(random_prompts(2, int(eng.vocab_size), [90, 33], seed=8), SamplingParams(max_tokens=2))
        real = [x for x in seen if x[0] == 2]
        seen.clear()
        batched_plans(eng, force=True)
    finally:
        step.forward = plain
    assert real == ([(2, 128)] if final_chunk == "whole" else [(2, 128), (2, 1)])
    assert set(real) <= set(seen)


def test_continuation_shapes_start_at_the_aligned_end_shortest_first():
    # 605 tokens ended: 604 cached, a hit cut to 512, or to 384 where the answer's end re-tokenizes
    assert continuation_shapes(605, prefill_chunk=256, limit=4096) == [(128, 512), (256, 512), (128, 384), (256, 384)]
    assert continuation_shapes(605, 512, limit=4096, offsets=1) == [(128, 512), (256, 512), (384, 512), (512, 512)]
    assert continuation_shapes(605, 256, limit=700) == [(128, 512), (128, 384), (256, 384)]  # the model's context
    assert continuation_shapes(200, 256, limit=4096) == [(128, 128), (256, 128)]  # no offset-0 hit
    assert continuation_shapes(100, 256, limit=4096) == []  # shorter than one alignment: no hit to start from
    assert continuation_shapes(605, 256, limit=4096, align=0) == []  # hits not cut: offsets unknown


def _conversation_engine(model_dir, **kw):
    # a GPU's defaults where the CPU's differ: final chunks padded, so hits are cut to 128 tokens
    kw.setdefault("warm_continuations", True)
    return Engine.load(model_dir("llama"), prefill_chunk=256, pad_final_chunk=True, final_chunk="whole", **kw)


def test_next_turn_shapes_are_opt_in(model_dir):
    eng = _conversation_engine(model_dir, warm_continuations=False)
    attention_plans(eng, context=256, force=True)
    assert eng.continuation is None
    eng.generate(random_prompts(1, int(eng.vocab_size), [600], seed=11), SamplingParams(max_tokens=2))
    assert not eng.idle_warm


def test_an_ended_request_lists_its_next_turns_shapes_first_and_they_are_the_ones_it_meets(model_dir):
    eng = _conversation_engine(model_dir)
    assert eng.continuation is None  # only a warm-up of the chunk shapes sets it
    done, listed = attention_plans(eng, context=256, seconds=0.0, force=True)
    assert eng.continuation is not None and len(eng.idle_warm) == listed - done
    p = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    first = random_prompts(1, int(eng.vocab_size), [600], seed=11)[0]
    out = eng.generate([first], p)[0].token_ids
    expected = continuation_shapes(len(first) + len(out), 256, int(eng.config.get("max_position_embeddings") or 4096))
    assert [w.args for w in list(eng.idle_warm)[:len(expected)]] == expected  # ahead of the warm-up's leftovers
    assert len(eng.idle_warm) == listed - done + len(expected)
    assert eng.warm_idle(seconds=60) == listed - done + len(expected) and not eng.idle_warm

    # the next turn: the whole first turn, then new text; record the chunk forwards it runs
    second = first + out + random_prompts(1, int(eng.vocab_size), [100], seed=12)[0]
    step, seen = eng.compiled.prefill, []
    plain = step.forward

    def record(inputs):
        seen.append((int(inputs.tokens.shape[1]), int(inputs.caches[0].idx)))
        return plain(inputs)

    step.forward = record
    try:
        got = eng.generate([second], p)[0].token_ids
    finally:
        step.forward = plain
    assert seen and set(seen) <= set(expected)  # the shape it met was listed
    assert got == _conversation_engine(model_dir).generate([second], p)[0].token_ids  # and nothing changed
    eng.warm_idle(seconds=60)  # its own continuation
    assert not eng.idle_warm
    eng.generate([second], p)  # the same conversation again: its shapes were listed, none queued again
    assert not eng.idle_warm


def test_no_continuation_for_a_failed_request_nor_without_aligned_hits(model_dir):
    eng = _conversation_engine(model_dir)
    attention_plans(eng, context=256, force=True)
    assert not eng.idle_warm
    rid = eng.add_request(random_prompts(1, int(eng.vocab_size), [600], seed=13)[0], SamplingParams(max_tokens=5))
    req = eng.scheduler.by_id[rid]
    eng.fail(req, "a test's failure")
    assert req.finish_reason == "error" and not eng.idle_warm  # no next turn to expect
    plain = Engine.load(model_dir("llama"), prefill_chunk=256)  # the CPU's defaults: hits are not cut
    attention_plans(plain, context=256, force=True)
    assert plain.continuation is None
    no_prefix = _conversation_engine(model_dir, prefix_cache=False)
    attention_plans(no_prefix, context=256, force=True)
    assert no_prefix.continuation is None


def test_the_listed_shapes_are_bounded(model_dir):
    eng = _conversation_engine(model_dir)
    attention_plans(eng, context=256, force=True)
    cont, built = eng.continuation, []
    cont.run = lambda q, o: built.append((q, o))
    cont.limit = 1 << 30  # a long-context model
    for n in range(0, CONTINUATION_LISTED + 64, 2):  # many conversations, each at its own length, never idle
        req = type("Ended", (), {"finish_reason": "stop", "num_tokens": 1 + 128 * (n + 2)})()
        cont.ended(req)
    assert len(cont.listed) == CONTINUATION_LISTED and len(eng.idle_warm) == CONTINUATION_QUEUED
    newest = continuation_shapes(req.num_tokens, eng.scheduler.prefill_chunk, cont.limit)
    assert [w.args for w in list(eng.idle_warm)[:len(newest)]] == newest  # the latest conversation's first
    assert eng.warm_idle(seconds=600) == len(built) == CONTINUATION_QUEUED


def test_a_next_turn_shape_is_built_by_one_layer_with_the_attention_the_real_chunk_calls(model_dir, monkeypatch):
    """The idle build runs the first layer only; its attention call has the (query, key) shapes every
    layer's call has when that chunk runs for real (MLX keys a cuDNN plan on them)."""
    import mlx.core as mx

    eng = _conversation_engine(model_dir)
    attention_plans(eng, context=256, force=True)
    calls, plain = [], mx.fast.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, str(kw.get("mask"))))
        return plain(q, k, v, **kw)

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", spy)
    eng.continuation.run(256, 512)
    assert len(calls) == 1  # one layer
    built = set(calls)
    calls.clear()
    # a real chunk of 256 tokens over 512 cached positions: 560 tokens cached, a hit cut to 512, then
    # 760 - 512 = 248 new tokens padded to 256
    first = random_prompts(1, int(eng.vocab_size), [560], seed=21)[0]
    p = SamplingParams(max_tokens=1, temperature=0.0)
    eng.generate([first], p)
    calls.clear()
    eng.generate([first + random_prompts(1, int(eng.vocab_size), [200], seed=22)[0]], p)
    real = {c for c in calls if c[0][2] > 1}
    assert real and real <= built, (real, built)


@pytest.mark.parametrize("flags, want", [([], False), (["--warm-continuations"], True)])
def test_serve_warm_continuations_flag_reaches_the_engine(model_dir, flags, want):
    import argparse

    from graphc.runtime.server.cli import add_parser, config_from_args
    from graphc.runtime.server.state import load_engine

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    eng = load_engine(config_from_args(parser.parse_args(["serve", "--model", str(model_dir("llama")), *flags])))
    assert eng.engine_config.warm_continuations is want
