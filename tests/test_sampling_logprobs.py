"""Logprobs against a float64 numpy reference of the documented distribution."""

import mlx.core as mx
import numpy as np

from graphc.runtime.sampling import (
    SamplingParams,
    SamplingTensors,
    prompt_logprobs,
    sample_step,
)

V = 300


def log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_step_logprobs_match_reference():
    rng = np.random.default_rng(0)
    params = [
        SamplingParams(logprobs=5),  # greedy: T treated as 1
        SamplingParams(temperature=0.5, top_k=10, logprobs=20, seed=1),
        SamplingParams(temperature=2.0, top_p=0.3, logprobs=0, seed=2),  # chosen only
        SamplingParams(temperature=1.0, logprob_token_ids=(3, 7, 299), seed=3),
        SamplingParams(temperature=0.8),  # asked for nothing
        SamplingParams(temperature=0.7, logit_bias={4: 3.0}, banned_token_ids=(9,), logprobs=3, logprob_token_ids=(9, 4), seed=4),
    ]
    B = len(params)
    x = rng.normal(0, 3, (B, V)).astype(np.float32)
    st = SamplingTensors.build(params, V)
    out = sample_step(mx.array(x).astype(mx.bfloat16), st, positions=mx.arange(B, dtype=mx.int32) + 10)
    toks = np.array(out.tokens)
    lists = out.logprobs.to_lists(st)

    xb = np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32), np.float64)
    xb[5, 4] += 3.0
    xb[5, 9] = -np.inf
    temps = np.array([1.0, 0.5, 2.0, 1.0, 0.8, 0.7])
    ref = log_softmax64(xb / temps[:, None])
    assert out.logprobs.chosen.dtype == mx.float32
    np.testing.assert_allclose(np.array(out.logprobs.chosen), ref[np.arange(B), toks], rtol=1e-5, atol=1e-5)
    assert toks[0] == int(np.argmax(xb[0]))
    assert lists[4] is None
    for i, p in enumerate(params):
        if lists[i] is None:
            continue
        n = p.logprobs or 0
        want_ids = sorted(range(V), key=lambda t: (-ref[i, t], t))[:n]
        assert [t for t, _ in lists[i]["top"]] == want_ids
        np.testing.assert_allclose([l for _, l in lists[i]["top"]], ref[i, want_ids], rtol=1e-5, atol=1e-5)
        assert [t for t, _ in lists[i]["requested"]] == list(p.logprob_token_ids)
        np.testing.assert_allclose([l for _, l in lists[i]["requested"]], ref[i, list(p.logprob_token_ids)], rtol=1e-5, atol=1e-5)
    # Banned token: logprob -inf, and it is reported as such when asked for.
    assert lists[5]["requested"][0] == (9, float("-inf"))
    assert 9 not in [t for t, _ in lists[5]["top"]]


def test_logprobs_are_before_filters():
    # Top-k = 2 keeps two tokens, but the third token still has its finite logprob.
    x = np.array([[3.0, 2.0, 1.0, 0.0]], np.float32)
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=2, logprobs=4, seed=0)], 4)
    out = sample_step(mx.array(x), st, positions=mx.array([0]))
    top = out.logprobs.to_lists(st)[0]["top"]
    np.testing.assert_allclose([l for _, l in top], log_softmax64(x)[0], rtol=1e-6)


def test_prompt_logprobs_match_reference():
    rng = np.random.default_rng(1)
    L = 17
    logits = rng.normal(0, 2, (L, V)).astype(np.float32)
    prompt = rng.integers(0, V, L + 1)
    lp, ids, top = prompt_logprobs(mx.array(logits), mx.array(prompt[1:].astype(np.int32)), top=4)
    ref = log_softmax64(logits)
    np.testing.assert_allclose(np.array(lp), ref[np.arange(L), prompt[1:]], rtol=1e-5, atol=1e-5)
    want_ids = np.argsort(-ref, axis=-1, kind="stable")[:, :4]
    assert np.array_equal(np.array(ids), want_ids)
    np.testing.assert_allclose(np.array(top), np.take_along_axis(ref, want_ids, -1), rtol=1e-5, atol=1e-5)
    lp0, ids0, top0 = prompt_logprobs(mx.array(logits), mx.array(prompt[1:].astype(np.int32)))
    assert ids0 is None and top0 is None


def test_chunked_prompt_logprobs_concatenate():
    rng = np.random.default_rng(2)
    L = 12
    logits = rng.normal(0, 2, (L, V)).astype(np.float32)
    nxt = rng.integers(0, V, L).astype(np.int32)
    whole = np.array(prompt_logprobs(mx.array(logits), mx.array(nxt))[0])
    parts = [np.array(prompt_logprobs(mx.array(logits[a:b]), mx.array(nxt[a:b]))[0]) for a, b in ((0, 5), (5, 12))]
    np.testing.assert_array_equal(whole, np.concatenate(parts))
