"""graphc's quantized attention kernels (runtime/kernels/quantized_attention.py: the grouped and
the vec kind) run from their own CUDA source on the CPU (tests/cuda_emulator.py: every block as its threads, warp shuffles and
block barriers emulated, float instead of bf16), at every case its GPU check compares: it must
equal MLX's dequantize + masked attention (`reference`). A misread of the code layout must fail
the same comparison."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from cuda_emulator import build, ptr
from graphc.runtime.kernels import quantized_attention as qa

PARAMS = ("const float* q, const uint32_t* k, const float* k_scales, const float* k_biases, const uint32_t* v, "
          "const float* v_scales, const float* v_biases, const int32_t* start, const int32_t* end, "
          "const float* scale, float* out, const int* q_shape, const int* k_shape")
TEMPLATE = "typename T, int D, int G, int WARPS, int BITS, int GS"
VEC_TEMPLATE = TEMPLATE + ", int KPL, int CPL"
# The vec kind at each config that serves (by head dim) and at both codes-a-lane widths.
VEC_CONFIGS = tuple(dict.fromkeys([qa.VEC_CONFIG, *qa.VEC_CONFIG_BY_DIM.values(), (2, 2, 16), (2, 2, 8)]))


def cases():
    for (B, Hq, Hkv, C, D, end, L), widths, groups in qa.CHECK_CASES:
        for bits in widths:
            for group in groups:
                yield (B, Hq, Hkv, C, D, end, L), bits, group


def cases_of(kind, config=None):
    return [c for c in cases() if kind == "grouped" or qa.vec_fits(c[0][1], c[0][2], c[0][4], config[2])]


def instances(kind, config=None):
    """(suffix, template arguments) of each (D, G, bits, group) the cases take; `config`: the vec kind's
    (warps, keys a lane per trip, codes a lane)."""
    seen = {(c[4], c[1] // c[2], bits, group) for c, bits, group in cases_of(kind, config)}
    warps = config[0] if config else qa.WARPS
    extra = f", {config[1]}, {config[2]}" if config else ""
    return [(f"{D}_{G}_{bits}_{gs}", f"float, {D}, {G}, {warps}, {bits}, {gs}{extra}")
            for D, G, bits, gs in sorted(seen)]


def run(lib, case, bits, group, seed, warps=qa.WARPS):
    B, Hq, Hkv, C, D, end, L = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, L, D), dtype=np.float32)
    kf, vf = (mx.array(rng.standard_normal((B, Hkv, C, D), dtype=np.float32)) for _ in range(2))
    planes = (*mx.quantize(kf, group_size=group, bits=bits), *mx.quantize(vf, group_size=group, bits=bits))
    arrays = [np.ascontiguousarray(np.array(p)) for p in planes]
    start = np.array([(7 * i) % (end - L) for i in range(B)], dtype=np.int32)
    ends, scale = np.array([end], dtype=np.int32), np.array([D ** -0.5], dtype=np.float32)
    out = np.zeros_like(q)
    getattr(lib, f"run_{D}_{Hq // Hkv}_{bits}_{group}")(
        B * Hkv * L, warps * 32, ptr(q), *(ptr(a) for a in arrays), ptr(start), ptr(ends), ptr(scale), ptr(out),
        ptr(np.array(q.shape, dtype=np.int32)), ptr(np.array(arrays[0].shape, dtype=np.int32)))
    want = qa.reference(mx.array(q), planes, mx.array(start), mx.array(ends), float(scale[0]), group, bits)
    return float(np.abs(out - np.array(want)).max())


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    root = tmp_path_factory.mktemp("emu")
    out = {"grouped": build(qa._SOURCE, PARAMS, TEMPLATE, instances("grouped"), root)}
    for c in VEC_CONFIGS:
        out[c] = build(qa._VEC_SOURCE, PARAMS, VEC_TEMPLATE, instances("vec", c), root)
    if None in out.values():
        pytest.skip("no C++ compiler to emulate the CUDA kernel with")
    return out


@pytest.mark.parametrize("kind,case,bits,group", [("grouped", *c) for c in cases_of("grouped")] +
                         [(k, *c) for k in VEC_CONFIGS for c in cases_of("vec", k)], ids=lambda x: str(x))
def test_each_kind_equals_dequantize_then_attention(libs, kind, case, bits, group):
    """The grouped kind, and the vec kind at each config (its warps, keys a lane per trip, codes a lane)."""
    assert run(libs[kind], case, bits, group, seed=1, warps=kind[0] if kind != "grouped" else qa.WARPS) < 1e-4


def test_a_misread_layout_fails_the_comparison(tmp_path):
    """The same source reading the high nibble first: wrong at 4 bits, as the comparison must say."""
    broken = qa._SOURCE.replace("((j & 1) * 4)", "((1 - (j & 1)) * 4)")
    assert broken != qa._SOURCE
    case = ((2, 32, 8, 256, 128, 200, 1), 4, 64)
    lib = build(broken, PARAMS, TEMPLATE, [("128_4_4_64", f"float, 128, 4, {qa.WARPS}, 4, 64")], tmp_path)
    if lib is None:
        pytest.skip("no C++ compiler")
    assert run(lib, *case, seed=1) > 1e-2


def test_a_misread_word_fails_the_comparison(tmp_path):
    """The vec kind at 16 codes a lane reading every code from its first 32-bit word: wrong, as the
    comparison must say (the word index of a lane's codes is what 16 codes a lane adds)."""
    broken = qa._VEC_SOURCE.replace("(w)[(BITS * (i)) >> 5]", "(w)[0]")
    assert broken != qa._VEC_SOURCE
    case = ((2, 32, 8, 256, 128, 200, 1), 8, 64)
    lib = build(broken, PARAMS, VEC_TEMPLATE, [("128_4_8_64", "float, 128, 4, 2, 8, 64, 2, 16")], tmp_path)
    if lib is None:
        pytest.skip("no C++ compiler")
    assert run(lib, *case, seed=1, warps=2) > 1e-2
