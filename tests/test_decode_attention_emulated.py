"""graphc's ragged decode attention kernels (runtime/kernels/decode_attention.py: per head, grouped,
vec; their plain variants) run from their own CUDA source on the CPU (tests/cuda_emulator.py, float
instead of bf16) at the cases their GPU check compares: each must equal `reference` (MLX's masked
attention with the kernels' semantics). A change to a .cu fragment is checked here before a GPU
sees it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from cuda_emulator import build, ptr
from graphc.runtime.kernels import decode_attention as da
from graphc.runtime.kernels import decode_attention_cuda as dac

PARAMS = ("const float* q, const float* k, const float* v, const int32_t* start, const int32_t* end, "
          "const float* scale, float* out, const int* q_shape, const int* k_shape")
TEMPLATES = {"per_head": "typename T, int D", "grouped": "typename T, int D, int G, int WARPS",
             "vec": "typename T, int D, int G, int WARPS, int KPL"}


def launches(kind):
    """(case, template arguments, blocks, threads) for each check case `kind` takes (float: itemsize 4)."""
    out = []
    for B, Hq, Hkv, C, D, end, L in da.CHECK_CASES:
        G = Hq // Hkv
        if kind == "per_head":
            out.append(((B, Hq, Hkv, C, D, end, L), f"float, {D}", B * Hq * L, 128))
        elif kind == "grouped" and da.grouped_warps(Hq, Hkv, D):
            w = da.grouped_warps(Hq, Hkv, D)
            out.append(((B, Hq, Hkv, C, D, end, L), f"float, {D}, {G}, {w}", B * Hkv * L, w * 32))
        elif kind == "vec" and da.vec_fits(Hq, Hkv, D, 4):
            for w, kpl in sorted({da.vec_config(n, G, D) for n, _, _ in da.VEC_CONFIG}):
                out.append(((B, Hq, Hkv, C, D, end, L), f"float, {D}, {G}, {w}, {kpl}", B * Hkv * L, w * 32))
    return out


def suffix(targs: str) -> str:
    return targs.replace("float, ", "").replace(", ", "_")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    root = tmp_path_factory.mktemp("emu")
    out = {}
    for kind in TEMPLATES:
        _, _, source = dac.SOURCES[(kind, False)]
        out[kind] = build(source, PARAMS, TEMPLATES[kind],
                          sorted({(suffix(t), t) for _, t, _, _ in launches(kind)}), root)
    if None in out.values():
        pytest.skip("no C++ compiler to emulate the CUDA kernels with")
    return out


# Every block's threads are std::threads: a case of more than this many in all runs under -m slow
# (the whole set took 7 minutes on a 2-core CPU, the default set ~20 s).
DEFAULT_THREADS = 4000


@pytest.mark.parametrize("kind,case,targs,blocks,threads", [
    pytest.param(k, *x, marks=[pytest.mark.slow] if x[2] * x[3] > DEFAULT_THREADS else [])
    for k in TEMPLATES for x in launches(k)], ids=lambda x: str(x))
def test_each_kernel_equals_masked_attention(libs, kind, case, targs, blocks, threads):
    B, Hq, Hkv, C, D, end, L = case
    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, Hq, L, D), dtype=np.float32)
    k, v = (rng.standard_normal((B, Hkv, C, D), dtype=np.float32) for _ in range(2))
    start = np.array([(7 * i) % (end - L) for i in range(B)], dtype=np.int32)
    ends, scale = np.array([end], dtype=np.int32), np.array([D ** -0.5], dtype=np.float32)
    out = np.zeros_like(q)
    getattr(libs[kind], f"run_{suffix(targs)}")(blocks, threads, ptr(q), ptr(k), ptr(v), ptr(start), ptr(ends),
                                                 ptr(scale), ptr(out), ptr(np.array(q.shape, dtype=np.int32)),
                                                 ptr(np.array(k.shape, dtype=np.int32)))
    want = da.reference(mx.array(q), mx.array(k), mx.array(v), mx.array(start), mx.array(ends), float(scale[0]))
    assert float(np.abs(out - np.array(want)).max()) < 1e-4
