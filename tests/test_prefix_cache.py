"""The radix prefix cache on a dense model (graphs/dense.yaml -> pool_backed), and its bookkeeping.

Hits give the same greedy tokens as cold runs and save the prefill of the matched prefix;
pool slots and tree references all come back after requests finish or are aborted at any
point; eviction under a small pool keeps answers exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.pool import device_memory
from graphc.runtime.cache.radix import RadixTree
from graphc.runtime.cache.slots import SlotAllocator
from helpers import random_prompts, reference_greedy

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def dense_dir(model_dir):
    return model_dir("llama")


def shared_prompts(n_shared: int, tails: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, 1000, n_shared).tolist()
    return [shared + rng.integers(3, 1000, k).tolist() for k in tails]


def all_unreferenced(prefix) -> bool:
    return all(n.ref == 0 for n in prefix.tree.nodes() if n is not prefix.tree.root) and not prefix.holds


# -- bookkeeping units ---------------------------------------------------------------
def test_slot_allocator_reserves_padding_slot_and_reuses():
    a = SlotAllocator(5)
    ids = a.alloc(3)
    assert ids.tolist() == [1, 2, 3] and a.free == 2 and a.high_water == 4
    assert a.alloc(3) is None and a.free == 2  # all or nothing
    a.release(ids[:2])
    assert sorted(a.alloc(4).tolist()) == [1, 2, 4, 5]
    with pytest.raises(ValueError):
        a.release([0])


def test_radix_match_split_and_locks():
    t = RadixTree()
    toks = np.array([5, 6, 7, 8, 9], np.int32)
    leaf = t.add_leaf(t.root, toks, np.arange(1, 6, dtype=np.int32))
    path, m = t.match(np.array([5, 6, 7, 1], np.int32))
    assert path == [leaf] and m == 3
    t.lock(leaf)
    mid = t.node_ending_at(toks, 3)  # split: the leaf keeps the deeper part and its lock
    assert (mid.start, mid.end, leaf.start, leaf.end) == (0, 3, 3, 5)
    assert mid.ref == leaf.ref == 1 and mid.slots.tolist() == [1, 2, 3]
    t.unlock(leaf)
    assert mid.ref == leaf.ref == 0 and t.tokens == 5


# -- engine ----------------------------------------------------------------------------
def test_hits_equal_cold_and_report_cached_tokens(dense_dir):
    prompts = shared_prompts(40, [5, 12, 1, 30])
    prompts.append(list(prompts[1]))  # a full-prefix hit
    cold = Engine.load(dense_dir, prefill_chunk=16, graph="dense_noprefix").generate(prompts, GREEDY)
    eng = Engine.load(dense_dir, prefill_chunk=16, max_total_tokens=1024)
    assert eng.compiled.spec.name == "dense" and eng.prefix is not None
    warm = [eng.generate([p], GREEDY)[0] for p in prompts]
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    assert [r.cached_tokens for r in warm] == [0, 40, 40, 40, len(prompts[1]) - 1]
    assert [r.usage["cached_tokens"] for r in warm] == [r.cached_tokens for r in warm]
    s = eng.stats
    assert s["computed_prompt_tokens"] == s["prompt_tokens"] - sum(r.cached_tokens for r in warm)
    stats = eng.cache_stats()
    assert stats["hits"] == 4 and stats["pool_used"] == stats["tree_tokens"] > 0
    eng.prefix.check()


def test_decode_kv_is_stored_when_a_request_ends(dense_dir):
    eng = Engine.load(dense_dir, prefill_chunk=16, max_total_tokens=1024)
    [p] = random_prompts(1, 1024, [20], seed=4)
    [first] = eng.generate([p], GREEDY)
    follow = p + first.token_ids + [7, 8]
    [second] = eng.generate([follow], GREEDY)
    # The whole first turn (prompt and every generated token whose KV exists) was cached.
    assert second.cached_tokens == len(p) + len(first.token_ids)
    assert second.token_ids == reference_greedy(eng.model, follow, 10)


def test_a_batch_that_finishes_together_is_stored_together_and_hits(dense_dir, monkeypatch):
    """Rows leaving in one step go to the pool in one write per layer (PrefixIO._write_rows); each
    one's next turn then hits its whole first turn and stays exact."""
    from graphc.runtime.cache.pool import KVPool

    writes = []
    write = KVPool.write
    monkeypatch.setattr(KVPool, "write", lambda self, layer, slots, planes: (writes.append(len(slots)),
                                                                              write(self, layer, slots, planes))[1])
    eng = Engine.load(dense_dir, prefill_chunk=64, max_total_tokens=2048, prefill_lanes=1)  # one batched forward
    # Turns of 33+ tokens: a burst's shorter hits are declined for a batched prefill (test below).
    prompts = random_prompts(4, 1024, [30, 23, 41, 24], seed=6)
    firsts = eng.generate(prompts, GREEDY)  # same max_tokens: the four rows leave in one step
    layers = len(eng.runner.prefix_io.token_layers)
    # The prompts went in at prefill; on the way out one write per layer holds every row's output.
    assert writes[-layers:] == [sum(len(f.token_ids) for f in firsts)] * layers
    assert writes[:layers] == [sum(map(len, prompts))] * layers  # one batched prefill stores every prompt
    assert len(writes) == 2 * layers  # ... and one store at the end
    follows = [p + f.token_ids + [7, 8] for p, f in zip(prompts, firsts)]
    seconds = eng.generate(follows, GREEDY)
    for p, f, fol, s2 in zip(prompts, firsts, follows, seconds):
        assert s2.cached_tokens == len(p) + len(f.token_ids)
        assert s2.token_ids == reference_greedy(eng.model, fol, 10)
    eng.prefix.check()


def test_rows_given_a_slot_twice_in_one_store_are_written_in_order(dense_dir):
    """If a later row's insert reuses slots an earlier row had just been given (eviction in a full
    pool), the batched write falls back to row-by-row writes, so the later row's KV wins."""
    import numpy as np

    from graphc.runtime.prefix_cache import WritePlan

    import mlx.core as mx

    from graphc.runtime.cache.full import FullKV

    eng = Engine.load(dense_dir, prefill_chunk=64, max_total_tokens=1024)
    io = eng.runner.prefix_io
    eng.generate(random_prompts(1, 1024, [12], seed=9), GREEDY)  # allocates the pool
    _, heads, dim = io.pool.planes[io.token_layers[0]][0].shape
    caches = []
    for n in range(len(eng.model.layers)):  # a two-row batch cache, different KV per row and layer
        c = FullKV(2)
        k = mx.random.normal((2, heads, 6, dim), key=mx.random.key(n))
        c.update_and_fetch(k, -k)
        caches.append(c)
    slots = np.array([5, 6, 7], dtype=np.int32)
    calls = []
    write = io.pool.write
    io.pool.write = lambda layer, s, planes: (calls.append(layer), write(layer, s, planes))[1]
    io._write_rows([(WritePlan(pool=[(slots, 0, 3)]), 0), (WritePlan(pool=[(slots, 3, 6)]), 1)], caches)
    assert len(calls) == 2 * len(io.token_layers)  # row by row, not one batched write
    i = io.token_layers[0]
    got = np.array(io.pool.gather(i, slots)[0])
    np.testing.assert_array_equal(got, np.array(caches[i].positions(1, 3, 6)[0]))


def test_batched_requests_share_prefixes_under_eviction(dense_dir):
    """A pool of 120 slots for prompts of ~50 tokens: eviction runs while rows decode; exact."""
    prompts = shared_prompts(30, [3, 25, 8, 40, 1, 17], seed=2) + random_prompts(3, 1024, [33, 7, 50], seed=8)
    eng = Engine.load(dense_dir, prefill_chunk=16, max_total_tokens=120, max_batch=4)
    results = eng.generate(prompts, GREEDY)
    again = eng.generate(prompts[::-1], GREEDY)[::-1]
    for p, a, b in zip(prompts, results, again):
        ref = reference_greedy(eng.model, p, 10)
        assert a.token_ids == ref and b.token_ids == ref
    st = eng.cache_stats()
    assert st["evicted_tokens"] > 0 and st["pool_used"] <= 120
    eng.prefix.check()
    assert all_unreferenced(eng.prefix)


@pytest.mark.parametrize("arch", ["llama", "gpt_oss", "qwen3_next"])
def test_every_slot_and_reference_returns_after_finish_and_abort(model_dir, arch):
    eng = Engine.load(model_dir(arch), prefill_chunk=8, max_total_tokens=400, max_batch=3)
    prompts = shared_prompts(24, [4, 30, 9, 15, 2, 21], seed=3)
    ids = [eng.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
    eng.abort(ids[5])  # waiting, never scheduled
    eng.step()
    eng.abort(ids[1])  # mid-prefill (30 tokens, chunk 8)
    for _ in range(3):
        eng.step()
    running = [i for i in ids if i in eng.scheduler.by_id and eng.scheduler.by_id[i].status.value == "running"]
    assert running
    eng.abort(running[0])  # in the decode batch
    while eng.has_unfinished():
        eng.step()
    # A hit that was admitted and then aborted before its first chunk also lets go.
    rid = eng.add_request(prompts[0], GREEDY)
    eng.scheduler.schedule()
    assert eng.prefix.holds
    eng.abort(rid)
    eng.prefix.check()
    assert all_unreferenced(eng.prefix)
    eng.prefix.flush()
    st = eng.cache_stats()
    assert st["pool_used"] == 0 and st["pool_free"] == st["pool_slots"] and st["tree_tokens"] == 0
    assert st.get("window_used", 0) == 0 and st.get("snapshots", 0) == 0
    eng.prefix.check()


def test_compiled_decode_still_applies_to_pool_backed(dense_dir):
    prompts = shared_prompts(20, [3, 9])
    eng = Engine.load(dense_dir, prefill_chunk=16, max_total_tokens=512, compile=True)
    first = eng.generate(prompts, GREEDY)
    second = eng.generate(prompts, GREEDY)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    assert all(r.cached_tokens > 0 for r in second)
    assert eng.compiled.decode.compiled_steps > 0


def test_pool_size_from_memory_budget(dense_dir):
    eng = Engine.load(dense_dir, mem_fraction=1e-6)
    bpt = sum(p.bytes_per_token() for p in eng.compiled.binding.policies)
    assert eng.prefix.slots.capacity == int(1e-6 * device_memory()) // bpt
    assert eng.runner.prefix_io.pool.nbytes == 0  # nothing allocated until something is stored
    assert Engine.load(dense_dir, prefix_cache=False).cache_stats() == {"enabled": False}
    assert Engine.load(dense_dir, graph="dense_noprefix").prefix is None


@pytest.mark.parametrize("arch, kw", [("gpt_oss", {"sliding_window": 8}), ("gemma3_text", {"sliding_window": 8}),
                                      ("qwen3_next", {})])
def test_batched_hits_and_misses_under_pressure_equal_mlx_lm(model_dir, arch, kw):
    """Hits and cold prompts decode in one batch while a small pool evicts leaves, window
    tombstones and snapshots; every answer equals mlx-lm's."""
    d = model_dir(arch, **kw)
    prompts = shared_prompts(33, [2, 19, 7, 40], seed=6) + random_prompts(2, 1024, [26, 11], seed=6)
    eng = Engine.load(d, prefill_chunk=8, max_total_tokens=150, max_batch=4)
    first = eng.generate(prompts, GREEDY)
    second = eng.generate(prompts[::-1], GREEDY)[::-1]
    for p, a, b in zip(prompts, first, second):
        ref = reference_greedy(eng.model, p, 10)
        assert a.token_ids == ref and b.token_ids == ref
    assert sum(r.cached_tokens for r in first + second) > 0
    eng.prefix.check()
    assert all_unreferenced(eng.prefix)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_next", "llama"])
def test_long_prompts_with_hits_equal_mlx_lm(model_dir, arch):
    kw = {"sliding_window": 32} if arch == "gpt_oss" else {}
    d = model_dir(arch, **kw)
    prompts = shared_prompts(700, [300, 5, 900], seed=12)
    eng = Engine.load(d, prefill_chunk=128, max_total_tokens=3000)
    for p in prompts + [prompts[0]]:
        [res] = eng.generate([p], SamplingParams(max_tokens=40, ignore_eos=True))
        assert res.token_ids == reference_greedy(eng.model, p, 40)
    eng.prefix.check()


def test_a_burst_sharing_a_prompt_waits_one_step_and_hits(dense_dir):
    """Requests arriving together with one long shared prefix: the first computes it, the rest
    wait a step (instead of computing it alongside) and hit."""
    prompts = shared_prompts(80, [6, 9, 3, 12], seed=21)
    eng = Engine.load(dense_dir, prefill_chunk=256, max_total_tokens=1024)
    results = eng.generate(prompts, GREEDY)
    assert [r.cached_tokens for r in results] == [0, 80, 80, 80]
    for p, r in zip(prompts, results):
        assert r.token_ids == reference_greedy(eng.model, p, 10)
    # Unrelated requests are not held back.
    others = random_prompts(4, 1024, [90, 70, 85, 60], seed=22)
    before = eng.stats["computed_prompt_tokens"]
    eng.add_request(others[0], GREEDY)
    eng.add_request(others[1], GREEDY)
    sched = eng.scheduler.schedule()
    assert len(sched.prefill) == 2
    assert eng.stats["computed_prompt_tokens"] == before


@pytest.mark.parametrize("arch, kw, seed", [("llama", {}, 0), ("gpt_oss", {"sliding_window": 8}, 1),
                                            ("qwen3_next", {}, 2), ("gemma3_text", {"sliding_window": 4}, 3)])
def test_random_adds_aborts_and_steps_keep_answers_exact_and_books_balanced(model_dir, arch, kw, seed):
    """Random arrivals (prefixes of a few bases, follow-ups of finished turns), aborts and steps
    with a small pool: every finished answer equals mlx-lm's, invariants hold after every call."""
    import random

    rng = random.Random(seed)
    eng = Engine.load(model_dir(arch, **kw), prefill_chunk=rng.choice([4, 8]), max_total_tokens=120,
                      max_batch=3, chain=seed % 2 == 0, prefix_interval=rng.choice([None, 5]))
    bases = [[rng.randrange(3, 1000) for _ in range(rng.randrange(5, 40))] for _ in range(3)]
    live, done = {}, []

    def arrive():
        b = rng.choice(bases)
        p = b[:rng.randrange(1, len(b) + 1)] + [rng.randrange(3, 1000) for _ in range(rng.randrange(0, 8))]
        if done and rng.random() < 0.3:
            q, out = rng.choice(done)
            p = q + out[:rng.randrange(0, len(out) + 1)] + [rng.randrange(3, 1000)]
        n = rng.randrange(1, 10)
        rid = eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
        live[rid] = (p, n, eng.scheduler.by_id[rid])

    for _ in range(40):
        r = rng.random()
        if r < 0.3:
            arrive()
        elif r < 0.38 and live:
            rid = rng.choice(list(live))
            eng.abort(rid)
            live.pop(rid)
        else:
            eng.step()
        for rid in [rid for rid, (_, _, req) in live.items() if req.finished]:
            p, n, req = live.pop(rid)
            assert req.output_ids == reference_greedy(eng.model, p, n)
            done.append((p, req.output_ids))
        eng.prefix.check()
    while eng.has_unfinished():
        eng.step()
    for p, n, req in live.values():
        assert req.output_ids == reference_greedy(eng.model, p, n)
    assert all_unreferenced(eng.prefix)
    eng.prefix.flush()
    eng.prefix.check()
    assert eng.cache_stats()["pool_used"] == 0 and eng.cache_stats().get("window_used", 0) == 0


@pytest.mark.parametrize("header,declined", [(12, True), (40, False)])
def test_a_burst_sharing_a_short_header_stays_batched(dense_dir, header, declined):
    """A burst of prompts that share a cached header: a hit shorter than Scheduler.SHORT_HIT (a
    chat template's header, a BOS token) is declined, so the burst is prefilled in batched
    forwards instead of one forward per prompt; a longer hit is kept. Tokens stay exact."""
    eng = Engine.load(dense_dir, prefill_chunk=256, max_total_tokens=4096, prefill_lanes=1)  # one forward at a time
    head = random_prompts(1, 1024, [header], seed=11)[0]
    eng.generate([head + [5, 6, 7]], GREEDY)  # stores the header
    forwards = {"batched": 0, "alone": 0}
    pb, pc = eng.runner.prefill_batches, eng.runner.run_chunk
    eng.runner.prefill_batches = lambda gs: (forwards.__setitem__("batched", forwards["batched"] + len(gs)), pb(gs))[1]
    eng.runner.run_chunk = lambda prep: (forwards.__setitem__("alone", forwards["alone"] + 1), pc(prep))[1]
    prompts = [head + t for t in random_prompts(6, 1024, [9, 17, 5, 30, 12, 21], seed=12)]
    res = eng.generate(prompts, GREEDY)
    for p, r in zip(prompts, res):
        assert r.token_ids == reference_greedy(eng.model, p, 10)
    hits = [r.cached_tokens for r in res]
    if declined:  # 12 < SHORT_HIT (32) <= 40
        assert hits == [0] * 6 and forwards == {"batched": 1, "alone": 0}
        assert eng.cache_stats()["declined_hits"] == 6
    else:
        assert all(h >= header for h in hits) and forwards["alone"] == 6
    # Alone (no burst), even a short hit is taken: nothing to batch with.
    [one] = eng.generate([head + [9, 9, 9, 9]], GREEDY)
    assert one.cached_tokens >= header
    eng.prefix.check()
