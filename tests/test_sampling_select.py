"""Selection: greedy exactness, seeded determinism across batch compositions,
and the candidate path choosing exactly what the full-vocabulary path chooses."""

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.sampling import SamplingParams, SamplingTensors, noise_state, select_tokens
from graphc.runtime.sampling.select import select_candidates, select_full, select_plain
from graphc.runtime.sampling.tensors import CANDIDATES, FULL, PLAIN, _make_group
from graphc.runtime.token_math import ranks as R
from graphc.runtime.token_math.ranks import rank_order

V = 1000


def _logits(rng, b, v=V, tie_step=None):
    x = rng.normal(0, 2.0, (b, v)).astype(np.float32)
    if tie_step:
        x = np.round(x / tie_step) * tie_step  # many exact ties
    return x


def test_all_greedy_is_plain_argmax_without_positions():
    rng = np.random.default_rng(0)
    x = mx.array(_logits(rng, 5)).astype(mx.bfloat16)
    st = SamplingTensors.build([SamplingParams()] * 4 + [SamplingParams(temperature=0.9, top_k=1)], V)
    assert st.all_greedy
    got = select_tokens(x, st)
    assert got.dtype == mx.int32
    assert np.array(got).tolist() == np.argmax(np.array(x.astype(mx.float32)), axis=-1).tolist()


def test_greedy_ties_pick_lowest_id():
    x = mx.array([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    st = SamplingTensors.build([SamplingParams(), SamplingParams()], 4)
    assert np.array(select_tokens(x, st)).tolist() == [1, 0]


TARGETS = [
    dict(temperature=0.9, seed=77),  # plain
    dict(temperature=0.8, top_k=40, top_p=0.9, seed=78),  # candidates
    dict(temperature=1.1, top_p=0.95, seed=79),  # full sort
    dict(temperature=0.7, min_p=0.05, seed=80),  # plain + min_p mask, no sort
]


@pytest.mark.parametrize("target", TARGETS, ids=["plain", "candidates", "full_top_p", "plain_min_p"])
def test_seeded_row_same_token_alone_or_in_a_mixed_batch(target):
    rng = np.random.default_rng(1)
    others = [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=7, seed=3),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=1.3, top_k=600, min_p=0.01, seed=4),
        SamplingParams(temperature=2.0, top_k=2000, top_p=0.99),
    ]
    p = SamplingParams(**target)
    steps = 30
    x_row = _logits(rng, steps)
    alone, batched = [], []
    for step in range(steps):
        pos = 50 + step
        st1 = SamplingTensors.build([p], V)
        alone.append(int(select_tokens(mx.array(x_row[step : step + 1]), st1, mx.array([pos])).item()))
        batch = others[:3] + [p] + others[3:]
        x = _logits(rng, 7)
        x[3] = x_row[step]
        st7 = SamplingTensors.build(batch, V)
        positions = mx.array(rng.integers(0, 5000, 7).astype(np.int32))
        positions[3] = pos
        toks = select_tokens(mx.array(x), st7, positions, key=mx.random.key(step))
        batched.append(int(np.array(toks)[3]))
    assert alone == batched
    assert len(set(alone)) > 1  # it really samples


def test_seed_and_position_determine_the_token():
    rng = np.random.default_rng(2)
    x = mx.array(np.repeat(_logits(rng, 1), 64, axis=0))
    p = SamplingParams(temperature=1.5, top_k=100, seed=123)
    st = SamplingTensors.build([p] * 64, V)
    same_pos = np.array(select_tokens(x, st, mx.full((64,), 9, mx.int32)))
    assert len(set(same_pos.tolist())) == 1
    many_pos = np.array(select_tokens(x, st, mx.arange(64, dtype=mx.int32)))
    assert len(set(many_pos.tolist())) > 10
    other_seed = SamplingTensors.build([SamplingParams(temperature=1.5, top_k=100, seed=124)] * 64, V)
    assert not np.array_equal(np.array(select_tokens(x, other_seed, mx.arange(64, dtype=mx.int32))), many_pos)


def test_unseeded_rows_follow_the_key():
    rng = np.random.default_rng(3)
    x = mx.array(np.repeat(_logits(rng, 1), 32, axis=0))
    st = SamplingTensors.build([SamplingParams(temperature=1.5)] * 32, V)
    pos = mx.zeros((32,), mx.int32)
    a = np.array(select_tokens(x, st, pos, key=mx.random.key(5)))
    b = np.array(select_tokens(x, st, pos, key=mx.random.key(5)))
    c = np.array(select_tokens(x, st, pos, key=mx.random.key(6)))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) > 5  # rows are independent of each other


def test_rank_order_breaks_ties_by_lower_id():
    x = mx.array([[1.0, 2.0, 2.0, -0.5, 2.0, 1.0]])
    vals, ids = rank_order(x, 6)
    assert np.array(ids).tolist() == [[1, 2, 4, 0, 5, 3]]
    vals4, ids4 = rank_order(x, 4)
    assert np.array(ids4).tolist() == [[1, 2, 4, 0]]


@pytest.mark.parametrize("tie_step", [None, 0.25, 1.0])
def test_candidate_path_equals_full_path(tie_step):
    rng = np.random.default_rng(4 if tie_step is None else int(8 / tie_step))
    B, v = 256, 3000
    x = mx.array(_logits(rng, B, v, tie_step))
    params = []
    for i in range(B):
        params.append(
            SamplingParams(
                temperature=float(rng.choice([0.3, 0.7, 1.0, 1.6, 3.0])),
                top_k=int(rng.choice([2, 3, 10, 50, 300, 1024])),
                top_p=float(rng.choice([1.0, 0.5, 0.9, 0.99])),
                min_p=float(rng.choice([0.0, 0.0, 0.02, 0.3])),
                seed=int(rng.integers(0, 2**63)),
            )
        )
    inv_t = np.array([1.0 / p.temperature for p in params], np.float32)
    rows = list(range(B))
    g_cand = _make_group(CANDIDATES, rows, params, v, inv_t, whole=True)
    g_full = _make_group(FULL, rows, params, v, inv_t, whole=True)
    assert g_cand.width == 1024 and g_full.width == v
    st = SamplingTensors.build(params, v)
    state = noise_state(st, mx.array(rng.integers(0, 10**6, B).astype(np.int32)))
    a = np.array(select_candidates(x, g_cand, state))
    b = np.array(select_full(x, g_full, state))
    assert np.array_equal(a, b), f"{(a != b).sum()} rows differ"
    try:  # the sort-based way of finding the candidates picks the same ranks
        R.CANDIDATE_SELECT = "sort"
        c = np.array(select_candidates(x, g_cand, state))
    finally:
        R.CANDIDATE_SELECT = "topk"
    assert np.array_equal(a, c)
    # The batch entry point routes these rows to the candidate path.
    assert [g.kind for g in st.groups] == [CANDIDATES]


def test_candidate_width_is_bucketed():
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=50), SamplingParams(temperature=1.0, top_k=3)], V)
    (g,) = st.groups
    assert g.kind == CANDIDATES and g.width == 64 and g.use_top_k
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=1025)], 5000)
    assert st.groups[0].kind == FULL
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=5000, top_p=1.0)], 5000)
    assert st.groups[0].kind == "plain"  # top_k >= V is no filter


def test_banned_token_never_chosen_by_any_path():
    rng = np.random.default_rng(5)
    B = 400
    x = np.repeat(_logits(rng, 1), B, axis=0)
    best = int(np.argmax(x[0]))
    kinds = [dict(), dict(temperature=5.0), dict(temperature=5.0, top_k=3), dict(temperature=5.0, top_p=0.99)]
    params = [SamplingParams(banned_token_ids=(best,), seed=i, **kinds[i % 4]) for i in range(B)]
    from graphc.runtime.sampling import edit_logits, token_logprobs

    st = SamplingTensors.build(params, V)
    edited = edit_logits(mx.array(x), st)
    toks = select_tokens(edited, st, mx.arange(B, dtype=mx.int32))
    assert best not in np.array(toks).tolist()
    lp = token_logprobs(edited, st, mx.full((B,), best, mx.int32))
    assert np.all(np.isneginf(np.array(lp.chosen)))


@pytest.mark.parametrize("tie_step", [None, 0.5])
def test_sort_free_min_p_equals_full_path(tie_step):
    rng = np.random.default_rng(11)
    B, v = 128, 3000
    x = mx.array(_logits(rng, B, v, tie_step))
    params = [
        SamplingParams(
            temperature=float(rng.choice([0.5, 1.0, 2.0])),
            min_p=float(rng.choice([0.0, 0.01, 0.1, 0.5, 1.0])),
            seed=int(rng.integers(0, 2**32)),
        )
        for _ in range(B)
    ]
    inv_t = np.array([1.0 / p.temperature for p in params], np.float32)
    rows = list(range(B))
    st = SamplingTensors.build(params, v)
    assert [g.kind for g in st.groups] == [PLAIN]
    state = noise_state(st, mx.array(rng.integers(0, 10**6, B).astype(np.int32)))
    a = np.array(select_plain(x, _make_group(PLAIN, rows, params, v, inv_t, whole=True), state))
    b = np.array(select_full(x, _make_group(FULL, rows, params, v, inv_t, whole=True), state))
    assert np.array_equal(a, b), f"{(a != b).sum()} rows differ"


def test_compiled_selectors_equal_eager(monkeypatch):
    import graphc.runtime.sampling.select as sel

    rng = np.random.default_rng(12)
    B = 64
    x = mx.array(_logits(rng, B, tie_step=0.25))
    kinds = [
        dict(),
        dict(temperature=1.0),
        dict(temperature=0.9, min_p=0.05),
        dict(temperature=0.8, top_k=40, top_p=0.9),
        dict(temperature=1.2, top_p=0.8, min_p=0.01),
        dict(temperature=1.2, top_k=1500),
    ]
    st = SamplingTensors.build([SamplingParams(seed=i, **kinds[i % len(kinds)]) for i in range(B)], V)
    pos = mx.arange(B, dtype=mx.int32)
    compiled = np.array(select_tokens(x, st, pos))
    monkeypatch.setattr(sel, "COMPILE", False)
    eager = np.array(select_tokens(x, st, pos))
    assert np.array_equal(compiled, eager)


@pytest.mark.parametrize("vocab,width", [(40000, 64), (128256, 64), (9000, 16)])
def test_block_candidate_search_matches_a_topk_over_every_key(vocab, width):
    # Large vocabularies find their first ranks block-wise (ranks._block_candidates); with
    # many ties, -inf bans and a vocabulary that is not a multiple of the block, the ranks must
    # be exactly those of a top-k over all V rank keys.
    x = mx.round(mx.random.normal((6, vocab), key=mx.random.key(vocab)) * 4) / 4
    x[:, 3] = float("-inf")
    x[1] = 0.0  # a row of ties only: the lowest ids rank first
    assert -(-vocab // R.BLOCK) >= 4 * width  # this shape takes the block path
    ref = mx.sort(mx.topk(R.rank_keys(x), width, axis=-1), axis=-1)[:, ::-1]
    vals, ids = R.rank_order(x, width)
    assert mx.array_equal(R.ids_from_keys(ref), ids).item()
    assert ids[1].tolist() == list(range(width))
