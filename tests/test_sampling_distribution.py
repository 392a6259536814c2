"""Chi-square tests: sampled frequencies vs the exact filtered distribution.

Each case is one lazy computation over N rows that share fixed logits but have
different seeds (or an unseeded key) and positions, so the N draws are
independent. The noise is seeded, so these tests are deterministic: a pass
stays a pass.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.sampling import SamplingParams, SamplingTensors, select_tokens

N = 20000
V = 16
LOGITS = np.random.default_rng(20240611).normal(0.0, 1.5, V).astype(np.float32)
P_MIN = 1e-3  # deterministic, so this is a fixed pass/fail line, not a flake rate


# ----------------------------------------------------------------- statistics


def _gammq(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) (Numerical Recipes 6.2)."""
    if x <= 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1.0:
        ap, s, d = a, 1.0 / a, 1.0 / a
        for _ in range(10000):
            ap += 1.0
            d *= x / ap
            s += d
            if abs(d) < abs(s) * 1e-15:
                break
        return max(0.0, 1.0 - s * math.exp(-x + a * math.log(x) - gln))
    b = x + 1.0 - a
    c, d = 1.0 / 1e-300, 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h


def chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    # Merge bins with small expectations (lowest first) into one.
    order = np.argsort(expected)
    obs, exp = [], []
    acc_o = acc_e = 0.0
    for i in order:
        acc_o += observed[i]
        acc_e += expected[i]
        if acc_e >= 5.0:
            obs.append(acc_o), exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        obs[-1] += acc_o
        exp[-1] += acc_e
    obs, exp = np.array(obs), np.array(exp)
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    return _gammq(dof / 2.0, stat / 2.0) if dof > 0 else 1.0


def test_chi2_pvalue_helper():
    # Q(k/2, x/2) at known chi-square quantiles.
    assert abs(_gammq(0.5, 3.841458820694124 / 2) - 0.05) < 1e-9
    assert abs(_gammq(5.0, 18.307038053275146 / 2) - 0.05) < 1e-9
    assert abs(_gammq(15.0, 59.703064304429944 / 2) - 0.001) < 1e-9
    assert abs(_gammq(3.5, 3.0 / 2) - 0.8850022316431506) < 1e-9  # small x: series branch


# ------------------------------------------------------------------ reference


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, margin=1e-4):
    """Exact distribution of the documented rules (float64), asserting the case
    sits away from filter boundaries so float32 rounding cannot flip it."""
    x = np.asarray(logits, np.float64)
    v = len(x)
    order = sorted(range(v), key=lambda i: (-x[i], i))
    s = x[order] / temperature
    keep = np.ones(v, bool)
    k = top_k if 0 < top_k < v else v
    keep[k:] = False
    if top_p < 1.0:
        p = np.exp(s - s[0]) * keep
        p /= p.sum()
        excl = np.concatenate([[0.0], np.cumsum(p)[:-1]])
        assert np.min(np.abs(excl[:k] - top_p)) > margin, "top_p boundary too close"
        keep &= excl < top_p
    if min_p > 0:
        d = s - s[0]
        lm = math.log(min_p)
        assert np.min(np.abs(d - lm)) > margin, "min_p boundary too close"
        keep &= d >= lm
    q = np.where(keep, np.exp(s - s[0]), 0.0)
    q /= q.sum()
    out = np.zeros(v)
    out[order] = q
    return out


def draw(params_list, logits=LOGITS, positions=None, key=None):
    B = len(params_list)
    st = SamplingTensors.build(params_list, len(logits))
    x = mx.broadcast_to(mx.array(logits)[None], (B, len(logits)))
    if positions is None:
        positions = (np.arange(B) * 7 + 100) % 4093
    toks = select_tokens(x, st, mx.array(np.asarray(positions, np.int32)), key)
    return np.array(toks)


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0),
    dict(temperature=1.0, top_k=5),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.8, top_k=8, top_p=0.7),
    dict(temperature=1.3, top_p=0.9, min_p=0.05),
    dict(temperature=0.7, top_k=10, top_p=0.93, min_p=0.02),
    dict(temperature=1.5, top_k=3),
    dict(temperature=1.0, top_k=12, min_p=0.2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_seeded_draws_follow_filtered_distribution(case):
    probs = reference_probs(LOGITS, **case)
    base = 1000 + CASES.index(case) * N  # disjoint seeds: independent cases
    toks = draw([SamplingParams(seed=base + i, **case) for i in range(N)])
    counts = np.bincount(toks, minlength=V)
    assert counts[probs == 0].sum() == 0, "a filtered-out token was drawn"
    assert chi2_pvalue(counts, probs) > P_MIN


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[8]], ids=["plain", "top_p", "all"])
def test_unseeded_draws_follow_filtered_distribution(case):
    probs = reference_probs(LOGITS, **case)
    toks = draw([SamplingParams(**case) for _ in range(N)], key=mx.random.key(99))
    counts = np.bincount(toks, minlength=V)
    assert counts[probs == 0].sum() == 0
    assert chi2_pvalue(counts, probs) > P_MIN


def test_one_seed_over_many_positions():
    # A single request sampled at N positions: the per-position noise is independent.
    case = dict(temperature=0.9, top_k=6, top_p=0.95)
    probs = reference_probs(LOGITS, **case)
    toks = draw([SamplingParams(seed=42, **case)] * N, positions=np.arange(N))
    assert chi2_pvalue(np.bincount(toks, minlength=V), probs) > P_MIN


def test_mixed_batch_each_group_follows_its_distribution():
    # Four selection groups interleaved in one batch (exercises gather + inverse permutation).
    cases = [dict(), dict(temperature=1.0), dict(temperature=0.8, top_k=6), dict(temperature=1.2, top_p=0.85)]
    params = [SamplingParams(seed=i, **cases[i % 4]) for i in range(N)]
    toks = draw(params)
    greedy = toks[0::4]
    assert (greedy == int(np.argmax(LOGITS))).all()
    for j in (1, 2, 3):
        probs = reference_probs(LOGITS, **cases[j])
        counts = np.bincount(toks[j::4], minlength=V)
        assert counts[probs == 0].sum() == 0
        assert chi2_pvalue(counts, probs) > P_MIN


def test_a_wrong_distribution_is_rejected():
    # Power check: the test must notice temperature 1.0 draws against T = 1.15.
    toks = draw([SamplingParams(seed=i, temperature=1.0) for i in range(N)])
    assert chi2_pvalue(np.bincount(toks, minlength=V), reference_probs(LOGITS, temperature=1.15)) < P_MIN
