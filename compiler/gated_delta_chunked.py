"""The gated delta rule over a prompt chunk in chunkwise-parallel form (MLX ops, any device).

mlx-lm's `gated_delta_update` (mlx_lm/models/gated_delta.py) has a Metal kernel only; on CUDA
and on the CPU it runs `gated_delta_ops`, a Python loop that builds a dozen ops per prompt
position and layer, so a 32k-token prompt is 32k dependent steps per layer. This computes the
same recurrence (same inputs, outputs, state layout and float32 state math) with T/C dependent
steps of matmuls, C positions (a chunk) at a time, in the WY / UT-transform form of "Gated
Delta Networks" (Yang, Kautz, Hatamizadeh):

Per (batch, head), with the state as M = S^T [Dk, Dv] and D_t = diag(g_t) (g scalar or per key
dim), the step is  M_t = (I - b_t k_t k_t^T) D_t M_{t-1} + b_t k_t v_t^T,  y_t = M_t^T q_t.
Inside a chunk starting from state M_0, with G_t the cumulative log-decay from the chunk's
start, M_t = diag(e^G_t) M_0 + sum_{j<=t} diag(e^(G_t-G_j)) k_j u_j^T, where the pseudo-values
u solve the unit lower-triangular system (I + diag(b) A) U = diag(b) (V - K_G M_0),
A_ij = k_i^T diag(e^(G_i-G_j)) k_j for j < i, K_G's rows e^G_i * k_i. Its inverse does not
depend on M_0, so it is found once for every chunk of the prompt together (forward substitution,
C dependent steps in all); then each chunk costs three matmuls against the carried state.
Every decay factor is e^(G_i - G_j) with i >= j, at most 1: nothing grows, whatever g.

Not bit-identical to the loop (sums run in another order): outputs and states agree to float32
rounding (tests/test_gated_delta_chunked.py measures how closely).
"""

from __future__ import annotations

import mlx.core as mx

CHUNK = 64
# Vector gates need the decay of every (i, j, key dim) triple of a chunk; chunks are taken this
# many elements' worth at a time so a long prompt never holds them all.
PAIRWISE_ELEMENTS = 1 << 24


def gated_delta_chunked(q, k, v, g, beta, state=None, mask=None, chunk: int = CHUNK):
    """`gated_delta_ops(q, k, v, g, beta, state, mask)`, chunkwise.

    q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g: [B, T, Hv] or [B, T, Hv, Dk]; beta: [B, T, Hv];
    state: [B, Hv, Dv, Dk] (float32) or None; mask: [B, T] bool or None (False: the position
    leaves the state unchanged). Returns y [B, T, Hv, Dv] in q's dtype, state [B, Hv, Dv, Dk].
    """
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    out_dtype = q.dtype
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    if (repeat := Hv // Hk) > 1:  # GQA as mlx-lm repeats it
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    # The loop's state is float32 and every product with it promotes: do all of it in float32.
    q, k, v, g, beta = (x.astype(mx.float32) for x in (q, k, v, g, beta))
    vector = g.ndim == 4
    extra = None
    if mask is not None:
        q, g, beta, extra = _masked_positions(q, k, v, g, beta, mask, vector)
    log_g = mx.log(g)

    n = -(-T // chunk)
    pad = n * chunk - T
    if pad:  # padded positions keep the state (beta 0, decay 1) and their outputs are dropped
        q, k, v, beta, log_g = (_pad_time(x, pad) for x in (q, k, v, beta, log_g))

    def chunks(x):  # [B, Tp, H, ...] -> [B, H, n, C, ...]
        x = mx.moveaxis(x, 2, 1)
        return x.reshape(B, Hv, n, chunk, *x.shape[3:])

    q, k, v, beta, log_g = map(chunks, (q, k, v, beta, log_g))
    G = mx.cumsum(log_g, axis=3)  # log-decay from the chunk's start, inclusive

    # A (strictly lower) and P (q_i . decayed k_j, j <= i): the chunk's pairwise terms.
    if vector:
        A, P = _pairwise_vector(q, k, G)
        decay_q = mx.exp(G)  # [B, H, n, C, Dk]
        decay_end = mx.exp(G[..., -1:, :] - G)
        gate_end = mx.exp(G[..., -1, :])[..., :, None]  # [B, H, n, Dk, 1]
    else:
        A, P = _pairwise_scalar(q, k, G)
        decay_q = mx.exp(G)[..., None]
        decay_end = mx.exp(G[..., -1:] - G)[..., None]
        gate_end = mx.exp(G[..., -1])[..., None, None]  # [B, H, n, 1, 1]

    inv = _unit_lower_inverse(beta[..., None] * A)
    W = matmul(inv, beta[..., None] * decay_q * k)  # [B, H, n, C, Dk]
    U0 = matmul(inv, beta[..., None] * v)  # [B, H, n, C, Dv]
    qg = decay_q * q
    k_end = mx.swapaxes(decay_end * k, -1, -2)  # [B, H, n, Dk, C]

    M = mx.swapaxes(state.astype(mx.float32), -1, -2)  # [B, H, Dk, Dv]
    ys = []
    for c in range(n):
        U = U0[:, :, c] - matmul(W[:, :, c], M)
        ys.append(matmul(qg[:, :, c], M) + matmul(P[:, :, c], U))
        M = gate_end[:, :, c] * M + matmul(k_end[:, :, c], U)
    y = mx.stack(ys, axis=2).reshape(B, Hv, n * chunk, Dv)
    y = mx.moveaxis(y, 1, 2)[:, :T]
    if extra is not None:
        y = y + extra
    return y.astype(out_dtype), mx.swapaxes(M, -1, -2)


def _masked_positions(q, k, v, g, beta, mask, vector):
    """Where mask is False the loop computes the step's output from the updated state, then keeps
    the old state S. That output is linear in S: S (g*q - b (k.q) g*k) + b (k.q) v. So such a
    position becomes one that leaves the state alone (beta 0, decay 1) whose query is
    g*(q - b (k.q) k), and b (k.q) v is added to its output afterwards: the loop's values
    exactly, only summed in another order."""
    keep = mask[:, :, None]  # [B, T, 1]
    kq = (k * q).sum(-1)  # [B, T, H]
    gq = g if vector else g[..., None]
    q = mx.where(keep[..., None], q, gq * (q - (beta * kq)[..., None] * k))
    extra = mx.where(keep, 0.0, beta * kq)[..., None] * v
    g = mx.where(keep[..., None] if vector else keep, g, 1.0)
    beta = mx.where(keep, beta, 0.0)
    return q, g, beta, extra


def matmul(a, b):
    """Every product this form takes goes through here (benchmarks/probes/gated_delta_rounding.py
    replaces it to round them like TF32 or bf16)."""
    return a @ b


def _pad_time(x, pad):
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return mx.pad(x, widths)


def _causal(C, strict):
    i = mx.arange(C)
    return (i[:, None] > i[None, :]) if strict else (i[:, None] >= i[None, :])


def _pairwise_scalar(q, k, G):
    """A_ij = e^(G_i-G_j) k_i.k_j (j < i) and P_ij = e^(G_i-G_j) q_i.k_j (j <= i): [B, H, n, C, C]."""
    C = G.shape[-1]
    diff = G[..., :, None] - G[..., None, :]
    decay = mx.exp(mx.where(_causal(C, strict=False), diff, -mx.inf))  # 0 above the diagonal
    kt = mx.swapaxes(k, -1, -2)
    A = mx.where(_causal(C, strict=True), matmul(k, kt) * decay, 0.0)
    P = matmul(q, kt) * decay
    return A, P


def _pairwise_vector(q, k, G):
    """The same with a decay per key dim: sum_d e^(G_id-G_jd) x_id k_jd, a [C, C, Dk] product per
    chunk, taken a bounded number of chunks at a time."""
    B, H, n, C, Dk = k.shape
    step = max(1, PAIRWISE_ELEMENTS // (B * H * C * C * Dk))
    incl, strict = _causal(C, strict=False)[..., None], _causal(C, strict=True)
    As, Ps = [], []
    for s in range(0, n, step):
        Gs, ks, qs = G[:, :, s:s + step], k[:, :, s:s + step], q[:, :, s:s + step]
        diff = Gs[..., :, None, :] - Gs[..., None, :, :]  # [.., C(i), C(j), Dk]
        decayed_k = mx.exp(mx.where(incl, diff, -mx.inf)) * ks[..., None, :, :]
        As.append(mx.where(strict, (ks[..., :, None, :] * decayed_k).sum(-1), 0.0))
        Ps.append((qs[..., :, None, :] * decayed_k).sum(-1))
    return mx.concatenate(As, axis=2), mx.concatenate(Ps, axis=2)


def _unit_lower_inverse(N):
    """(I + N)^-1 for strictly lower-triangular N [..., C, C], by forward substitution: row i of
    the inverse is e_i - N[i, :i] @ rows[:i]. One step per row for every chunk at once."""
    C = N.shape[-1]
    X = mx.broadcast_to(mx.eye(C, dtype=N.dtype), N.shape)
    X = mx.array(X)  # writable copy
    for i in range(1, C):
        X[..., i:i + 1, :] = X[..., i:i + 1, :] - matmul(N[..., i:i + 1, :i], X[..., :i, :])
    return X


__all__ = ["CHUNK", "gated_delta_chunked", "matmul"]
