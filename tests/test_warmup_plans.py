"""The warm-up of prompt-chunk attention shapes (runtime/warmup_plans.py): which shapes, and that
running them leaves the engine as it was (no prefix entries, no counters, same greedy tokens)."""

from __future__ import annotations

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.scheduler import Scheduler
from graphc.runtime.warmup_plans import attention_plans, chunk_shapes
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


def test_the_time_limit_stops_it(model_dir):
    eng = Engine.load(model_dir("llama"))
    done, listed = attention_plans(eng, context=512, seconds=0.0, force=True)
    assert done == 1 < listed  # the first shape runs, then the clock says stop
