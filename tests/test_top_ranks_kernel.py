"""The top-ranks kernel (runtime/kernels/top_ranks.py) on the CPU: which shapes it takes, that its
three-stage algorithm (block keys, the K best blocks, their tokens' keys) finds exactly the ranks
MLX's candidate search finds — emulated here in numpy with the kernel's own block width, which
need not be ranks.BLOCK — and its route: a fused sampled step takes it only when asked and when
its check passed, picks the same tokens, and the engine's plan and `decode:` option say so. The
CUDA source itself is compared with MLX bit for bit by `check()` on the GPU before any use."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.kernels import top_ranks as TR
from graphc.runtime.sampling import SamplingTensors, select_tokens
from graphc.runtime.sampling import fused as F
from graphc.runtime.token_math.ranks import first_rank_neg_keys


def test_the_kernel_takes_the_shapes_it_can_hold():
    assert TR.layout(128256, 64) == (32, 4096)  # Llama 3: 4,008 blocks of 32, 2,048 candidates
    assert TR.layout(128256, 128) == (32, 4096)
    assert TR.layout(151936, 64) == (64, 4096)  # Qwen: 4,748 blocks of 32 would not fit
    assert TR.layout(262144, 64) == (64, 4096)
    assert TR.layout(1000, 16) == (32, 32)  # 32 blocks, the last one partial
    assert TR.layout(128256, 256) is None  # 256 x 32 candidate keys > CAP
    assert TR.layout(128256, 48) is None  # K is a power of two
    assert TR.layout(100, 16) is None  # fewer blocks than ranks
    assert TR.layout(16, 16) is None and TR.layout(128256, 8) is None


def _order(bits: np.ndarray) -> np.ndarray:
    b = np.where(bits == 0x80000000, 0, bits).astype(np.uint32)
    return np.where(b >> 31 == 1, ~b, b | np.uint32(0x80000000)).astype(np.uint32)


def _sorted_first_k(keys: np.ndarray, k: int) -> np.ndarray:
    return np.sort(keys)[::-1][:k]


def _kernel_in_numpy(x: np.ndarray, K: int, first_k=_sorted_first_k) -> np.ndarray:
    """The CUDA source's stages, row by row (float32 logits); `first_k(keys, k)`: the k largest
    keys in descending order, as the "sort" variant takes them (or _radix_first_k: "select")."""
    B, V = x.shape
    bk, p = TR.layout(V, K)
    out = np.zeros((B, K), np.uint64)
    for r in range(B):
        o = _order(x[r].view(np.uint32))
        g = -(-V // bk)
        blocks = np.zeros(p, np.uint64)  # padding keys 0
        for j in range(g):
            blocks[j] = (np.uint64(o[j * bk:(j + 1) * bk].max()) << np.uint64(32)) | np.uint64(0xFFFFFFFF - j)
        top = [0xFFFFFFFF - int(k & 0xFFFFFFFF) for k in first_k(blocks, K)]
        cand = np.zeros(K * bk, np.uint64)
        for c in range(K * bk):
            t = top[c // bk] * bk + c % bk
            if t < V:
                cand[c] = (np.uint64(o[t]) << np.uint64(32)) | np.uint64(0xFFFFFFFF - t)
        out[r] = ~first_k(cand, K)
    return out


@pytest.mark.parametrize("V,K,ties", [(1000, 16, False), (5000, 32, True), (9000, 64, False), (4100, 16, True)])
def test_the_kernel_algorithm_finds_the_first_ranks(V, K, ties):
    rng = np.random.default_rng(V + K)
    x = rng.normal(0, 3, (3, V)).astype(np.float32)
    if ties:  # few distinct values, -0.0 beside +0.0: the order falls to the ids
        x = np.round(x) * np.where(np.arange(V) % 3 == 0, -1, 1).astype(np.float32)
    x[:, rng.integers(0, V, V // 10)] = -np.inf
    want = np.array(first_rank_neg_keys(mx.array(x), K))
    assert np.array_equal(_kernel_in_numpy(x, K), want)


def test_off_cuda_the_sampled_step_keeps_mlx_search():
    st = SamplingTensors.build([SamplingParams(temperature=0.8, top_k=50)] * 2, 128256, top_ranks_kernel=True)
    assert TR.check() == "not a CUDA device" and st.fused.kernel is False
    assert "not a CUDA device" in TR.note()


@pytest.fixture
def kernel_on_cpu(monkeypatch):
    """The kernel 'passes' its check and runs as its MLX reference; returns the (rows, K) it was asked for."""
    calls = []

    def kernel(x, width, inv_t, h, positions):
        calls.append((x.shape[0], width))
        return TR.reference(x, width, inv_t, h, positions)

    monkeypatch.setattr(TR, "check", lambda seed=0: None)
    monkeypatch.setattr(TR, "candidates", kernel)
    F._compiled.cache_clear()  # traces keyed on the kernel flag must see the stand-in
    yield calls
    F._compiled.cache_clear()


@pytest.mark.parametrize("seeds", [(None, 3, None), (1, 3, 5), (None, None, None)])
def test_a_fused_step_takes_the_kernel_only_when_asked(kernel_on_cpu, seeds):
    """With the kernel's outputs (here its reference), the rest of the step (filters, the logs of
    the noise, Gumbel-max) picks what the step without it picks, seeded or not."""
    params = [SamplingParams(seed=seeds[0]), SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=seeds[1]),
              SamplingParams(temperature=1.2, top_k=20, min_p=0.05, seed=seeds[2])]
    x = mx.random.normal((3, 4096), key=mx.random.key(0)).astype(mx.bfloat16)
    pos, key = mx.array([4, 9, 2], dtype=mx.int32), mx.random.key(1)
    off = SamplingTensors.build(params, 4096)
    on = SamplingTensors.build(params, 4096, top_ranks_kernel=True)
    assert off.fused.kernel is False and on.fused.kernel is True
    assert on.describe()["fused"]["kernel"] is True
    want = select_tokens(x, off, pos, key).tolist()
    assert kernel_on_cpu == []
    assert select_tokens(x, on, pos, key).tolist() == want
    assert kernel_on_cpu == [(3, 64)]  # one search for the whole batch, K = 64 for top_k 50


def test_the_engine_option_reaches_the_sampler_and_the_plan(model_dir, monkeypatch):
    d = model_dir("llama")
    eng = Engine.load(d)  # the default asks for it; off CUDA the plan's sampling choice is MLX's ops
    assert eng.compiled.plan("decode").choice("sampling").choice == "fused mlx"
    assert eng.runner.sampler.kernel is False
    off = Engine.load(d, decode_options={"sampling_kernel": False})
    assert off.runner.sampler.kernel is False
    assert "sampling kernel" not in dict(off.compiled.plan("decode").passes)  # off CUDA: no line
    # on CUDA the plan says whether it runs, and why not (the device's facts are read at load)
    monkeypatch.setattr("graphc.runtime.kernels.available", lambda: True)
    monkeypatch.setattr(TR, "check", lambda seed=0: "top-ranks kernel differs from MLX's candidate search")
    off = Engine.load(d, decode_options={"sampling_kernel": False})
    assert off.runner.sampler.kernel is False
    assert "off (decode: {sampling_kernel: false})" in dict(off.compiled.plan("decode").passes)["sampling kernel"]
    on = Engine.load(d)
    assert "off (top-ranks kernel differs" in dict(on.compiled.plan("decode").passes)["sampling kernel"]
    assert on.runner.sampler.kernel is False
    monkeypatch.setattr(TR, "check", lambda seed=0: None)  # it matched here: the plan chooses it, the sampler obeys
    on = Engine.load(d)
    assert on.compiled.plan("decode").choice("sampling").choice == "fused cuda" and on.runner.sampler.kernel is True


def _radix_first_k(keys: np.ndarray, k: int, passes: list | None = None) -> np.ndarray:
    """graphc_top_select (the "select" variant's CUDA function) step by step: up to 8 passes of a
    256-bin histogram over the keys under the prefix found so far, the bin holding the need-th key
    from the top (stopping early when that bin holds exactly the keys still needed), then the keys
    at or above the prefix, placed by rank. `passes` gets the number of passes taken."""
    keys = keys.astype(np.uint64)
    prefix, mask, need, taken = 0, 0, k, 0
    for shift in range(56, -1, -8):
        taken += 1
        under = keys[(keys & np.uint64(mask)) == np.uint64(prefix)]
        hist = np.bincount(((under >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.int64), minlength=256)
        above, b = 0, 255
        while above + hist[b] < need:
            above += hist[b]
            b -= 1
        need -= above
        prefix |= b << shift
        mask |= 0xFF << shift
        if hist[b] == need:  # every key of the bin is needed: the keys >= prefix are the k
            break
    if passes is not None:
        passes.append(taken)
    sel = keys[keys >= np.uint64(prefix)]
    assert len(sel) == k  # unique keys: exactly k at or above the k-th
    out = np.zeros(k, np.uint64)
    for key in sel:
        out[int(np.sum(sel > key))] = key
    return out


@pytest.mark.parametrize("n,k,pad", [(4096, 64, 88), (2048, 64, 0), (32, 16, 0), (1024, 256, 500), (4096, 16, 4000)])
def test_the_radix_select_gives_the_sorted_first_k(n, k, pad):
    rng = np.random.default_rng(n + k)
    # few distinct high words (bf16 logits tie often): the low words (the ids) decide
    hi = rng.integers(0, 6, n).astype(np.uint64) + np.uint64(0x7F000000)
    keys = (hi << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - rng.permutation(n).astype(np.uint64))
    keys[n - pad:] = 0  # padding keys
    assert np.array_equal(_radix_first_k(keys, k), np.sort(keys)[::-1][:k])


@pytest.mark.parametrize("n,k", [(4096, 64), (2048, 64), (4096, 16), (32, 16)])
def test_the_radix_select_stops_early_on_spread_keys_and_still_sorts(n, k):
    """Logits that rarely tie (a row's block maxima, its candidate tokens): the boundary bin soon
    holds exactly the keys still needed, so the select stops after a few of its 8 passes, and
    the k it takes are still the k largest, in order."""
    rng = np.random.default_rng(n * k)
    counts = []
    for _ in range(20):
        o = np.array(_order(rng.normal(0, 3, n).astype(np.float32).view(np.uint32)), np.uint64)
        keys = (o << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - rng.permutation(n).astype(np.uint64))
        assert np.array_equal(_radix_first_k(keys, k, counts), np.sort(keys)[::-1][:k])
    assert max(counts) <= 4 and min(counts) >= 1, counts  # 8 without the early stop


def test_the_radix_select_takes_every_pass_when_the_k_th_key_ties_in_its_high_word():
    """Keys whose high words tie at the boundary (bf16 ties) are decided by their low words
    (the ids): no early stop before the bin narrows to exactly the needed keys."""
    hi = np.full(64, 0x7F000000, np.uint64)
    keys = (hi << np.uint64(32)) | np.arange(64, dtype=np.uint64) * np.uint64(3)
    counts = []
    assert np.array_equal(_radix_first_k(keys, 16, counts), np.sort(keys)[::-1][:16])
    assert counts == [8]


@pytest.mark.parametrize("ties", [True, False])
def test_the_kernel_algorithm_with_the_radix_select_finds_the_first_ranks(ties):
    """Ties everywhere (every pass taken) and spread-out logits (the passes stop early)."""
    rng = np.random.default_rng(7)
    x = rng.normal(0, 3, (2, 5000)).astype(np.float32)
    if ties:
        x = np.round(x)
    x[:, rng.integers(0, 5000, 500)] = -np.inf
    want = np.array(first_rank_neg_keys(mx.array(x), 32))
    assert np.array_equal(_kernel_in_numpy(x, 32, _radix_first_k), want)


def test_check_takes_the_select_variant_first_and_falls_back_to_the_sort(monkeypatch):
    import graphc.runtime.kernels as K

    monkeypatch.setattr(K, "available", lambda: True)
    results = {"select": None, "sort": None}
    monkeypatch.setattr(TR, "_compare", lambda seed, variant: results[variant])
    assert TR._compare_variants(0) is None and TR.chosen() == "select"
    monkeypatch.setattr(TR, "check", lambda seed=0: None)  # (check() keeps its first answer per seed)
    assert TR.note().startswith("on (radix select")
    results["select"] = "top-ranks kernel (select) differs from MLX in 3 ids"
    assert TR._compare_variants(1) is None and TR.chosen() == "sort"
    assert "radix select off: top-ranks kernel (select) differs" in TR.note()
    results["sort"] = "top-ranks kernel (sort) differs from MLX in 1 noise"
    why = TR._compare_variants(2)
    assert "(sort) differs" in why and "(select) differs" in why
    monkeypatch.setattr(TR, "_compare", lambda seed, variant: 1 / 0 if variant == "select" else None)
    assert TR._compare_variants(3) is None and TR.chosen() == "sort"  # a build failure of one variant
    assert "ZeroDivisionError" in TR._chosen["select"]
    TR._chosen.update(variant="sort", select="not checked")


def test_both_variants_are_one_kernel_source_with_their_own_first_k():
    sel, srt = TR._variant_source("select"), TR._variant_source("sort")
    assert sel.count("graphc_top_select(s, P, K") == 1 and sel.count("graphc_top_select(s, N, K") == 1
    assert srt.count("graphc_sort_desc(s, P)") == 1 and srt.count("graphc_sort_desc(s, N)") == 1
    assert "FIRST_K" not in sel + srt and "SHARED_EXTRA" not in sel + srt and "BLOCK_MAX" not in sel + srt
    assert "uint4" in sel and "uint4" not in srt  # 16-byte loads in stage 1: the new variant only
    assert TR._kernels["select"].spec["name"] != TR._kernels["sort"].spec["name"]
