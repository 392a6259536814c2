"""Quantized KV on the compiled decode path (runtime/compiled_decode_quantized.py).

`Engine(kv_bits=8|4, compile=True)` decodes compiled on fixed-capacity codes, scales and biases;
its greedy tokens must be those of the eager quantized step (same `mx.quantize`, same quantized
attention, masked columns at zero weight) — batched rows of different lengths joining and
leaving, capacity growth past buckets, chained and unchained, prefix hits, speculative rollback
— and mlx-lm's own QuantizedKVCache decode. Each test also checks the compiled step really ran
(compiled_steps > 0, no fallback), so an engine that silently decodes eager fails.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from graphc.benchmarks import kv_quantized
from graphc.benchmarks.kv_quantized import graphc_teacher_forced
from graphc.compiler.lower import StepInputs
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.full import FullKV
from graphc.runtime.cache.quantized import QuantizedKV, format_of
from graphc.runtime.compiled_decode import CompiledDecode
from graphc.runtime.compiled_decode_kv import reshape_capacity
from graphc.runtime.compiled_decode_quantized import layer_formats
from helpers import random_prompts
from test_kv_quantized import DIMS, reference_greedy_q


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama", **DIMS)


def _ran_compiled(eng) -> CompiledDecode:
    d = eng.compiled.decode
    assert isinstance(d, CompiledDecode)
    assert d.compiled_steps > 0 and d.fallback_steps == 0, (d.compiled_steps, d.fallback_steps)
    return d


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("chain", [True, False])
def test_compiled_greedy_equals_eager_quantized_with_rows_joining_and_leaving(llama, bits, chain):
    kw = dict(kv_bits=bits, prefill_chunk=16, max_batch=3, chain=chain, prefix_cache=False)
    eager = Engine.load(llama, **kw)
    comp = Engine.load(llama, compile=True, **kw)
    # 6 prompts, max_batch 3: rows join and leave mid-decode; 140 tokens crosses buckets 64 -> 128 -> 256.
    prompts = random_prompts(6, eager.vocab_size, [5, 40, 17, 1, 33, 9], seed=3)
    lens = [140, 20, 70, 5, 90, 40]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
    want = [r.token_ids for r in eager.generate(prompts, params)]
    got = [r.token_ids for r in comp.generate(prompts, params)]
    assert got == want and [len(t) for t in got] == lens
    assert eager.compiled.decode.plan.choice("compile mode").choice == "eager"
    _ran_compiled(comp)


@pytest.mark.parametrize("bits", [8, 4])
def test_compiled_quantized_matches_mlx_lm_quantized_cache(llama, bits):
    eng = Engine.load(llama, kv_bits=bits, compile=True, prefill_chunk=16)
    prompts = random_prompts(3, eng.vocab_size, [7, 30, 2], seed=8)
    got = [r.token_ids for r in eng.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))]
    assert got == [reference_greedy_q(eng.model, p, 24, bits) for p in prompts]
    _ran_compiled(eng)


def test_compiled_logits_equal_the_eager_quantized_step(llama):
    """One left-padded decode batch stepped on both paths: same codes written, logits to rounding."""
    eng = Engine.load(llama, kv_bits=8, compile=True, prefill_chunk=16)
    eager, comp = eng.compiled.decode.step, eng.compiled.decode
    prompts = random_prompts(3, eng.vocab_size, [37, 9, 20], seed=2)
    _, caches_a = graphc_teacher_forced(eng, prompts, [[1]] * 3)
    _, caches_b = graphc_teacher_forced(eng, prompts, [[1]] * 3)
    assert any(caches_a[0].left_pad)
    toks = mx.array([[5], [6], [7]], dtype=mx.int32)
    for _ in range(3):
        a = eager.forward(StepInputs(toks, caches_a)).values[eager.logits_node]
        b = comp.forward(StepInputs(toks, caches_b)).values[comp.logits_node]
        np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)), atol=1e-4)
        toks = mx.argmax(a, axis=-1).astype(mx.int32).reshape(3, 1)
    assert comp.compiled_steps == 3
    for ca, cb in zip(caches_a, caches_b):  # the compiled step wrote the codes the eager one did
        assert cb.idx == ca.idx and cb.capacity == 64
        for name in QuantizedKV.PLANES:
            np.testing.assert_array_equal(np.array(getattr(ca, name)[..., : ca.idx, :]),
                                          np.array(getattr(cb, name)[..., : cb.idx, :]))


@pytest.mark.parametrize("bits", [8, 4])
def test_prefix_hits_on_the_compiled_path_equal_cold_runs(llama, bits):
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 900, 37).tolist()
    prompts = [shared + rng.integers(3, 900, k).tolist() for k in (6, 1, 19)] + [list(shared[:20])]
    prompts.append(list(prompts[0]))  # a full-prefix hit
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    cold = Engine.load(llama, kv_bits=bits, prefill_chunk=16, prefix_cache=False)
    want = [r.token_ids for r in cold.generate(prompts, greedy)]
    eng = Engine.load(llama, kv_bits=bits, compile=True, prefill_chunk=16, max_total_tokens=512)
    got = [eng.generate([p], greedy)[0] for p in prompts]
    assert [r.token_ids for r in got] == want
    assert [r.cached_tokens for r in got] == [0, 37, 37, 19, len(prompts[0]) - 1]
    _ran_compiled(eng)
    eng.prefix.check()


# Speculative rollback on the compiled path: tests/test_kv_quantized.py (compiled parametrization).


def test_plan_and_describe_say_quantized_kv_compiles(llama):
    eng = Engine.load(llama, kv_bits=4, compile=True)
    mode = eng.compiled.decode.plan.choice("compile mode")
    assert mode.choice == "compiled" and "quantized KV" in mode.why and "mx.quantized_matmul" in mode.why
    assert "quantized KV" in eng.describe()["built"]["kv"]
    off = Engine.load(llama, kv_bits=4).compiled.decode.plan.choice("compile mode")
    assert off.choice == "eager" and "quantized KV" not in off.why
    plain = Engine.load(llama, compile=True).compiled.decode.plan.choice("compile mode")
    assert "quantized" not in plain.why


def test_layer_formats_take_builtin_formats_only():
    q8 = QuantizedKV.with_format(8, 64)
    assert format_of(q8(1)) == (8, 64) and format_of(FullKV(1)) is None
    k = mx.zeros((1, 2, 4, 64))
    a, b = FullKV(1), q8(1)
    a.update_and_fetch(k, k)
    b.update_and_fetch(k, k)
    assert layer_formats([a, b]) == (None, (8, 64))
    assert layer_formats([a, q8(1)]) is None  # not allocated yet

    class Mine(QuantizedKV):  # a user's subclass may change the math: it stays eager
        pass

    c = Mine.with_format(8, 64)(1)
    c.update_and_fetch(k, k)
    assert format_of(c) is None and layer_formats([c]) is None


def test_reshape_capacity_moves_every_plane():
    c = QuantizedKV.with_format(4, 32)(2, [1, 0])
    k = mx.random.normal((2, 2, 5, 64))
    c.update_and_fetch(k, k * 2)
    before = {n: np.array(getattr(c, n)[..., :5, :]) for n in c.PLANES}
    reshape_capacity(c, 256)
    assert c.capacity == 256 and all(getattr(c, n).shape[2] == 256 for n in c.PLANES)
    for n in c.PLANES:
        np.testing.assert_array_equal(np.array(getattr(c, n)[..., :5, :]), before[n])


def test_decode_speed_bench_runs_every_arm(llama, capsys):
    """The bench's --decode-speed block (benchmarks/kv_quantized.py): every arm ran, the compiled
    arms compiled, KV bytes per token from the arrays. No timing is asserted."""
    assert kv_quantized.main(["--decode-speed", "--model", str(llama), "--batch", "2", "--prompt-len", "8",
                              "--new-tokens", "2", "--repeats", "1", "--no-mlx-lm"]) == 0
    out = json.loads(capsys.readouterr().out)["decode_speed"]
    arms = [f"{c}_{b}" for c in ("eager", "compiled") for b in ("bf16", "8", "4")]
    assert sorted(out["step_ms"]) == sorted(arms)
    assert all(out["compiled_steps"][a] > 0 for a in arms if a.startswith("compiled"))
    assert all(out["compiled_steps"][a] == 0 for a in arms if a.startswith("eager"))
    kv = out["kv_bytes_per_token"]
    H, D, L = 2, 64, 2  # the DIMS model, float32: 8 bits keep D bytes + a float32 scale and bias per 64 values
    assert kv["eager_bf16"] == kv["compiled_bf16"] == L * 2 * H * D * 4
    assert kv["compiled_8"] == L * 2 * H * (D + 8) and kv["compiled_4"] == L * 2 * H * (D // 2 + 8)
    assert set(out["ratios"]) >= {"compiled_8bit_over_bf16", "eager_4bit_over_bf16", "compiled_over_eager_8"}


def test_decode_speed_bench_admits_prompts_longer_than_a_burst(llama, capsys):
    """More prompt tokens than the device's burst (the CPU's 2,048 here: 3 x 1,024): every row is
    admitted before any decodes, where the loop used to wait forever for a full batch once the
    first rows had finished; each arm reports its steps on stderr."""
    assert kv_quantized.main(["--decode-speed", "--model", str(llama), "--batch", "3", "--prompt-len", "1024",
                              "--new-tokens", "2", "--repeats", "1", "--no-mlx-lm", "--bits", "8",
                              "--compile", "off"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)["decode_speed"]
    assert sorted(out["step_ms"]) == ["eager_8", "eager_bf16"]
    assert "repeat 1/1 eager_8" in captured.err


@pytest.mark.parametrize("arch, options", [("llama", {"fuse_projections": False}), ("qwen3", None)])
def test_model_own_attention_takes_the_quantized_sdpa_in_the_trace(model_dir, arch, options):
    """Without a fused block the layer is the model's own module: mlx-lm's attention sees the
    trace's cache has `bits` and runs its quantized SDPA on the codes update_and_fetch returns."""
    d = model_dir(arch, **DIMS)
    kw = dict(kv_bits=8, prefill_chunk=16, max_batch=2, prefix_cache=False)
    comp = Engine.load(d, compile=True, decode_options=options, **kw)
    assert len(comp.compiled.decode.fused) == 0
    prompts = random_prompts(3, comp.vocab_size, [12, 3, 29], seed=4)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (40, 20, 30)]
    want = [r.token_ids for r in Engine.load(d, **kw).generate(prompts, params)]
    assert [r.token_ids for r in comp.generate(prompts, params)] == want
    _ran_compiled(comp)
