"""Quantized KV through graphc's quantized attention kernel (runtime/kernels/quantized_attention.py,
the route in runtime/cache/quantized.py), on the CPU: the CUDA kernel cannot run here, so

- its reading of mx.quantize's layout (bytes, nibbles, one scale and bias per group) is emulated
  in numpy index for index and put through the kernel's own check (`_compare`), which must pass,
  and must fail for a misread layout;
- the route is forced on with the kernel replaced by its reference (dequantize, masked
  attention): what is tested is everything around it — which steps take the kernel, the columns
  and first valid column each row passes, prompt chunks dequantized into MLX's attention, the
  self-check's reference — and that greedy tokens stay mlx-lm's own on its QuantizedKVCache."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache import quantized as qcache
from graphc.runtime.kernels import quantized_attention as qa
from test_kv_quantized import DIMS, _oracle, reference_greedy_q

GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


def emulated_kernel(low_nibble_first: bool = True):
    """Stands in for the CUDA kernel: reads codes, scales and biases as its source indexes them."""

    def deq(codes, scales, biases, D, bits, gs):
        by = np.array(mx.view(codes, mx.uint8))
        j = np.arange(D)
        if bits == 8:
            q = by[..., j]
        else:
            shift = (j & 1) * 4 if low_nibble_first else (1 - (j & 1)) * 4
            q = (by[..., j >> 1] >> shift) & 0xF
        s, b = np.array(scales.astype(mx.float32)), np.array(biases.astype(mx.float32))
        return mx.array(q * s[..., j // gs] + b[..., j // gs])

    def kernel(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        q, kq, ks, kb, vq, vs, vb, start, end, scale = inputs
        t = dict(template)
        D, bits, gs = t["D"], t["BITS"], t["GS"]
        k, v = deq(kq, ks, kb, D, bits, gs), deq(vq, vs, vb, D, bits, gs)
        out = qa.float_reference(q.astype(mx.float32), k, v, start, end, scale.item())
        return [out.astype(output_dtypes[0])]

    return kernel


def test_the_layout_the_kernel_reads_passes_its_check(monkeypatch):
    att = qa.QuantizedAttention()
    att.kernels = dict.fromkeys(att.kernels, emulated_kernel())
    assert att._compare(0) is None and att.vec_ok is None  # both kinds matched
    assert att.pick(32, 8, 64) == "vec" and att.pick(16, 2, 128) == "grouped"  # 8 query heads a group: grouped
    misread = qa.QuantizedAttention()
    misread.kernels = dict.fromkeys(misread.kernels, emulated_kernel(low_nibble_first=False))
    why = misread._compare(0)
    assert why is not None and "bits=4" in why


def test_takes_and_refuses():
    assert qa.takes(32, 8, 64, 64, 8) and qa.takes(32, 8, 128, 128, 4)
    assert not qa.takes(32, 8, 64, 128, 8)  # group wider than the head
    assert not qa.takes(48, 4, 64, 64, 8)  # 12 query heads per KV head: past MAX_GROUP
    assert not qa.takes(32, 8, 48, 16, 8)  # head dim not a multiple of 32
    with pytest.raises(ValueError, match="does not take"):
        qa.KERNEL.attend(mx.zeros((1, 4, 1, 48)), (mx.zeros((1, 2, 4, 12), dtype=mx.uint32),) * 6,
                         mx.zeros((1,), dtype=mx.int32), mx.array([4], dtype=mx.int32), 0.1, 16, 8)


@pytest.fixture
def route_on_cpu(monkeypatch):
    """The kernel 'passed' its check and runs as its reference; returns (queries, first columns) per call."""
    calls = []

    def kernel(q, planes, start, end, scale, group_size, bits):
        calls.append((q.shape[2], [int(x) for x in start]))
        return qa.reference(q, planes, start, end, scale, group_size, bits)

    monkeypatch.setattr(qa, "check", lambda seed=0: None)
    monkeypatch.setattr(qa, "quantized_attention", kernel)
    return calls


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama", **DIMS)


@pytest.mark.parametrize("bits", [8, 4])
def test_greedy_through_the_kernel_equals_mlx_lm_quantized_cache(llama, route_on_cpu, bits):
    eng = Engine.load(llama, kv_bits=bits, prefill_chunk=32)
    assert isinstance(eng.compiled.binding.policies[0].reference_cache(), qcache.DequantizedKVCache)
    assert isinstance(eng.runner.new_caches()[0], qcache.KernelQuantizedKV)
    route_on_cpu.clear()
    prompts = [[5 + i for i in range(n)] for n in (5, 40, 17, 1, 23)]
    got = [r.token_ids for r in eng.generate(prompts, GREEDY)]
    assert got == [reference_greedy_q(eng.model, p, 16, bits) for p in prompts]
    # decode steps (and short chunks) in the kernel; chunks of 17-32 tokens dequantized into MLX's attention
    assert 1 in {n for n, _ in route_on_cpu} and max(n for n, _ in route_on_cpu) <= qcache.KERNEL_QUERIES
    assert any(any(s) for _, s in route_on_cpu)  # left-padded rows pass their first valid column


def test_speculative_verify_through_the_kernel_keeps_greedy_output(llama, route_on_cpu):
    eng = Engine.load(llama, kv_bits=8, prefill_chunk=16, spec_max_tokens=64)
    prompts = [[7 + 3 * i for i in range(n)] for n in (5, 40, 17)]
    refs = {tuple(p): reference_greedy_q(eng.model, p, 30, 8) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    route_on_cpu.clear()
    spec = SamplingParams(max_tokens=30, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
    assert [r.token_ids for r in eng.generate(prompts, spec)] == [refs[tuple(p)] for p in prompts]
    assert 5 in {n for n, _ in route_on_cpu}  # verify forwards: 4 drafts + 1 in the kernel


def test_the_dequantized_reference_is_mlx_lm_quantized_cache_to_rounding(llama):
    eng = Engine.load(llama)
    prompt = mx.array([3 + (i * 7) % 200 for i in range(30)])
    for bits in (8, 4):
        runs = []
        for make in (lambda: QuantizedKVCache(group_size=64, bits=bits), lambda: qcache.DequantizedKVCache(64, bits)):
            caches = [make() for _ in eng.model.layers]
            runs.append([(int(t), np.array(lp)) for t, lp in generate_step(prompt, eng.model, max_tokens=6,
                                                                            prompt_cache=caches)])
        assert [t for t, _ in runs[0]] == [t for t, _ in runs[1]]
        assert max(np.abs(a - b).max() for (_, a), (_, b) in zip(*runs)) < 1e-3


def test_the_kernel_is_probed_only_where_quantized_kv_is_asked_for(llama, tmp_path):
    from graphc.compiler.compile import declares_quantized
    from graphc.runtime.target import probe_target

    assert "quantized_attention" not in {n for n, _, _ in probe_target().kernels}
    assert ("quantized_attention", "not a CUDA device", "") in probe_target(quantized=True).kernels
    graph = tmp_path / "q.yaml"
    dense = Path(qcache.__file__).parents[2] / "graphs" / "dense.yaml"  # the package's own graphs/
    assert declares_quantized(None, {}) is False and declares_quantized(dense, {}) is False
    graph.write_text(dense.read_text().replace("policy: pool_backed", "policy: quantized"))
    assert "policy: quantized" in graph.read_text() and declares_quantized(graph, {}) is True
    assert declares_quantized(tmp_path / "missing.yaml", {}) is False  # compile_graph reports it


def test_the_target_decides_the_route_not_a_check_in_the_step(llama, route_on_cpu):
    """The caches take the kernel from the target's fact (bind's for_target), as the plan does: a
    target without the fact keeps mlx-lm's quantized SDPA even where the kernel's check would pass."""
    from graphc.compiler.compile import compile_graph
    from graphc.compiler.target import Target
    from graphc.runtime.target import probe_target

    eng = Engine.load(llama)
    on = compile_graph(None, eng.model, eng.config, kv_bits=8, target=probe_target(quantized=True))
    assert issubclass(on.binding.policies[0].cache_class, qcache.KernelQuantizedKV)
    off = compile_graph(None, eng.model, eng.config, kv_bits=8, target=Target(device="cpu"))
    assert off.binding.policies[0].kernel is False
    assert not issubclass(off.binding.policies[0].cache_class, qcache.KernelQuantizedKV)
    assert type(off.binding.policies[0].reference_cache()).__name__ == "QuantizedKVCache"


def test_a_stored_self_check_verdict_is_keyed_by_the_kernels_that_matched(llama):
    from graphc.compiler.selfcheck_cache import verdict_key

    eng = Engine.load(llama)
    keys = {verdict_key(eng.model, str(llama), eng.config, None, "auto", 8, None, kernels=k)
            for k in ((), ("quantized_attention",))}
    assert len(keys) == 2
