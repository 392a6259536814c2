"""The `paged` cache policy (runtime/cache/paged.py, graphs/dense_paged.yaml): rows in 16-token pages
of a per-layer pool. Greedy tokens equal mlx-lm's own decode — chunked, batched, rows joining and
leaving, prefix hits, chained, preempted under a KV budget, speculative rollback — on the fast
path (graphc's llama block, attention over each row's own pages) and the generic one (the model's
forward on gathered rows); the batch holds its rows' tokens rounded up to a page, and every page
goes back to the pool."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.page_pool import PagePool
from graphc.runtime.cache.paged import PagedKV, length_groups
from graphc.runtime.request import Status
from helpers import assert_chained_equals_unchained, assert_greedy_matches_mlx_lm, random_prompts

GRAPH = "dense_paged"


def _held(eng) -> int:
    """Pages some row holds, over every layer's pool (0 when nothing is alive)."""
    return sum(int((p.pool.refs[1:] > 0).sum()) for p in eng.compiled.binding.policies)


@pytest.fixture
def mdir(model_dir):
    return model_dir("llama")


def test_the_pool_hands_out_counts_and_takes_back_pages():
    pool = PagePool(4)
    a = pool.alloc(3)
    assert 0 not in a and len(set(a)) == 3 and pool.grows == 1  # page 0 is the zero page
    pool.retain(a[:1])
    pool.release(a)
    assert a[0] not in pool.free and set(a[1:]) <= set(pool.free)  # a shared page stays out
    pool.release(a[:1])
    assert a[0] in pool.free
    big = pool.alloc(pool.pages)  # more than it has: it grows
    assert len(set(big)) == len(big) and pool.grows == 2


def test_a_growing_pool_overshoots_by_at_most_an_eighth():
    # KV per live token is the pool's pages over the pages held: growth steps bound the slack
    pool = PagePool(16)
    held = []
    for _ in range(1000):  # one page at a time, as decode rows fill theirs
        held += pool.alloc(1)
        assert pool.pages - 1 <= len(held) + max(64, (len(held) + 1) / 8 + 1), (len(held), pool.pages)
    assert pool.grows < 30  # yet few copies of the pool


def test_rows_of_similar_length_attend_together():
    assert length_groups([4384] + [288] * 15) == [list(range(1, 16)), [0]]
    assert length_groups([12, 4, 8]) == [[0, 1, 2]]  # one group: the batch in its own order
    groups = length_groups(list(range(1, 65)))
    assert len(groups) == 4 and sorted(r for g in groups for r in g) == list(range(64))


@pytest.mark.parametrize("lowering", ["auto", "generic"])
def test_paged_rows_decode_exactly(mdir, lowering):
    """Prompts of many lengths, chunked at 16 tokens, rows ending at different steps (leaving) while
    others wait to join (max_batch 3): mlx-lm's tokens, on graphc's llama block and on the model's
    own forward; the batch held its tokens within a page a row; no page is held after."""
    eng = Engine.load(mdir, graph=GRAPH, prefill_chunk=16, max_batch=3, lowering=lowering)
    assert eng.compiled.binding.lowering == ("fast" if lowering == "auto" else "generic")
    prompts = random_prompts(7, eng.vocab_size, [5, 70, 17, 3, 41, 9, 100], seed=21)
    news = [14, 6, 20, 9, 12, 25, 7]
    ids = [eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompts, news)]
    reqs = [eng.request(i) for i in ids]
    checked = 0
    while eng.has_unfinished():
        eng.step()
        for c in eng.runner.caches or []:
            # what the rows hold: their positions, and at most a page less one position each more
            assert 0 <= c.nbytes - c.live_bytes() <= c.batch * 15 * c.pool.bytes_per_slot
            assert c.live_bytes() == sum(c.lengths) * c.pool.bytes_per_slot
            checked += 1
        c = None  # (a batch's caches give their pages back once nobody holds them)
    assert checked
    assert_greedy_matches_mlx_lm(eng.model, prompts, [eng.result(r) for r in reqs], news)
    gc.collect()
    assert _held(eng) == 0


def test_prefix_hits_and_the_chain_are_exact(mdir):
    eng = Engine.load(mdir, graph=GRAPH, prefill_chunk=32)
    prompts = random_prompts(4, eng.vocab_size, [40, 23, 57, 31], seed=3)
    firsts = eng.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    follows = [p + f.token_ids + [7, 8] for p, f in zip(prompts, firsts)]
    seconds = eng.generate(follows, SamplingParams(max_tokens=10, ignore_eos=True))
    assert all(s.cached_tokens >= len(p) for s, p in zip(seconds, prompts))  # restored from the prefix pool
    assert_greedy_matches_mlx_lm(eng.model, follows, seconds, 10)
    assert_chained_equals_unchained(mdir, prompts, [12, 5, 9, 16], graph=GRAPH)
    gc.collect()
    assert _held(eng) == 0


def test_preemption_and_aborts_give_every_page_back(mdir):
    """A KV budget small enough to preempt (a row leaves as a batch of one and is recomputed through
    the prefix cache), aborts while waiting, prefilling and running: the survivors' tokens are
    mlx-lm's, and no page stays held."""
    prompts = random_prompts(8, 1024, [5, 40, 17, 33, 9, 60, 25, 12], seed=13)
    eng = Engine.load(mdir, graph=GRAPH, prefill_chunk=16, kv_budget_tokens=110, max_total_tokens=512)
    ids = [eng.add_request(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
    reqs = {i: eng.request(i) for i in ids}
    victims = {ids[7]: Status.WAITING, ids[5]: Status.PREFILLING, ids[1]: Status.RUNNING}
    aborted, steps = set(), 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        for rid, stage in victims.items():
            req = eng.scheduler.by_id.get(rid)
            if rid not in aborted and req is not None and req.status is stage and (
                    stage is not Status.PREFILLING or req.prefilled > 0):
                assert eng.abort(rid)
                aborted.add(rid)
        assert steps < 2000
    assert eng.stats["preemptions"] > 0 and aborted == set(victims)
    kept = [i for i in ids if i not in aborted]
    assert_greedy_matches_mlx_lm(eng.model, [prompts[ids.index(i)] for i in kept],
                                 [eng.result(reqs[i]) for i in kept], 24)
    gc.collect()
    assert _held(eng) == 0


def test_speculative_rollback_is_exact(mdir):
    """Prompt-lookup drafts verified on paged rows: rejected positions trimmed (pages past a row's
    new end go back), the output equals plain decoding."""
    base = random_prompts(1, 1024, [24], seed=5)[0]
    prompts = [base * 3, base[:10] * 4]
    spec = SamplingParams(max_tokens=40, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
    eng = Engine.load(mdir, graph=GRAPH)
    got = eng.generate(prompts, spec)
    assert eng.stats["spec_steps"] > 0
    assert_greedy_matches_mlx_lm(eng.model, prompts, got, 40)


def test_a_non_llama_model_runs_on_gathered_rows(model_dir):
    """qwen3's blocks are not mlx-lm's llama block: they run as the model's own layers on the rows
    gathered from their pages (`update_and_fetch`), still exact."""
    d = model_dir("qwen3")
    eng = Engine.load(d, graph=GRAPH, prefill_chunk=16)
    prompts = random_prompts(3, eng.vocab_size, [30, 7, 52], seed=2)
    got = eng.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in (9, 15, 4)])
    assert_greedy_matches_mlx_lm(eng.model, prompts, got, [9, 15, 4])


def test_the_cache_alone_joins_trims_and_extracts():
    import mlx.core as mx

    pool = PagePool(4)
    a, b = PagedKV(pool), PagedKV(pool)
    rng = np.random.default_rng(0)
    kv = lambda n: (mx.array(rng.standard_normal((1, 2, n, 8), dtype=np.float32)),) * 2  # noqa: E731
    a.update_and_fetch(*kv(6))
    b.update_and_fetch(*kv(9))
    a.extend(b)
    assert a.lengths == [6, 9] and b.pages == [] and a.nbytes == (2 + 3) * 4 * pool.bytes_per_slot
    keys, _ = a.state
    assert keys.shape == (2, 2, 9, 8)
    one = a.extract(1)
    a.filter([0])  # row 1's pages stay held by the extracted copy
    assert one.lengths == [9] and all(pool.refs[p] == 1 for p in one.pages[0])
    one.trim_rows([6])  # 3 positions left: one page, two go back
    assert one.lengths == [3] and len(one.pages[0]) == 1
    del one, a
    gc.collect()
    assert int((pool.refs[1:] > 0).sum()) == 0


def test_the_plan_says_paged_rows_decode_eagerly_with_the_kernel_on_cuda(model_dir):
    """Asked to compile, on a CUDA target whose attention kernel matched: the decode plan says
    eager (compiled steps read contiguous rows) and the ragged kernel for paged decode steps."""
    import json
    from pathlib import Path

    import mlx_lm

    from graphc.compiler.compile import compile_graph
    from graphc.compiler.target import Requested, Target

    mdir = model_dir("llama", head_dim=32)  # the kernel takes head dims that are multiples of 32
    model, _ = mlx_lm.load(str(mdir))
    config = json.loads((Path(mdir) / "config.json").read_text())
    cuda = Target(device="cuda", kernels=(("decode_attention", None, "grouped"), ("kv_write", None, "")))
    compiled = compile_graph(GRAPH, model, config, target=cuda, requested=Requested.of({"compile": True}))
    plan = compiled.plan("decode")
    mode, att = plan.choice("compile mode"), plan.choice("attention (eager steps)")
    assert mode.choice == "eager" and "'paged' keeps its rows in pages" in mode.why
    assert att.choice == "cuda decode kernel" and "paged rows" in att.why
    assert "paged rows" in dict(plan.passes)["attention kernel"]
    dense = compile_graph("dense", model, config, target=cuda, requested=Requested.of({"compile": True}))
    assert dense.plan("decode").choice("compile mode").choice == "compiled"  # the same model, contiguous rows


def test_paged_decode_steps_take_the_kernel_left_aligned(model_dir, monkeypatch):
    """Where the plan chose the ragged kernel (here: its check passes and it runs as its reference
    on the CPU), each length group of a paged decode step is gathered left-aligned and attended in
    it, one query per row; greedy tokens stay mlx-lm's, prompts (several queries) keep MLX's path."""
    from graphc.runtime.kernels import decode_attention as da

    calls = []

    def kernel(q, k, v, start, end, scale):
        calls.append((q.shape[0], q.shape[2]))
        return da.reference(q, k, v, start, end, scale)

    monkeypatch.setattr(da, "check", lambda seed=0: None)
    monkeypatch.setattr(da, "ragged_attention", kernel)
    mdir = model_dir("llama", head_dim=32)
    eng = Engine.load(mdir, graph=GRAPH, prefill_chunk=64, max_batch=8)
    assert eng.runner.views.on
    prompts = random_prompts(5, eng.vocab_size, [3, 70, 9, 40, 5], seed=2)  # two or more length groups
    results = eng.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    assert_greedy_matches_mlx_lm(eng.model, prompts, results, 10)
    assert calls and {L for _, L in calls} == {1} and max(b for b, _ in calls) < 5  # groups, not the batch
