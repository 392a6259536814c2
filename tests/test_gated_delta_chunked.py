"""compiler/gated_delta_chunked.py equals mlx-lm's gated_delta_ops (the per-position loop) to float32 rounding.

Both compute in float32; they differ only in the order of the sums. The loop folds one position
at a time into a [Dv, Dk] state; the chunked form sums C-position blocks by matmul, inverts a
unit lower-triangular C x C system, and multiplies decays e^(G_i - G_j) taken from a cumulative
log-decay G. The one term that grows with the inputs is that last: G reaches sum(log g) over a
chunk (about -1300 for 64 positions of log g ~ -20), whose float32 spacing (~1e-4) becomes a
relative error of the decays between nearby positions; the strong-decay case below measured up
to 9e-6 of the largest value (outputs and states); ordinary decays 1e-6 or less. TOL is 5e-5 of
the largest |value|: a few times that, far below what a wrong term gives (a dropped decay, a
masked position folded in, a missing chunk's state: errors of order one).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.gated_delta import gated_delta_ops

from graphc.compiler.gated_delta_chunked import gated_delta_chunked

TOL = 5e-5


def _inputs(B, T, Hk, Hv, Dk, Dv, vector, masked, log_g_low=-1.0, seed=0):
    mx.random.seed(seed)
    q, k = mx.random.normal((B, T, Hk, Dk)), mx.random.normal((B, T, Hk, Dk))
    # as the models give them (mlx-lm's normalize_qk): unit keys, queries scaled by Dk^-0.5
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * Dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((B, T, Hv, Dv))
    g = mx.exp(mx.random.uniform(log_g_low, 0, (B, T, Hv, Dk) if vector else (B, T, Hv)))
    beta = mx.random.uniform(0, 1, (B, T, Hv))
    state = mx.random.normal((B, Hv, Dv, Dk)) * 0.5
    mask = None
    if masked:  # left padding as a batch of prompts of different lengths has it
        pads = mx.array([0, 3, T // 2, T - 1][:B])
        mask = mx.arange(T)[None, :] >= pads[:, None]
    return q, k, v, g, beta, state, mask


def _rel(ref, got) -> float:
    return (mx.abs(ref - got).max() / mx.maximum(mx.abs(ref).max(), 1e-30)).item()


def _compare(args, chunk=64):
    y0, s0 = gated_delta_ops(*args)
    y1, s1 = gated_delta_chunked(*args, chunk=chunk)
    assert y1.shape == y0.shape and y1.dtype == y0.dtype and s1.shape == s0.shape and s1.dtype == mx.float32
    return _rel(y0, y1), _rel(s0, s1)


@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 200, 700])
@pytest.mark.parametrize("vector", [False, True], ids=["scalar-g", "vector-g"])
@pytest.mark.parametrize("B,masked", [(1, False), (3, True)], ids=["B1", "B3-left-padded"])
def test_equals_the_loop(T, vector, B, masked):
    args = _inputs(B, T, Hk=2, Hv=4, Dk=32, Dv=16, vector=vector, masked=masked, seed=T)
    y_err, s_err = _compare(args)
    assert y_err < TOL and s_err < TOL, (y_err, s_err)


@pytest.mark.parametrize("vector", [False, True], ids=["scalar-g", "vector-g"])
@pytest.mark.parametrize("log_g_low", [-20.0, -1e-3], ids=["strong-decay", "long-memory"])
def test_equals_the_loop_at_extreme_decays(vector, log_g_low):
    args = _inputs(3, 300, Hk=1, Hv=2, Dk=64, Dv=32, vector=vector, masked=True, log_g_low=log_g_low)
    y_err, s_err = _compare(args)
    assert y_err < TOL and s_err < TOL, (y_err, s_err)


def test_no_initial_state_and_other_chunk_sizes():
    q, k, v, g, beta, _, mask = _inputs(3, 77, Hk=2, Hv=2, Dk=16, Dv=8, vector=False, masked=True)
    for chunk in (1, 16, 128):
        y_err, s_err = _compare((q, k, v, g, beta, None, mask), chunk=chunk)
        assert y_err < TOL and s_err < TOL, (chunk, y_err, s_err)


def test_half_inputs_give_the_loops_dtype():
    q, k, v, g, beta, state, _ = _inputs(1, 70, Hk=2, Hv=4, Dk=32, Dv=16, vector=False, masked=False)
    q, k, v, beta = (x.astype(mx.bfloat16) for x in (q, k, v, beta))
    y0, s0 = gated_delta_ops(q, k, v, g, beta, state)
    y1, s1 = gated_delta_chunked(q, k, v, g, beta, state)
    assert y1.dtype == y0.dtype == mx.bfloat16 and s1.dtype == s0.dtype == mx.float32
    assert _rel(s0, s1) < TOL
    # the outputs are rounded to bfloat16 (8 bits of mantissa) after the float32 math
    assert _rel(y0.astype(mx.float32), y1.astype(mx.float32)) < 2**-7


def test_masked_positions_are_beta_zero_decay_one_with_the_loops_output():
    """A position the mask drops leaves the state as it was, exactly as if its beta were 0 and its
    decay 1; its output is still the loop's (computed from the state it would have had). Here: a
    row whose dropped positions sit in the middle of the prompt, far from the left-padding case."""
    q, k, v, g, beta, state, _ = _inputs(2, 130, Hk=2, Hv=2, Dk=16, Dv=8, vector=True, masked=False)
    t = mx.arange(130)[None, :]
    mask = mx.concatenate([(t % 7) != 3, (t < 40) | (t > 90)])
    y_err, s_err = _compare((q, k, v, g, beta, state, mask))
    assert y_err < TOL and s_err < TOL, (y_err, s_err)
    # The state equals the loop's over the kept positions only, beta 0 and g 1 at the others.
    keep = mask[..., None]
    _, s_kept = gated_delta_ops(q, k, v, mx.where(keep[..., None], g, 1.0), mx.where(keep, beta, 0.0), state)
    _, s1 = gated_delta_chunked(q, k, v, g, beta, state, mask)
    assert _rel(s_kept, s1) < TOL
