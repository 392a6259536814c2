"""Every CUDA kernel behind one interface (applies, check, reference, __call__), listed by name.

On a CPU the kernels cannot run; what can be checked is the interface: each kernel module is
registered, `check()` says why the kernel is off, `applies` draws the documented line, the
references compute what they say, and each method forwards to its module's function (so a
module patched in a test is the kernel the registry gives).
"""

from __future__ import annotations

import ast
from pathlib import Path

import mlx.core as mx
import pytest

from graphc.runtime.kernels import KernelOp, available
from graphc.runtime.kernels import decode_attention as da
from graphc.runtime.kernels import skinny_matmul as sk
from graphc.runtime.kernels import top_ranks as TR
from graphc.runtime.kernels.registry import KERNELS, kernel

KERNELS_DIR = Path(__file__).resolve().parents[1] / "runtime" / "kernels"


def test_every_kernel_module_is_registered():
    with_kernel = {p.stem for p in KERNELS_DIR.glob("*.py")
                   if any(isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "KERNEL"
                          for n in ast.parse(p.read_text()).body)}
    assert with_kernel == set(KERNELS) == {"decode_attention", "gumbel_choose", "quantized_attention",
                                           "quantized_write", "skinny_matmul", "top_ranks"}
    for name, k in KERNELS.items():
        assert isinstance(k, KernelOp) and k.name == name
        for method in ("applies", "check", "reference", "__call__"):
            assert getattr(type(k), method) is not getattr(KernelOp, method), (name, method)


def test_an_unknown_kernel_names_the_known_ones():
    with pytest.raises(KeyError, match="no kernel 'flash'.*decode_attention, gumbel_choose"):
        kernel("flash")


@pytest.mark.skipif(available(), reason="off-CUDA behaviour")
def test_off_cuda_every_check_says_why():
    assert {name: k.check() for name, k in KERNELS.items()} == dict.fromkeys(KERNELS, "not a CUDA device")


def test_applies_draws_the_documented_line():
    att = kernel("decode_attention")
    assert att.applies(32, 8, 128) and att.applies(8, 8, 64)
    assert not att.applies(32, 8, 80) and not att.applies(12, 8, 128) and not att.applies(8, 0, 64)
    gc = kernel("gumbel_choose")
    assert [w for w in (8, 16, 24, 64, 256, 512) if gc.applies(w)] == [16, 64, 256]
    mm = kernel("skinny_matmul")
    w = mx.zeros((64, 256), mx.bfloat16)
    assert mm.applies(mx.zeros((8, 256), mx.bfloat16), w)
    assert not mm.applies(mx.zeros((1, 256), mx.bfloat16), w)  # one row: MLX's matrix-vector kernel
    assert not mm.applies(mx.zeros((8, 256), mx.float32), w.astype(mx.float32))
    qa = kernel("quantized_attention")
    assert qa.applies(32, 8, 64, 64, 8) and qa.applies(32, 8, 128, 32, 4) and not qa.applies(32, 8, 64, 128, 8)
    qw = kernel("quantized_write")
    assert qw.applies(64, 64, 8) and qw.applies(256, 32, 4) and not qw.applies(64, 128, 8) and not qw.applies(512, 64, 8)
    tr = kernel("top_ranks")
    assert tr.applies(128256, 64) and tr.applies(32000, 16)
    assert [v for v in (128256, 1000) if tr.applies(v, 64) != (TR.layout(v, 64) is not None)] == []


def test_references_compute_what_they_say():
    key = mx.random.key(0)
    x = mx.random.normal((4, 64), key=key)
    w = mx.random.normal((32, 64), key=mx.random.split(key)[0])
    assert mx.allclose(kernel("skinny_matmul").reference(x, w), x @ w.T).item()
    B, H, C, D = 2, 2, 8, 32
    q = mx.random.normal((B, H, 1, D), key=key)
    k = mx.random.normal((B, H, C, D), key=mx.random.split(key)[0])
    v = mx.random.normal((B, H, C, D), key=mx.random.split(key)[1])
    start = mx.array([0, 3], mx.int32)
    out = kernel("decode_attention").reference(q, k, v, start, 6, 0.5)
    # row 1 attends columns 3..5 only: the same as attention over that slice alone
    alone = mx.fast.scaled_dot_product_attention(q[1:], k[1:, :, 3:6], v[1:, :, 3:6], scale=0.5)
    assert mx.allclose(out[1:], alone, atol=1e-5).item()


def test_the_interface_forwards_to_the_module(monkeypatch):
    calls = []
    monkeypatch.setattr(sk, "skinny_matmul", lambda x, w, **kw: calls.append((x.shape, w.shape)) or "kernel")
    assert kernel("skinny_matmul")(mx.zeros((2, 32)), mx.zeros((4, 32))) == "kernel"
    assert calls == [((2, 32), (4, 32))]
    # decode_attention's state is its instance's: the registry holds it, the module forwards to it
    att = kernel("decode_attention")
    assert att is da.KERNEL
    monkeypatch.setattr(att, "_check", lambda seed=0: f"patched {seed}")
    assert att.check(3) == "patched 3" and da.check(3) == "patched 3"
