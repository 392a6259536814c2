"""The Gumbel-choose kernel (runtime/kernels/gumbel_choose.py) on the CPU: its rule — the top-p
sums in MLX's CUDA scan order, the keep mask, s + Gumbel noise, a tree argmax that keeps the lower
rank on ties — run in numpy exactly as the CUDA source runs it, picks `choose.choose`'s token on
rows with ties, masked ranks and every filter combination; its scan adds in the order of MLX's
CUDA `cumsum` (a different order than the CPU's, so its sums differ from the CPU's in low bits but
are the same prefix sums); and its route: a fused sampled step takes it only with the top-ranks
kernel and when its check passed, with the same tokens. The CUDA source itself is compared with
MLX on the GPU by `check_config()` before a configuration's first use (the sums bit for bit, then
the tokens), and built for the H200 offline by tests/test_kernel_builds.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.kernels import gumbel_choose as GC
from graphc.runtime.kernels import top_ranks as TR
from graphc.runtime.sampling import SamplingParams, SamplingTensors, select_tokens
from graphc.runtime.sampling import fused as F
from graphc.runtime.token_math.choose import choose, top_p_sums
from graphc.runtime.token_math.noise import gumbel_from_uniform


def _shfl_up(x, d):
    """__shfl_up_sync over one warp: lane l gets lane l - d's value, lanes below d keep their own."""
    return np.concatenate([x[:d], x[:-d]])


def _cuda_cumsum_in_numpy(p):
    """graphc_mlx_cumsum (the kernel header) for one row of K floats, in float32, lane by lane: four
    values a thread, a Kogge-Stone warp scan of the thread totals shifted up one lane, the first
    warp's total for the second warp, then MLX's three output adds."""
    K = len(p)
    nt = ((K // 4 + 31) // 32) * 32
    v = np.zeros((nt, 4), np.float32)
    v.reshape(-1)[:K] = p
    for j in range(1, 4):
        v[:, j] = v[:, j] + v[:, j - 1]
    prev = np.zeros(nt, np.float32)
    warp_sums = []
    for w in range(nt // 32):
        incl = v[w * 32:(w + 1) * 32, 3].copy()
        for m in (1, 2, 4, 8, 16):
            up = _shfl_up(incl, m)
            incl[m:] = incl[m:] + up[m:]
        ex = _shfl_up(incl, 1)
        ex[0] = np.float32(0.0)
        prev[w * 32:(w + 1) * 32] = ex
        warp_sums.append(np.float32(ex[31] + v[w * 32 + 31, 3]))
    for t in range(nt):
        before = np.float32(0.0) if t < 32 else warp_sums[0]
        for j in range(4):
            v[t, j] = np.float32(np.float32(np.float32(v[t, j] + np.float32(0.0)) + before) + prev[t])
    return v.reshape(-1)[:K]


def _sums_in_numpy(s, top_k, use_k):
    """graphc_top_p_sums: exp(s - s_0) (MLX's own exp, as libdevice's expf is on the GPU), masked past
    min(top_k, K) with top-k, then the scan above."""
    B, K = s.shape
    p = np.array(mx.exp(mx.array(s) - mx.array(s[:, :1])))
    if use_k:
        p[np.arange(K)[None] >= np.minimum(top_k, K)[:, None]] = 0.0
    return np.stack([_cuda_cumsum_in_numpy(row) for row in p])


def _kernel_in_numpy(s, ids, g, top_k, top_p, log_min_p, use_k, use_p, use_m):
    """The CUDA source, thread by thread and row by row (g: MLX's Gumbel noise of u, the same
    function the kernel calls)."""
    B, K = s.shape
    out = np.zeros(B, np.int32)
    c = _sums_in_numpy(s, top_k, use_k) if use_p else None
    for row in range(B):
        kk = min(int(top_k[row]), K)
        best = np.empty(K, np.float32)
        at = np.arange(K)
        for i in range(K):
            keep = True
            if use_k:
                keep = i < kk
            if use_p:
                tp = np.float32(top_p[row])
                excl = np.float32(0.0) if i == 0 else c[row, i - 1]
                keep = keep and (bool(excl < np.float32(tp * c[row, kk - 1])) or bool(tp >= 1.0))
            if use_m:
                keep = keep and bool(np.float32(s[row, i] - s[row, 0]) >= log_min_p[row])
            best[i] = np.float32(s[row, i] + g[row, i]) if keep else -np.inf
        w = K // 2
        while w > 0:
            for i in range(w):
                a, b = best[i], best[i + w]
                if a < b or (a == b and at[i + w] < at[i]):
                    best[i], at[i] = b, at[i + w]
            w //= 2
        out[row] = ids[row, at[0]]
    return out


def _rows(B, K, tie, seed):
    rng = np.random.default_rng(seed)
    s = -np.sort(-rng.normal(0, 2, (B, K)), axis=1).astype(np.float32)
    if tie:  # few distinct values: ties everywhere, decided by the rank
        s = (np.round(s / tie) * tie).astype(np.float32)
    s[rng.uniform(size=(B, K)) < 0.05] = -np.inf
    s[:, 0] = np.maximum(s[:, 0], 0)
    s = -np.sort(-s, axis=1)
    ids = rng.integers(0, 200000, (B, K)).astype(np.int32)
    u = np.clip(rng.uniform(size=(B, K)), 2.0**-32, 1 - 2.0**-24).astype(np.float32)
    if tie:  # equal noise too, so equal scores reach the argmax
        u[:] = np.float32(0.5)
    top_k = rng.integers(1, K + 8, B).astype(np.int32)
    top_p = np.where(np.arange(B) % 3 == 0, 1.0, rng.uniform(0.05, 1.0, B)).astype(np.float32)
    log_min_p = np.where(np.arange(B) % 2 == 0, -np.inf, np.log(rng.uniform(0.001, 0.5, B))).astype(np.float32)
    return s, ids, u, top_k, top_p, log_min_p


@pytest.mark.parametrize("B,K,tie", [(16, 16, 0.0), (9, 64, 0.5), (6, 32, 0.25), (4, 128, 0.0)])
@pytest.mark.parametrize("flags", GC.FLAGS)
def test_the_kernel_rule_picks_chooses_token(B, K, tie, flags):
    use_k, use_p, use_m = flags
    s, ids, u, top_k, top_p, log_min_p = _rows(B, K, tie, B * K + int(tie * 8))
    S, I, U = mx.array(s), mx.array(ids), mx.array(u)
    TK, TP, LM = mx.array(top_k), mx.array(top_p), mx.array(log_min_p)
    g = gumbel_from_uniform(U)
    want = np.array(choose(S, I, g, TK, TP, LM, use_top_k=use_k, use_top_p=use_p, use_min_p=use_m))
    got = _kernel_in_numpy(s, ids, np.array(g), top_k, top_p, log_min_p, use_k, use_p, use_m)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("K", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("use_k", [False, True])
def test_the_kernel_scan_is_a_prefix_sum_in_the_cuda_order(K, use_k):
    """Its sums are choose.top_p_sums' up to float32 rounding (the same prefix sums), and its order is
    not the CPU's sequential one: at K >= 32 some sums differ in low bits, which is why the GPU check
    compares the kernel's sums with MLX's CUDA cumsum bit for bit, and why the order is written out."""
    s, ids, u, top_k, top_p, log_min_p = _rows(8, K, 0.0, K + use_k)
    keep_k = (mx.arange(K)[None] < mx.minimum(mx.array(top_k), K)[:, None]) if use_k else None
    cpu = np.array(top_p_sums(mx.array(s), keep_k))
    got = _sums_in_numpy(s, top_k, use_k)
    np.testing.assert_allclose(got, cpu, rtol=2e-6, atol=0)
    if K >= 64:
        assert not np.array_equal(got.view(np.uint32), cpu.view(np.uint32))  # another association


def test_the_scan_order_written_out():
    """Four values a thread left to right, then the thread's exclusive prefix added last: with values
    whose sums round differently by association, rank 5's sum is (p4 + p5) + (p0 + p1 + p2 + p3)."""
    p = np.zeros(16, np.float32)
    p[:6] = [1.0, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24]
    c = _cuda_cumsum_in_numpy(p)
    seq = np.cumsum(p, dtype=np.float32)  # sequential: every 2**-24 is lost against 1.0
    assert seq[5] == np.float32(1.0)
    assert c[5] == np.float32(np.float32(p[4] + p[5]) + np.float32(((p[0] + p[1]) + p[2]) + p[3]))
    assert c[5] > np.float32(1.0)  # the two small values added first survive


def test_off_cuda_the_kernel_is_off_and_says_why():
    assert GC.check() == "not a CUDA device" and not GC.usable(64, True, True, False)
    assert GC.check_config(64, True, True, False) == "not a CUDA device"
    assert "off for K=64 (top-k + top-p): not a CUDA device" in GC.note()


def test_each_configuration_is_checked_once_on_first_use(monkeypatch):
    """The engine's first sampled step builds and checks only its own configuration (one NVRTC
    build), not every width and filter combination; the answer is kept."""
    import graphc.runtime.kernels as K

    asked = []

    def compare(seed, cases, flags):
        asked.append(({c[1] for c in cases}, flags))
        return None if flags == ((True, True, False),) else "differs"

    monkeypatch.setattr(K, "available", lambda: True)
    monkeypatch.setattr(GC, "_compare", compare)
    monkeypatch.setattr(GC, "_configs", {})
    assert GC.usable(64, True, True, False) and GC.usable(64, True, True, False)
    assert asked == [({64}, ((True, True, False),))]
    assert not GC.usable(32, False, False, True)
    assert not GC.usable(48, True, True, False) and not GC.usable(512, True, True, False)  # no build asked
    assert len(asked) == 2
    assert GC.note() == "on for K=64 (top-k + top-p); off for K=32 (min-p): differs"


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """Both kernels 'pass' their checks and run as their MLX references; returns what was asked."""
    calls = []

    def candidates(x, width, inv_t, h, positions):
        calls.append(("candidates", x.shape[0], width))
        return TR.reference(x, width, inv_t, h, positions)

    def gumbel(s, ids, u, top_k, top_p, log_min_p, **flags):
        calls.append(("choose", s.shape[0], flags["use_top_p"]))
        return GC.reference(s, ids, u, top_k, top_p, log_min_p, **flags)

    monkeypatch.setattr(TR, "check", lambda seed=0: None)
    monkeypatch.setattr(TR, "candidates", candidates)
    monkeypatch.setattr(GC, "check_config", lambda *config: None)
    monkeypatch.setattr(GC, "choose", gumbel)
    F._compiled.cache_clear()
    yield calls
    F._compiled.cache_clear()


@pytest.mark.parametrize("top_p", [0.9, 1.0])
def test_a_fused_step_takes_the_choose_kernel_after_the_top_ranks_kernel(kernels_on_cpu, top_p):
    params = [SamplingParams(seed=3), SamplingParams(temperature=0.8, top_p=top_p, top_k=50, seed=4),
              SamplingParams(temperature=1.2, top_k=20, min_p=0.05, seed=5)]
    x = mx.random.normal((3, 4096), key=mx.random.key(0)).astype(mx.bfloat16)
    pos = mx.array([4, 9, 2], dtype=mx.int32)
    off = SamplingTensors.build(params, 4096)
    on = SamplingTensors.build(params, 4096, top_ranks_kernel=True)
    assert (off.fused.choose_kernel, on.fused.choose_kernel) == (False, True)
    assert on.describe()["fused"]["choose_kernel"] is True
    want = select_tokens(x, off, pos).tolist()
    assert kernels_on_cpu == []
    assert select_tokens(x, on, pos).tolist() == want
    assert kernels_on_cpu == [("candidates", 3, 64), ("choose", 3, top_p < 1.0)]  # top-p's scan in the kernel


def test_the_choose_kernel_waits_for_the_top_ranks_kernel(monkeypatch):
    """Its check passing is not enough: without the top-ranks kernel there is no kernel path."""
    monkeypatch.setattr(GC, "check_config", lambda *config: None)
    st = SamplingTensors.build([SamplingParams(temperature=0.8, top_k=50, seed=1)] * 2, 128256, top_ranks_kernel=True)
    assert st.fused.kernel is False and st.fused.choose_kernel is False
