"""graphc's quantized KV write (runtime/kernels/quantized_write.py) run from its own CUDA source on the
CPU (tests/cuda_emulator.py: every block as its threads, warp shuffles emulated, float instead of
bf16): the codes, scales and biases it writes in place must be mx.quantize's bit for bit, at both
widths, every group size and head dim it takes, over several rows, KV heads and new columns, with
every other column of the planes left as it was; and the quantized attention kernel over the planes
it wrote must still equal the reference (ragged left pads).

MLX's CPU and CUDA quantize differ in two places (mlx/backend/cpu/quantized.cpp against
mlx/backend/cuda/quantized/affine_quantize.cu, MLX 0.32): a group's max starts from -inf on the CPU
and from 0 on CUDA (groups of only negative values), and the CPU rounds halves to even (rint) where
CUDA rounds them away from zero (round). The kernel is CUDA's. So: on random float32 rows, where
neither case occurs (asserted, by a numpy model of each), the kernel equals this CPU's mx.quantize;
on rows made of those cases it equals the model of CUDA's, which the GPU check (`check()`) then
compares with MLX's own CUDA quantize."""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np
import pytest

from cuda_emulator import build, ptr
from graphc.runtime.kernels import quantized_attention as qa
from graphc.runtime.kernels import quantized_write as qw

PLANES = ("k", "k_scales", "k_biases", "v", "v_scales", "v_biases")
PARAMS = ("const float* nk, const float* nv, const uint32_t* k, const float* k_scales, const float* k_biases, "
          "const uint32_t* v, const float* v_scales, const float* v_biases, const int32_t* col, int32_t* end, "
          "const int* nk_shape, const long* nk_strides, const long* nv_strides, const int* k_shape, "
          + ", ".join(f"const long* {p}_strides" for p in PLANES))
TEMPLATE = "typename T, int BITS, int GS"
FORMATS = [(bits, gs) for bits in qw.BITS for gs in qw.GROUP_SIZES]

# (B, Hkv, L, C, D, col): decode steps at Llama-3.2-1B's and -3.1-8B's head dims (fewer KV heads),
# a verify step's 5 new columns, head dims 32 and 256, a write at column 0 and at the last columns.
CASES = [(3, 2, 1, 40, 64, 37), (2, 3, 1, 24, 128, 9), (2, 2, 5, 16, 128, 11), (1, 2, 2, 8, 32, 0),
         (2, 1, 1, 6, 256, 5)]


def cases():
    return [(c, bits, gs) for c in CASES for bits, gs in FORMATS if qw.takes(c[4], gs, bits)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = build(qw._SOURCE, PARAMS, TEMPLATE, [(f"{b}_{g}", f"float, {b}, {g}") for b, g in FORMATS],
                tmp_path_factory.mktemp("emu"))
    if out is None:
        pytest.skip("no C++ compiler to emulate the CUDA kernel with")
    return out


def strides(a: np.ndarray) -> np.ndarray:
    return np.array([s // a.itemsize for s in a.strides], dtype=np.int64)


def write(lib, nk: np.ndarray, nv: np.ndarray, planes: list, col: int, bits: int, gs: int) -> int:
    """Run the kernel as `QuantizedWrite.write` launches it (nk may be a strided view); returns end."""
    B, Hkv, L, D = nk.shape
    total = B * Hkv * L * 2 * (D // 8)
    blocks = -(-total // qw.THREADS)
    end = np.zeros(1, dtype=np.int32)
    getattr(lib, f"run_{bits}_{gs}")(
        blocks, qw.THREADS, nk.ctypes.data_as(ctypes.c_void_p), ptr(nv), *(ptr(p) for p in planes),
        ptr(np.array([col], dtype=np.int32)), ptr(end), ptr(np.array(nk.shape, dtype=np.int32)), ptr(strides(nk)),
        ptr(strides(nv)), ptr(np.array(planes[0].shape, dtype=np.int32)), *(ptr(strides(p)) for p in planes))
    return int(end[0])


def model_quantize(x: np.ndarray, gs: int, bits: int, cuda: bool) -> tuple:
    """MLX's affine quantize in float32 numpy, op for op: its CUDA kernel (`cuda`) or its CPU loop."""
    f = np.float32
    n = f((1 << bits) - 1)
    g = x.astype(f).reshape(*x.shape[:-1], -1, gs)
    lo = np.minimum(g.min(-1), f(np.finfo(f).max) if cuda else f(np.inf))
    hi = np.maximum(g.max(-1), f(0) if cuda else f(-np.inf))
    scale = np.maximum((hi - lo) / n, f(1e-7))
    side = np.abs(lo) > np.abs(hi)
    scale = np.where(side, scale, -scale)
    edge = np.where(side, lo, hi)
    rnd = (lambda y: (np.sign(y) * np.floor(np.abs(y.astype(np.float64)) + 0.5)).astype(f)) if cuda else np.rint
    q0 = rnd(edge / scale)
    scale = np.where(q0 == 0, scale, edge / np.where(q0 == 0, f(1), q0))
    bias = np.where(q0 == 0, f(0), edge)
    c = np.clip(rnd((g - bias[..., None]) / scale[..., None]), 0, n).astype(np.uint32)
    c = c.reshape(*x.shape[:-1], -1, 32 // bits)
    words = (c << (np.arange(32 // bits, dtype=np.uint32) * bits)).sum(-1, dtype=np.uint32)
    return words, scale.astype(f), bias.astype(f)


def garbage(rng, B, Hkv, C, D, bits, gs) -> list:
    """Six planes of random contents: what the write must leave alone outside its columns."""
    codes = lambda: rng.integers(0, 2 ** 32, (B, Hkv, C, D * bits // 32), dtype=np.uint32)  # noqa: E731
    scales = lambda: rng.standard_normal((B, Hkv, C, D // gs), dtype=np.float32)  # noqa: E731
    return [codes(), scales(), scales(), codes(), scales(), scales()]


def new_rows(rng, B, Hkv, L, D):
    """The new keys as RoPE leaves them (a transposed view of [B, L, Hkv, D]), the values contiguous."""
    nk = rng.standard_normal((B, L, Hkv, D), dtype=np.float32).transpose(0, 2, 1, 3)
    nv = 3 * rng.standard_normal((B, Hkv, L, D), dtype=np.float32)
    return nk, nv


def written(planes, col, L):
    return [p[:, :, col:col + L] for p in planes]


@pytest.mark.parametrize("case,bits,gs", cases(), ids=str)
def test_writes_mx_quantize_codes_scales_and_biases_in_place(lib, case, bits, gs):
    B, Hkv, L, C, D, col = case
    rng = np.random.default_rng(B * 100 + D + bits + gs)
    nk, nv = new_rows(rng, B, Hkv, L, D)
    want = [np.array(a) for x in (nk, nv) for a in mx.quantize(mx.array(np.ascontiguousarray(x)), group_size=gs,
                                                                  bits=bits)]
    for x in (nk, nv):  # where MLX's CPU and CUDA quantize agree: neither quirk occurs in these rows
        for a, b in zip(model_quantize(x, gs, bits, cuda=False), model_quantize(x, gs, bits, cuda=True)):
            np.testing.assert_array_equal(a, b)
    planes = garbage(rng, B, Hkv, C, D, bits, gs)
    before = [p.copy() for p in planes]
    assert write(lib, nk, nv, planes, col, bits, gs) == col + L
    for got, w in zip(written(planes, col, L), want):
        np.testing.assert_array_equal(got, w)  # bit for bit: codes, and the float32 scales and biases
    for got, old in zip(planes, before):  # every other column as it was
        np.testing.assert_array_equal(np.delete(got, np.s_[col:col + L], axis=2),
                                      np.delete(old, np.s_[col:col + L], axis=2))


def awkward(B, Hkv, L, D, gs, bits) -> np.ndarray:
    """[B, L, Hkv, D] with the check's groups where the quantizers differ (quantized_write.awkward_groups)
    in every KV head of its first rows."""
    rng = np.random.default_rng(7)
    x = mx.array(rng.standard_normal((B, L, Hkv, D), dtype=np.float32))
    return np.array(qw.awkward_groups(x, gs, bits))


@pytest.mark.parametrize("bits,gs", FORMATS, ids=str)
def test_groups_where_cpu_and_cuda_quantize_differ_follow_cuda(lib, bits, gs):
    B, Hkv, L, C, D, col = 2, 4, 1, 4, 128, 2
    nk = awkward(B, Hkv, L, D, gs, bits).transpose(0, 2, 1, 3)
    nv = np.ascontiguousarray(nk)
    # this CPU's mx.quantize is the CPU model, on these rows too ...
    cpu = mx.quantize(mx.array(nv), group_size=gs, bits=bits)
    for a, b in zip(cpu, model_quantize(nv, gs, bits, cuda=False)):
        np.testing.assert_array_equal(np.array(a), b)
    cuda = model_quantize(nv, gs, bits, cuda=True)
    assert not np.array_equal(np.array(cpu[1])[0, 0], cuda[1][0, 0])  # only negative values: other scales
    # halves: the same scales and biases, codes rounded the other way
    assert np.array_equal(np.array(cpu[1])[0, 3], cuda[1][0, 3]) and np.array_equal(np.array(cpu[2])[0, 3], cuda[2][0, 3])
    assert not np.array_equal(np.array(cpu[0])[0, 3], cuda[0][0, 3])
    # ... and the kernel the CUDA one, every case of it
    planes = garbage(np.random.default_rng(1), B, Hkv, C, D, bits, gs)
    write(lib, nk, nv, planes, col, bits, gs)
    for got, w in zip(written(planes, col, L), (*cuda, *cuda)):
        np.testing.assert_array_equal(got, w)


def test_a_kernel_with_the_cpu_start_value_fails(tmp_path):
    """max from -inf (the CPU's start) instead of 0: groups of only negative values come out different."""
    broken = qw._SOURCE.replace("hi = 0.f;", "hi = -__int_as_float(0x7f7fffff);")
    assert broken != qw._SOURCE
    lib = build(broken, PARAMS, TEMPLATE, [("8_64", "float, 8, 64")], tmp_path)
    if lib is None:
        pytest.skip("no C++ compiler")
    nk = awkward(1, 4, 1, 64, 64, 8).transpose(0, 2, 1, 3)
    nv = np.ascontiguousarray(nk)
    planes = garbage(np.random.default_rng(1), 1, 4, 2, 64, 8, 64)
    write(lib, nk, nv, planes, 0, 8, 64)
    assert not np.array_equal(written(planes, 0, 1)[1], model_quantize(nv, 64, 8, cuda=True)[1])


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    from test_quantized_attention_emulated import PARAMS as QA_PARAMS
    from test_quantized_attention_emulated import TEMPLATE as QA_TEMPLATE
    root = tmp_path_factory.mktemp("emu-qa")
    out = build(qa._SOURCE, QA_PARAMS, QA_TEMPLATE, [(f"{b}_{g}", f"float, 128, 4, {qa.WARPS}, {b}, {g}")
                                                     for b in qa.BITS for g in (32, 64)], root)
    if out is None:
        pytest.skip("no C++ compiler")
    return out


@pytest.mark.parametrize("bits,gs,L", [(8, 64, 1), (4, 32, 1), (8, 32, 3)], ids=str)
def test_attention_over_the_written_planes_equals_the_reference(lib, attention, bits, gs, L):
    """A decode (or verify) step as the cache runs it: the write at column idx, then the quantized
    attention kernel with the end the write returned, rows left-padded by different amounts."""
    B, Hq, Hkv, C, D, idx = 3, 16, 4, 48, 128, 29
    rng = np.random.default_rng(11)
    old = [rng.standard_normal((B, Hkv, C, D), dtype=np.float32) for _ in range(2)]
    planes = [np.array(a) for x in old for a in mx.quantize(mx.array(x), group_size=gs, bits=bits)]
    nk, nv = new_rows(rng, B, Hkv, L, D)
    end = write(lib, nk, nv, planes, idx, bits, gs)
    q = rng.standard_normal((B, Hq, L, D), dtype=np.float32)
    start = np.array([0, 7, idx], dtype=np.int32)  # ragged left pads; the last row sees only its new columns
    scale = np.array([D ** -0.5], dtype=np.float32)
    out = np.zeros_like(q)
    getattr(attention, f"run_{bits}_{gs}")(
        B * Hkv * L, qa.WARPS * 32, ptr(q), *(ptr(p) for p in planes), ptr(start), ptr(np.array([end], np.int32)),
        ptr(scale), ptr(out), ptr(np.array(q.shape, dtype=np.int32)), ptr(np.array(planes[0].shape, dtype=np.int32)))
    # the reference: every column quantized by mx.quantize, the new ones at idx .. idx + L - 1
    full = [x.copy() for x in old]
    full[0][:, :, idx:idx + L], full[1][:, :, idx:idx + L] = nk, nv
    ref_planes = tuple(a for x in full for a in mx.quantize(mx.array(x), group_size=gs, bits=bits))
    want = qa.reference(mx.array(q), ref_planes, mx.array(start), mx.array([idx + L], dtype=mx.int32),
                        float(scale[0]), gs, bits)
    assert float(np.abs(out - np.array(want)).max()) < 1e-4
