"""Rows of the decode batch left vacant by requests that ended (runtime/batch_rows.py), and the
one-copy merge that joins prompts to the batch (FullKV.extend_all): the arrays they make equal
those of the filter and pairwise extends they replace, and every request's tokens stay mlx-lm's."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime import batch_rows
from graphc.runtime.cache.full import MAX_COPY_RUNS, FullKV
from graphc.runtime.grammar import Grammar
from helpers import assert_greedy_matches_mlx_lm, random_prompts


def _cache(pads: list[int], idx: int, cap: int = 256, seed: int = 0) -> FullKV:
    rng = np.random.default_rng(seed)
    c = FullKV(len(pads), pads)
    shape = (len(pads), 2, cap, 4)
    c.keys = mx.array(rng.standard_normal(shape, dtype=np.float32))
    c.values = mx.array(rng.standard_normal(shape, dtype=np.float32))
    c.idx = idx
    return c


def _rows(c: FullKV) -> list[np.ndarray]:
    """Each row's own columns (after its padding, up to idx) of the keys and values."""
    k, v = np.array(c.keys), np.array(c.values)
    return [np.concatenate([k[r, :, p:c.idx], v[r, :, p:c.idx]]) for r, p in enumerate(c.left_pad)]


@pytest.mark.parametrize("keep", [None, [0, 2, 3], [4], list(range(0, 2 * (MAX_COPY_RUNS + 1), 2))])
def test_extend_all_equals_a_filter_then_pairwise_extends(keep):
    n = 2 * MAX_COPY_RUNS + 2 if keep is not None and len(keep) > MAX_COPY_RUNS else 5
    pads = [(7 * i) % 23 + 3 for i in range(n)]
    parts = [_cache([4, 0], 40, 64, seed=1), _cache([0], 130, 256, seed=2), _cache([9, 2, 0], 12, 64, seed=3)]
    one = _cache(pads, 60, seed=0)
    one.extend_all(parts, keep)
    ref = _cache(pads, 60, seed=0)
    if keep is not None:
        ref.filter(keep)
    for p in parts:
        ref.extend(p)
    assert one.left_pad == ref.left_pad and one.idx == ref.idx
    assert all(np.array_equal(a, b) for a, b in zip(_rows(one), _rows(ref)))
    kept = list(range(n)) if keep is None else keep
    assert one.batch == len(kept) + 6 and one.idx == 130  # the longest part sets the write column


def test_fill_rows_writes_joining_rows_into_vacant_ones_in_place():
    """Rows 1 and 3 of a batch take the two rows of a prefilled group and a single prompt,
    right-aligned at the batch's write column; every other row, the buffers' shape and the write
    column stay; a row longer than the batch's columns does not fit."""
    c = _cache([3, 0, 10, 5], 50, cap=64)
    before = _rows(c)
    parts = [_cache([4, 0], 30, 32, seed=1), _cache([0], 50, 64, seed=2)]
    assert c.can_fill(parts) and not c.can_fill([_cache([0], 51, 64, seed=3)])
    expect = [_rows(parts[0])[0], _rows(parts[1])[0]]
    c.fill_rows([1, 3], parts[:1])
    c.fill_rows([2], parts[1:])
    assert c.keys.shape == (4, 2, 64, 4) and c.idx == 50 and c.left_pad == [3, 24, 0, 20]
    got = _rows(c)
    assert np.array_equal(got[0], before[0]) and np.array_equal(got[2], expect[1])
    assert np.array_equal(got[1], expect[0]) and np.array_equal(got[3], _rows(parts[0])[1])


def test_vacate_narrows_a_row_to_its_next_column():
    c = _cache([3, 0, 10], 50)
    c.vacate([1])
    assert c.left_pad == [3, 50, 10] and c.row_length(1) == 0
    mask = np.array(c.make_mask(1))  # the next decode step: row 1 sees only the column it writes
    assert mask.shape == (3, 1, 1, 51) and mask[1, 0, 0].tolist() == [False] * 50 + [True]


@pytest.fixture
def mdir(model_dir):
    return model_dir("llama")


def _tracking(monkeypatch):
    """Count FullKV filters and extend_alls (with whether they kept a subset)."""
    calls = {"filter": 0, "extend_keep": 0}
    filt, ext = FullKV.filter, FullKV.extend_all

    def filter_(self, rows):
        calls["filter"] += 1
        return filt(self, rows)

    def extend_all(self, others, keep=None):
        calls["extend_keep"] += keep is not None
        return ext(self, others, keep)

    monkeypatch.setattr(FullKV, "filter", filter_)
    monkeypatch.setattr(FullKV, "extend_all", extend_all)
    return calls


def test_ended_rows_stay_vacant_until_a_quarter_of_the_batch(mdir, monkeypatch):
    """Eight rows ending one step apart: the first two ending leave their rows vacant (no filter,
    their live bytes gone), the third passes a quarter of the batch and compacts; tokens are
    mlx-lm's for every request, and the batch is empty at the end."""
    eng = Engine.load(mdir, prefix_cache=False)
    prompts = random_prompts(8, 1024, [9, 30, 4, 17, 12, 25, 6, 21], seed=5)
    news = [3, 4, 5, 20, 20, 20, 20, 20]
    ids = [eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompts, news)]
    reqs = [eng.request(i) for i in ids]
    calls = _tracking(monkeypatch)
    seen = []
    while eng.has_unfinished():
        eng.step()
        if eng.runner.rows:
            seen.append((len(eng.runner.rows), len(eng.runner.batch.vacant), calls["filter"],
                         eng.load_info()["kv_live_bytes"]))
    n_layers = len(eng.runner.policies)
    # rows ended: two vacant and no filter yet; the third: 3 > 8 / 4, one filter per layer, 5 rows left
    assert (8, 1, 0) in [s[:3] for s in seen] and (8, 2, 0) in [s[:3] for s in seen]
    assert (5, 0, n_layers) in [s[:3] for s in seen]
    with_two = [s for s in seen if s[:3] == (8, 2, 0)]
    with_one = [s for s in seen if s[:3] == (8, 1, 0)]
    assert with_two[0][3] < with_one[-1][3]  # a vacated row holds no live KV
    assert eng.runner.rows == [] and eng.runner.caches is None
    assert_greedy_matches_mlx_lm(eng.model, prompts, [eng.result(r) for r in reqs], news)


def test_a_join_compacts_vacant_rows_in_its_own_copy(mdir, monkeypatch):
    """A prompt joining a batch with a vacant row drops the vacant row in the join's one copy (an
    extend_all that keeps the live rows), not in a filter of its own."""
    eng = Engine.load(mdir, prefix_cache=False)
    prompts = random_prompts(5, 1024, [9, 30, 4, 17, 12], seed=8)
    first = [eng.request(eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)))
             for p, n in zip(prompts[:4], [2, 30, 30, 30])]
    calls = _tracking(monkeypatch)
    while first[0].finish_reason is None:
        eng.step()
    assert len(eng.runner.batch.vacant) == 1 and calls["filter"] == 0
    late = eng.request(eng.add_request(prompts[4], SamplingParams(max_tokens=6, ignore_eos=True)))
    while late.finish_reason is None:
        eng.step()
        if not eng.runner.batch.vacant:
            break
    assert calls["filter"] == 0 and calls["extend_keep"] == len(eng.runner.policies)
    assert len(eng.runner.rows) == 4 and late in eng.runner.rows
    while eng.has_unfinished():
        eng.step()
    got = [eng.result(r) for r in first + [late]]
    assert_greedy_matches_mlx_lm(eng.model, prompts, got, [2, 30, 30, 30, 6])


def test_rows_that_need_the_host_or_come_back_leave_at_once(mdir):
    """A grammar row that ends, and a row preempted back to the queue, are taken out of the batch
    (filtered), never left vacant."""
    from graphc.runtime.request import Request, Status

    grammar = SamplingParams(max_tokens=30, grammar=Grammar.regex("[a-z]{2,4}"))
    plain = SamplingParams(max_tokens=3, ignore_eos=True)
    req = Request([1, 2], grammar)
    req.status = Status.FINISHED
    assert not batch_rows.may_vacate(req, lambda p: False)
    req = Request([1, 2], plain)
    req.status = Status.WAITING  # preempted: back in the queue
    assert not batch_rows.may_vacate(req, lambda p: False)
    req.status = Status.FINISHED
    assert batch_rows.may_vacate(req, lambda p: False) and not batch_rows.may_vacate(req, lambda p: True)

    eng = Engine.load(mdir, prefix_cache=False)
    prompts = random_prompts(3, 1024, [9, 12, 7], seed=2)
    eng.add_request(prompts[0], grammar)
    for p in prompts[1:]:
        eng.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
        assert not eng.runner.batch.vacant or all(r.grammar is None for r in eng.runner.rows
                                                  if id(r) in eng.runner.batch.vacant)


def _run_tracking(eng, calls, prompts, news):
    reqs = [eng.request(eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)))
            for p, n in zip(prompts, news)]
    seen = []
    while eng.has_unfinished():
        eng.step()
        if eng.runner.rows:
            seen.append((len(eng.runner.rows), len(eng.runner.batch.vacant), calls["filter"], calls["extend_keep"]))
    assert eng.runner.rows == [] and eng.runner.caches is None
    assert_greedy_matches_mlx_lm(eng.model, prompts, [eng.result(r) for r in reqs], news)
    return seen


def test_copies_keeps_vacant_rows_until_the_buffers_grow(mdir, monkeypatch):
    """decode: {vacant_rows: copies} (a GPU's default): five of eight rows end and stay vacant, past a
    quarter of the batch, with no copy of their own; the step whose write widens the buffers (64
    columns: the longest prompt is 30 tokens) drops them in its copy, one extend_all per layer."""
    eng = Engine.load(mdir, prefix_cache=False, decode_options={"vacant_rows": "copies"})
    assert eng.runner.batch.max_vacant_share == 1.0
    calls = _tracking(monkeypatch)
    prompts = random_prompts(8, 1024, [9, 30, 4, 17, 12, 25, 6, 21], seed=5)
    seen = _run_tracking(eng, calls, prompts, [3, 4, 5, 6, 7, 60, 60, 60])
    n_layers = len(eng.runner.policies)
    assert (8, 5, 0, 0) in seen  # five vacant of eight: no filter, no compaction
    assert (3, 0, 0, n_layers) in seen  # the growth's copy kept the three live rows
    assert all(f == 0 for *_, f, _ in seen)  # no row ever left by a copy of its own


def test_a_growing_step_drops_vacant_rows_in_its_copy(mdir, monkeypatch):
    """Under the CPU's "quarter": one vacant row of eight stays (under a quarter) until the buffers
    grow, and goes in that copy rather than by a filter."""
    eng = Engine.load(mdir, prefix_cache=False)
    assert eng.compiled.plan("decode").choice("vacant rows").choice == "quarter"
    calls = _tracking(monkeypatch)
    prompts = random_prompts(8, 1024, [9, 30, 4, 17, 12, 25, 6, 21], seed=6)
    seen = _run_tracking(eng, calls, prompts, [3] + [50] * 7)
    n_layers = len(eng.runner.policies)
    assert (8, 1, 0, 0) in seen and (7, 0, 0, n_layers) in seen
    assert all(f == 0 for *_, f, _ in seen)


def test_grows_next_says_when_a_write_widens_the_buffers():
    c = _cache([0, 3], 63, cap=64)
    assert not c.grows_next() and c.grows_next(2)
    c.idx = 64
    assert c.grows_next()
    assert not FullKV(2).grows_next()  # nothing written yet: nothing to copy


def _staggered(eng, prompts, news, params, arrive_after):
    """Requests added while the batch decodes: the i-th once arrive_after[i] steps have run."""
    reqs, step = [None] * len(prompts), 0
    while step == 0 or eng.has_unfinished() or any(r is None for r in reqs):
        for i, at in enumerate(arrive_after):
            if reqs[i] is None and step >= at:
                reqs[i] = eng.request(eng.add_request(prompts[i], params(news[i])))
        eng.step()
        step += 1
    return reqs


def test_reuse_writes_joining_rows_into_vacant_ones(mdir, monkeypatch):
    """decode: {vacant_rows: reuse} (a GPU's default): requests that arrive after others ended take
    their rows in place (fill_rows, no copy of the batch), with their first tokens and the
    chained decode in row order, and every request's greedy tokens stay mlx-lm's."""
    eng = Engine.load(mdir, prefix_cache=False, decode_options={"vacant_rows": "reuse"})
    calls = _tracking(monkeypatch)
    fills = {"n": 0}
    fill = FullKV.fill_rows

    def fill_rows(self, slots, others):
        fills["n"] += 1
        return fill(self, slots, others)

    monkeypatch.setattr(FullKV, "fill_rows", fill_rows)
    prompts = random_prompts(7, 1024, [9, 30, 4, 17, 12, 25, 6], seed=7)
    news = [3, 40, 4, 40, 12, 20, 9]
    reqs = _staggered(eng, prompts, news, lambda n: SamplingParams(max_tokens=n, ignore_eos=True),
                      [0, 0, 0, 0, 8, 9, 14])
    assert fills["n"] >= len(eng.runner.policies)  # at least one join wrote into vacant rows
    assert calls["filter"] == 0
    assert_greedy_matches_mlx_lm(eng.model, prompts, [eng.result(r) for r in reqs], news)


@pytest.mark.parametrize("extra", [{}, {"repetition_penalty": 1.3}])
def test_reuse_keeps_each_rows_sampling_state(mdir, extra):
    """Seeded sampling (and penalties, whose counts ride with the rows) gives each request the
    same tokens whether joins refill vacant rows in place or copy the batch."""
    prompts = random_prompts(6, 1024, [9, 30, 4, 17, 12, 25], seed=8)
    news = [3, 30, 4, 30, 12, 14]

    def params(n):
        return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.9, top_k=20, seed=11, **extra)

    out = {}
    for mode in ("copies", "reuse"):
        eng = Engine.load(mdir, prefix_cache=False, decode_options={"vacant_rows": mode})
        reqs = _staggered(eng, prompts, news, params, [0, 0, 0, 0, 7, 8])
        out[mode] = [eng.result(r).token_ids for r in reqs]
    assert out["reuse"] == out["copies"]
