"""Penalties vs mlx-lm's logits processors; chained count updates; logit edits."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import make_logits_processors, make_repetition_penalty

from graphc.runtime.sampling import (
    SamplingParams,
    SamplingTensors,
    advance,
    apply_penalties,
    apply_token_bitmask,
    build_token_counts,
    edit_logits,
    penalty_history,
    sample_step,
    update_token_counts,
)

V = 200


def _mlx_lm_reference(x_row, history, rep, freq, pres):
    # mlx-lm windows its penalties (default 20 tokens); a window as long as the
    # history makes it penalise the same tokens graphc does.
    n = max(len(history), 1)
    procs = make_logits_processors(
        repetition_penalty=rep,
        repetition_context_size=n,
        presence_penalty=pres,
        presence_context_size=n,
        frequency_penalty=freq,
        frequency_context_size=n,
    )
    y = mx.array(x_row[None])
    toks = mx.array(history, dtype=mx.int32)
    for p in procs:
        y = p(toks, y)
    return np.array(y)[0]


@pytest.mark.parametrize(
    "rep,freq,pres",
    [(1.3, 0.0, 0.0), (0.8, 0.0, 0.0), (1.0, 0.5, 0.0), (1.0, 0.0, 0.7), (1.25, 0.4, -0.6), (1.0, -1.5, 2.0)],
)
def test_penalties_match_mlx_lm(rep, freq, pres):
    rng = np.random.default_rng(0)
    B = 6
    x = rng.normal(0, 3, (B, V)).astype(np.float32)
    x[:, :5] = 0.0  # zero logits: unchanged by the sign-aware rule either way
    histories = [[int(t) for t in rng.integers(0, 40, rng.integers(0, 60))] for _ in range(B)]
    histories[0] = []
    params = [SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)] * B
    st = SamplingTensors.build(params, V)
    counts = build_token_counts(histories, V)
    got = np.array(edit_logits(mx.array(x), st, counts=counts))
    for i in range(B):
        want = _mlx_lm_reference(x[i], histories[i], rep, freq, pres)
        np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-5)


def test_prompt_penalised_only_when_asked():
    prompt, gen = [5, 6, 6], [7]
    assert penalty_history(SamplingParams(), prompt, gen) == [7]
    assert penalty_history(SamplingParams(penalize_prompt=True), prompt, gen) == [5, 6, 6, 7]


def test_neutral_rows_are_untouched_in_a_penalised_batch():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (2, V)).astype(np.float32)
    st = SamplingTensors.build([SamplingParams(), SamplingParams(repetition_penalty=1.5, presence_penalty=1.0)], V)
    assert st.has_penalties
    counts = build_token_counts([[1, 2, 2, 3], [1, 2, 2, 3]], V)
    got = np.array(edit_logits(mx.array(x), st, counts=counts))
    np.testing.assert_array_equal(got[0], x[0])
    assert not np.array_equal(got[1], x[1])


def test_no_penalties_no_counts_needed_and_no_copy():
    x = mx.zeros((2, V), mx.bfloat16)
    st = SamplingTensors.build([SamplingParams(), SamplingParams(temperature=1.0)], V)
    assert not st.has_penalties and not st.needs_edits
    assert edit_logits(x, st) is x  # nothing set: not even an upcast


def test_chained_counts_stay_exact():
    # 12 decode steps built on each other's lazy tokens, evaluated once at the end,
    # equal 12 steps that rebuild the counts on the host each time.
    rng = np.random.default_rng(2)
    B, steps = 5, 12
    logits = rng.normal(0, 1, (steps, B, V)).astype(np.float32)
    params = [SamplingParams(temperature=0.9, top_k=20, repetition_penalty=1.4, frequency_penalty=0.8, presence_penalty=0.5, seed=i) for i in range(B)]
    params[0] = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0)  # greedy row too
    st = SamplingTensors.build(params, V)
    prompts = [[int(t) for t in rng.integers(0, V, 4)] for _ in range(B)]

    counts0 = build_token_counts([penalty_history(p, pr, []) for p, pr in zip(params, prompts)], V)
    pos = mx.array([len(p) for p in prompts], dtype=mx.int32)
    n_gen = mx.zeros((B,), mx.int32)
    counts = counts0
    chained = []
    for s in range(steps):
        out = sample_step(mx.array(logits[s]), st, positions=pos, n_generated=n_gen, counts=counts)
        chained.append(out.tokens)
        pos, n_gen, counts = advance(st, out.tokens, positions=pos, n_generated=n_gen, counts=counts)
    mx.eval(chained, counts)
    chained = np.stack([np.array(t) for t in chained], axis=1)

    gen = [[] for _ in range(B)]
    for s in range(steps):
        c = build_token_counts([penalty_history(p, pr, g) for p, pr, g in zip(params, prompts, gen)], V)
        pos = mx.array([len(pr) + len(g) for pr, g in zip(prompts, gen)], dtype=mx.int32)
        toks = np.array(sample_step(mx.array(logits[s]), st, positions=pos, counts=c).tokens)
        for i in range(B):
            gen[i].append(int(toks[i]))
    assert np.array_equal(chained, np.array(gen))
    rebuilt = build_token_counts([penalty_history(p, pr, g) for p, pr, g in zip(params, prompts, gen)], V)
    assert np.array_equal(np.array(counts), np.array(rebuilt))


def test_update_token_counts_is_pure():
    c = build_token_counts([[1], [2]], 4)
    c2 = update_token_counts(c, mx.array([1, 3]))
    assert np.array(c).tolist() == [[0, 1, 0, 0], [0, 0, 1, 0]]
    assert np.array(c2).tolist() == [[0, 2, 0, 0], [0, 0, 1, 1]]


def test_min_tokens_suppresses_eos_until_n_chained():
    eos = (3, 11)
    x = np.full((3, 20), -1.0, np.float32)
    x[:, 3] = 10.0  # EOS is by far the best token
    x[:, 11] = 9.0
    x[:, 5] = 1.0
    params = [SamplingParams(min_tokens=4), SamplingParams(min_tokens=0), SamplingParams(temperature=1.0, min_tokens=2, seed=1)]
    st = SamplingTensors.build(params, 20, eos_token_ids=eos)
    n_gen = mx.zeros((3,), mx.int32)
    pos = mx.zeros((3,), mx.int32)
    toks = []
    for _ in range(6):
        out = sample_step(mx.array(x), st, positions=pos, n_generated=n_gen)
        toks.append(out.tokens)
        pos, n_gen, _ = advance(st, out.tokens, positions=pos, n_generated=n_gen)
    toks = np.array(mx.stack(toks, axis=1))
    assert toks[0].tolist() == [5, 5, 5, 5, 3, 3]
    assert toks[1].tolist() == [3] * 6
    assert not set(toks[2, :2]) & set(eos)
    # min_tokens honours per-row EOS lists too.
    st2 = SamplingTensors.build([SamplingParams(min_tokens=1)] * 2, 20, eos_token_ids=[[3], [11]])
    t = np.array(sample_step(mx.array(x[:2]), st2, n_generated=mx.zeros((2,), mx.int32)).tokens)
    assert t.tolist() == [11, 3]


def test_logit_bias_and_ban_merge():
    x = np.zeros((1, 10), np.float32)
    st = SamplingTensors.build([SamplingParams(logit_bias={2: 5.0, 4: -100.0, 6: 1.0}, banned_token_ids=(6,))], 10)
    got = np.array(edit_logits(mx.array(x), st))[0]
    assert got[2] == 5.0 and got[4] == -100.0 and np.isneginf(got[6]) and got[0] == 0.0


def test_penalties_before_bias():
    # Documented order: repetition penalty sees the raw logit, bias is added after.
    x = np.array([[2.0, 0.0]], np.float32)
    st = SamplingTensors.build([SamplingParams(repetition_penalty=2.0, logit_bias={0: 1.0})], 2)
    got = np.array(edit_logits(mx.array(x), st, counts=build_token_counts([[0]], 2)))
    assert got[0, 0] == 2.0  # 2 / 2 + 1 (mlx-lm would give (2 + 1) / 2 = 1.5)


def test_token_bitmask_matches_numpy_unpack():
    rng = np.random.default_rng(3)
    B, v = 3, 70
    allowed = rng.random((B, v)) < 0.3
    words = np.zeros((B, (v + 31) // 32), np.uint32)
    for b in range(B):
        for t in np.nonzero(allowed[b])[0]:
            words[b, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    x = rng.normal(0, 1, (B, v)).astype(np.float32)
    got = np.array(apply_token_bitmask(mx.array(x), mx.array(words.view(np.int32))))
    np.testing.assert_array_equal(got, np.where(allowed, x, -np.inf))
    st = SamplingTensors.build([SamplingParams(), SamplingParams(temperature=3.0, seed=1), SamplingParams(temperature=3.0, top_p=0.9, seed=2)], v)
    toks = np.array(sample_step(mx.array(x), st, positions=mx.zeros((B,), mx.int32), token_bitmask=mx.array(words.view(np.int32))).tokens)
    assert all(allowed[b, toks[b]] for b in range(B))


def test_host_processors_break_the_chain_and_apply():
    x = np.random.default_rng(4).normal(0, 1, (2, V)).astype(np.float32)
    proc = make_repetition_penalty(1.5, context_size=100)  # an mlx-lm processor works unchanged
    st = SamplingTensors.build([SamplingParams(), SamplingParams()], V, logits_processors=[None, [proc]])
    assert not st.chain_safe
    hist = [[], [1, 2, 3]]
    with pytest.raises(ValueError, match="histories"):
        edit_logits(mx.array(x), st)
    got = np.array(edit_logits(mx.array(x), st, histories=hist))
    np.testing.assert_array_equal(got[0], x[0])
    want = np.array(proc(mx.array(hist[1]), mx.array(x[1:2])))[0]
    np.testing.assert_allclose(got[1], want)


def test_apply_penalties_direct():
    x = mx.array([[2.0, -2.0, 1.0]])
    c = mx.array([[1, 2, 0]], dtype=mx.int32)
    got = np.array(apply_penalties(x, c, mx.array([2.0]), mx.array([0.5]), mx.array([0.25])))
    np.testing.assert_allclose(got, [[2.0 / 2 - 0.5 - 0.25, -2.0 * 2 - 1.0 - 0.25, 1.0]])
