"""The fused selection path (runtime/sampling/fused.py): one compiled function for a batch of
greedy and top-k rows must choose what the grouped path chooses, trace once per shape, and
leave the per-row parameters alone between membership changes."""

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.batch_sampling import SamplerCache
from graphc.runtime.sampling import SamplingParams, SamplingTensors, select_tokens
from graphc.runtime.sampling import fused as F
from graphc.runtime.sampling import tensors as T
from graphc.runtime.token_math import ranks as R


def _params(rng, n, seeded=0.7, ks=(2, 5, 17, 50, 64)):
    out = []
    for _ in range(n):
        kind = rng.choice(["greedy", "topk1", "cand", "cand", "cand"])
        seed = int(rng.integers(0, 2**63)) if rng.random() < seeded else None
        if kind == "greedy":
            out.append(SamplingParams())
        elif kind == "topk1":
            out.append(SamplingParams(temperature=1.5, top_k=1, seed=seed))
        else:
            out.append(SamplingParams(temperature=float(rng.choice([0.3, 0.8, 1.0, 2.5])),
                                      top_k=int(rng.choice(ks)),
                                      top_p=float(rng.choice([1.0, 0.5, 0.9])),
                                      min_p=float(rng.choice([0.0, 0.0, 0.05, 0.3])), seed=seed))
    return out


def _logits(rng, b, v, dtype, tie_step=None):
    x = rng.normal(0, 2.0, (b, v)).astype(np.float32)
    if tie_step:
        x = np.round(x / tie_step) * tie_step
    x[:, 7] = -np.inf  # a banned token
    return mx.array(x).astype(dtype)


def _grouped(monkeypatch, params, v):
    with monkeypatch.context() as m:
        m.setattr(T, "FUSED", False)
        return SamplingTensors.build(params, v)


@pytest.mark.parametrize("v,dtype,tie,ks", [
    (1000, mx.float32, 0.25, None),  # top-k over every key (no block search)
    (9000, mx.bfloat16, None, None),  # block search, vocabulary not a multiple of the block
    (20000, mx.float32, 0.5, None),  # block search with many exact ties across blocks
    (64, mx.float32, None, (2, 5, 50)),  # width = V: the full sort
])
def test_fused_chooses_what_the_grouped_path_chooses(monkeypatch, v, dtype, tie, ks):
    rng = np.random.default_rng(v)
    params = _params(rng, 96, **({"ks": ks} if ks else {}))
    st = SamplingTensors.build(params, v)
    assert st.fused is not None and len(st.groups) > 1  # a mixed batch, selected in one piece
    ref = _grouped(monkeypatch, params, v)
    assert ref.fused is None
    for step in range(3):
        x = _logits(rng, len(params), v, dtype, tie)
        pos = mx.array(rng.integers(0, 10**6, len(params)).astype(np.int32))
        key = mx.random.key(step)
        a = np.array(select_tokens(x, st, pos, key))
        b = np.array(select_tokens(x, ref, pos, key))
        assert np.array_equal(a, b), f"{(a != b).sum()} rows differ"
        greedy = [i for i, p in enumerate(params) if p.temperature == 0 or p.top_k == 1]
        assert a[greedy].tolist() == np.argmax(np.array(x.astype(mx.float32)), -1)[greedy].tolist()
        assert 7 not in a.tolist()


def test_fused_compiled_equals_eager(monkeypatch):
    rng = np.random.default_rng(3)
    params = _params(rng, 40)
    st = SamplingTensors.build(params, 9000)
    x, pos, key = _logits(rng, 40, 9000, mx.bfloat16), mx.arange(40, dtype=mx.int32), mx.random.key(1)
    compiled = np.array(select_tokens(x, st, pos, key))
    monkeypatch.setattr(F, "COMPILE", False)
    assert np.array_equal(compiled, np.array(select_tokens(x, st, pos, key)))


def test_fused_traces_once_per_batch_size(monkeypatch):
    calls = []
    real = F._fused

    def counting(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(F, "_fused", counting)
    F._compiled.cache_clear()
    try:
        rng = np.random.default_rng(4)
        params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=i) for i in range(8)]
        st = SamplingTensors.build(params, 3000)
        for step in range(4):  # new logits, positions and key every step: the trace is reused
            mx.eval(select_tokens(_logits(rng, 8, 3000, mx.float32), st, mx.arange(8, dtype=mx.int32) + step,
                                  mx.random.key(step)))
        assert calls == [(8, 3000)]
        st4 = SamplingTensors.build(params[:4], 3000)  # a batch size not seen before traces once
        for step in range(2):
            mx.eval(select_tokens(_logits(rng, 4, 3000, mx.float32), st4, mx.arange(4, dtype=mx.int32),
                                  mx.random.key(step)))
        assert calls == [(8, 3000), (4, 3000)]
    finally:
        F._compiled.cache_clear()


def test_which_batches_take_the_fused_path():
    P = SamplingParams
    assert SamplingTensors.build([P(), P(temperature=1.0, top_k=5)], 100).fused is not None
    assert SamplingTensors.build([P(temperature=1.0, top_k=5, seed=1)], 100).describe()["fused"] == {
        "width": 16, "seeding": "all", "kernel": False, "choose_kernel": False}
    # rows that need the whole vocabulary keep the grouped path; all-greedy needs no sampler
    assert SamplingTensors.build([P(temperature=1.0, top_k=5), P(temperature=1.0)], 100).fused is None
    assert SamplingTensors.build([P(temperature=1.0, top_k=5), P(temperature=1.0, top_p=0.9)], 100).fused is None
    assert SamplingTensors.build([P(), P(temperature=1.0, top_k=1)], 100).fused is None


def test_signed_zero_ties_go_to_the_lower_id_on_every_path():
    # -0.0 and +0.0 compare equal: argmax takes the first; rank order must agree with it.
    x = mx.array([[-1.0, -0.0, 0.0, -2.0], [0.0, -0.0, -3.0, -0.0]])
    assert mx.argmax(x, -1).tolist() == [1, 0]
    _, ids = R.rank_order(x, 4)
    assert ids.tolist() == [[1, 2, 0, 3], [0, 1, 3, 2]]
    st = SamplingTensors.build([SamplingParams(), SamplingParams(temperature=1.0, top_k=2, seed=1)], 4)
    assert st.fused is not None
    assert select_tokens(x, st, mx.array([5, 5], dtype=mx.int32), mx.random.key(0))[0].item() == 1


def test_unseeded_rows_without_a_key_draw_from_the_global_generator():
    params = [SamplingParams(temperature=5.0, top_k=20)] * 64 + [SamplingParams(temperature=1.0, top_k=3, seed=9)]
    st = SamplingTensors.build(params, 500)
    x = mx.zeros((65, 500))  # all ties: the top 20 ranks are ids 0..19
    mx.random.seed(0)
    a = np.array(select_tokens(x, st, mx.arange(65, dtype=mx.int32)))
    b = np.array(select_tokens(x, st, mx.arange(65, dtype=mx.int32)))
    assert a.max() < 20 and b.max() < 20 and not np.array_equal(a[:64], b[:64])
    assert a[64] == b[64] and a[64] < 3  # the seeded row does not move


def test_sampler_cache_reuses_tensors_while_the_rows_are_the_same():
    class Row:
        def __init__(self, params):
            self.params = params

    cache = SamplerCache(100)
    rows = [Row(SamplingParams(temperature=1.0, top_k=5)), Row(SamplingParams())]
    st = cache.tensors(rows)
    assert st is not None and cache.tensors(list(rows)) is st
    assert cache.tensors(rows[:1]) is not st  # membership changed: rebuilt
    greedy = [Row(SamplingParams()), Row(SamplingParams())]
    assert cache.tensors(greedy) is None and cache.tensors(greedy) is None
    assert cache.tensors(rows) is not None


def test_selection_microbench_runs_every_config():
    from graphc.benchmarks.sampling_select import CONFIGS, run_bench

    rows = run_bench(batch_sizes=(4,), vocab=300, iters=1)
    assert [r["config"] for r in rows] == list(CONFIGS) and all(r["ms"] > 0 for r in rows)
    assert rows[0]["ratio_to_greedy"] == 1.0 and rows[0]["nodes"] <= 3  # argmax (+ squeeze, int32 cast)
    assert all(r["nodes"] > rows[0]["nodes"] and r["host_us"] > 0 for r in rows[1:])


def test_sampler_cache_keeps_its_last_tensors_when_a_build_fails():
    class Row:
        def __init__(self, params):
            self.params = params

    cache = SamplerCache(100, eos_token_ids=(2,))
    rows = [Row(SamplingParams(temperature=1.0, top_k=5))]
    st = cache.tensors(rows)
    bad = Row(SamplingParams(temperature=1.0, min_tokens=2**31))  # int32 overflow inside the build
    with pytest.raises(OverflowError):
        cache.tensors(rows + [bad])
    assert cache.tensors(rows) is st  # the bad row left: the batch samples as before
