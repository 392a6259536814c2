"""The skinny matmul (runtime/kernels/skinny_matmul.py): launch planning, the tuned table,
the compiled decode path's routing through it, and — on a CUDA device only — the kernel
against MLX's matmul.

On the CPU the kernel cannot run: these tests check that asking for it changes nothing
there (it reports why it is off), that every planned launch is one the kernel accepts,
and, with the kernel's entry point replaced by a recording stand-in, that the compiled
decode step sends every llama projection and the head through it and still produces the
uncompiled engine's tokens.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.kernels import skinny_matmul as sk
from graphc.benchmarks import kernel_tune as tune
from helpers import random_prompts

CUDA = sk.available()

LLAMA_SHAPES = [(K, N) for (K, N) in tune.SHAPES] + [(64, 48), (256, 1000), (8192, 512)]


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama")


@pytest.mark.parametrize("M", [2, 3, 8, 9, 16, 31, 32, 64])
def test_heuristic_launches_fit(M):
    for K, N in LLAMA_SHAPES:
        MT, RT, U, WN, WK = sk.heuristic(M, K, N)
        assert MT * 8 >= M and MT in (1, 2, 4, 8)
        assert sk.fits(MT, RT, WN, WK) and 1 <= WN * WK <= 8
        assert (K // 32) // WK >= U or WK == 1  # each k-split warp gets at least one group of loads


def test_sweep_only_yields_fitting_configs():
    for MT in (1, 2, 4, 8):
        cfgs = list(tune.sweep(MT, 4096))
        assert cfgs and all(sk.fits(c[0], c[1], c[3], c[4]) for c in cfgs)
        assert all(c[0] == MT for c in cfgs)


def test_supports_rules():
    w = mx.zeros((64, 128), dtype=mx.bfloat16)
    assert sk.supports(mx.zeros((8, 128), dtype=mx.bfloat16), w)
    assert sk.supports(mx.zeros((2, 3, 128), dtype=mx.bfloat16), w)  # leading dims flatten to 6 rows
    assert not sk.supports(mx.zeros((1, 128), dtype=mx.bfloat16), w)  # one row: MLX's gemv
    assert not sk.supports(mx.zeros((65, 128), dtype=mx.bfloat16), w)  # past MAX_ROWS
    assert not sk.supports(mx.zeros((8, 128), dtype=mx.float32), w.astype(mx.float32))
    assert not sk.supports(mx.zeros((8, 80), dtype=mx.bfloat16), mx.zeros((64, 80), dtype=mx.bfloat16))  # K % 32


def test_table_overrides_heuristic_and_can_hand_shapes_to_mlx(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"table": [
        {"MT": 1, "K": 4096, "N": 4096, "config": [1, 2, 4, 2, 2]},
        {"MT": 8, "K": 4096, "N": 4096, "config": None},
    ]}))
    monkeypatch.setattr(sk, "_table", None)
    sk.load_table(str(path))
    try:
        assert sk.plan(5, 4096, 4096) == (1, 2, 4, 2, 2)  # 5 rows -> 1 tile of 8: the table's entry
        assert sk.plan(64, 4096, 4096) is None  # MLX measured faster there
        assert sk.plan(16, 4096, 4096) == sk.heuristic(16, 4096, 4096)  # not in the table
    finally:
        monkeypatch.setattr(sk, "_table", None)


def test_matmul_falls_back_to_mlx_off_cuda():
    x = mx.random.normal((8, 64), key=mx.random.key(0))
    w = mx.random.normal((48, 64), key=mx.random.key(1))
    assert mx.allclose(sk.matmul(x, w), x @ w.T).item()
    if not CUDA:
        assert sk.check() == "not a CUDA device"


@pytest.mark.skipif(CUDA, reason="CPU behaviour")
def test_engine_flag_is_off_with_a_reason_on_cpu(llama):
    eng = Engine.load(llama, compile=True, skinny_gemm=True)
    d = eng.compiled.decode
    assert d.skinny is False and "CUDA" in d.skinny_note


def test_compiled_decode_routes_projections_and_head_through_the_kernel(llama, monkeypatch):
    """With the kernel's entry point replaced by a recorder, every fused-block projection and
    the head go through it, and greedy tokens equal the uncompiled engine's."""
    calls = []

    def recording(x, w, *, config=None):
        calls.append((x.size // x.shape[-1], w.shape))
        return x @ w.T

    monkeypatch.setattr(sk, "check", lambda seed=0: None)
    monkeypatch.setattr(sk, "available", lambda: True)
    monkeypatch.setattr(sk, "supports", lambda x, w: True)
    monkeypatch.setattr(sk, "skinny_matmul", recording)
    monkeypatch.setattr(sk, "_table", {})
    try:
        plain = Engine.load(llama, max_batch=4)
        comp = Engine.load(llama, max_batch=4, compile=True, skinny_gemm=True)
        assert comp.compiled.decode.skinny is True
        prompts = random_prompts(4, plain.vocab_size, [6, 11, 3, 20], seed=5)
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        want = [r.token_ids for r in plain.generate(prompts, params)]
        got = [r.token_ids for r in comp.generate(prompts, params)]
    finally:
        monkeypatch.setattr(sk, "_table", None)
    assert got == want
    args = comp.model.args
    hd = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    qkv = (args.num_attention_heads + 2 * args.num_key_value_heads) * hd
    shapes = {s for _, s in calls}
    assert (qkv, args.hidden_size) in shapes  # fused q/k/v
    assert (args.hidden_size, args.num_attention_heads * hd) in shapes  # o
    assert (2 * args.intermediate_size, args.hidden_size) in shapes  # fused gate/up
    assert (args.hidden_size, args.intermediate_size) in shapes  # down
    assert (args.vocab_size, args.hidden_size) in shapes  # the head


@pytest.mark.skipif(not CUDA, reason="needs MLX's CUDA backend")
@pytest.mark.parametrize("M,K,N", [(2, 4096, 4096), (8, 2048, 16384), (17, 8192, 2048), (64, 4096, 6144)])
def test_cuda_kernel_matches_mlx(M, K, N):
    assert sk.check() is None
    x = mx.random.normal((M, K), key=mx.random.key(M)).astype(mx.bfloat16)
    w = (mx.random.normal((N, K), key=mx.random.key(N)) * K ** -0.5).astype(mx.bfloat16)
    assert sk.close(sk.skinny_matmul(x, w), x, w) is None
    for cfg in tune.sweep(sk.row_tiles(M), K):
        assert sk.close(sk.skinny_matmul(x, w, config=cfg), x, w) is None, cfg


def test_in_process_check_caches_and_reports_failures(monkeypatch):
    """The check every kernel module uses: off CUDA it says so without building anything; on
    CUDA a kernel that raises is reported, not raised, and each seed is compared once."""
    import graphc.runtime.kernels as kernels

    seen = []

    def compare(seed):
        seen.append(seed)
        if seed == 1:
            raise RuntimeError("Failed to compile kernel")
        return None

    monkeypatch.setattr(kernels, "available", lambda: False)
    check = kernels.in_process_check(compare)
    assert check() == "not a CUDA device" and seen == []
    monkeypatch.setattr(kernels, "available", lambda: True)
    check = kernels.in_process_check(compare)
    assert check(0) is None and check(0) is None
    assert check(1) == "kernel failed: RuntimeError: Failed to compile kernel"
    assert seen == [0, 1]


def test_kernel_names_follow_their_source():
    """MLX caches built kernels on disk by name: a changed source must change the name."""
    from graphc.runtime.kernels import Kernel

    a = Kernel("k", ["x"], ["y"], "y[0] = x[0];")
    b = Kernel("k", ["x"], ["y"], "y[0] = x[0] + 1;")
    assert a.spec["name"] != b.spec["name"] and a.spec["name"].startswith("k_")


@pytest.mark.parametrize("content", [None, "not json", '{"rows": []}', '{"table": [{"MT": 1, "K": 64, "N": 8, "config": [1, 2]}]}'])
def test_a_bad_table_is_a_clear_error(tmp_path, monkeypatch, content):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sk, "_table", None)
    with pytest.raises(ValueError, match="skinny_table .*not a skinny-matmul table.*kernel_tune --table"):
        sk.load_table(str(path))
    monkeypatch.setattr(sk, "_table", None)
