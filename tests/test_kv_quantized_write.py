"""Quantized KV's new columns written by graphc's quantized write kernel (runtime/kernels/quantized_write.py,
WritingQuantizedKV in runtime/cache/quantized.py), on the CPU: the CUDA kernel cannot run here (its
CUDA source runs emulated in tests/test_quantized_write_emulated.py), so

- its check's comparison (`_compare`) is run with the kernel stood in by its reference (mx.quantize
  written at the columns, in place): it must pass, and must fail for a write one column off, a wrong
  end, or a write that touches another column;
- the route is forced on with both kernels stood in by their references: what is tested is
  everything around the write — which steps take it, the columns and the grown buffers it writes,
  the end it hands the attention, a verify step's columns and their rollback — and that greedy
  tokens stay mlx-lm's own on its QuantizedKVCache; and which target facts turn it on or off."""

from __future__ import annotations

import logging

import mlx.core as mx
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache import quantized as qcache
from graphc.runtime.kernels import quantized_attention as qa
from graphc.runtime.kernels import quantized_write as qw
from test_kv_quantized import DIMS, _oracle, reference_greedy_q

GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


def stand_in(shift: int = 0, end_delta: int = 0, clobber: bool = False):
    """Stands in for the CUDA kernel (its `Kernel` call): the reference, optionally wrong."""

    def kernel(*, inputs, template, **_):
        nk, nv, *planes, col = inputs
        t = dict(template)
        end = qw.reference(nk, nv, planes, int(col.item()) + shift, t["GS"], t["BITS"])
        if clobber:
            planes[1][..., :1, :] = planes[1][..., :1, :] + 1
        return [end - shift + end_delta]  # a shifted write still reports the right end

    return kernel


def test_the_check_passes_the_reference_and_fails_a_wrong_write():
    good = qw.QuantizedWrite()
    good.kernel = stand_in()
    assert good._compare(0) is None
    for wrong, says in ((stand_in(shift=1), "differ from mx.quantize"), (stand_in(end_delta=1), "returned end"),
                        (stand_in(clobber=True), "changed outside")):
        bad = qw.QuantizedWrite()
        bad.kernel = wrong
        why = bad._compare(0)
        assert why is not None and says in why, why


def test_takes_and_refuses():
    assert qw.takes(64, 64, 8) and qw.takes(128, 128, 4) and qw.takes(32, 32, 8) and qw.takes(256, 32, 4)
    assert not qw.takes(64, 128, 8)  # a group wider than the head
    assert not qw.takes(512, 64, 8)  # 64 lanes a row: past a warp
    assert not qw.takes(64, 64, 3)
    z = mx.zeros((1, 2, 1, 64))
    with pytest.raises(ValueError, match="is not"):  # scales of another group size
        qw.KERNEL.write(z, z, (mx.zeros((1, 2, 4, 16), mx.uint32), mx.zeros((1, 2, 4, 2)), mx.zeros((1, 2, 4, 2)),
                               mx.zeros((1, 2, 4, 16), mx.uint32), mx.zeros((1, 2, 4, 2)), mx.zeros((1, 2, 4, 2))),
                        mx.array([0], mx.int32), 64, 8)


@pytest.fixture
def route_on_cpu(monkeypatch):
    """Both kernels 'passed' their checks and run as their references; returns the write's new columns
    and the attention's end per call."""
    calls = {"write": [], "attend": []}

    def write(nk, nv, planes, col, group_size, bits):
        calls["write"].append(nk.shape[2])
        return qw.reference(nk, nv, planes, int(col.item()), group_size, bits)

    def attend(q, planes, start, end, scale, group_size, bits):
        calls["attend"].append(int(end.item()))
        return qa.reference(q, planes, start, end, scale, group_size, bits)

    monkeypatch.setattr(qa, "check", lambda seed=0: None)
    monkeypatch.setattr(qw, "check", lambda seed=0: None)
    monkeypatch.setattr(qa, "quantized_attention", attend)
    monkeypatch.setattr(qw, "quantized_write", write)
    return calls


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama", **DIMS)


@pytest.mark.parametrize("bits", [8, 4])
def test_greedy_through_the_write_equals_mlx_lm_quantized_cache(llama, route_on_cpu, bits):
    eng = Engine.load(llama, kv_bits=bits, prefill_chunk=32)
    assert isinstance(eng.runner.new_caches()[0], qcache.WritingQuantizedKV)
    route_on_cpu["write"].clear()
    prompts = [[5 + i for i in range(n)] for n in (5, 55, 17, 1, 23)]
    got = [r.token_ids for r in eng.generate(prompts, GREEDY)]
    assert got == [reference_greedy_q(eng.model, p, 16, bits) for p in prompts]
    # decode steps (and chunks of up to KERNEL_QUERIES tokens) write through it; 16 steps past a 55-token
    # prompts cross the 64-column capacity, so it also writes into grown buffers
    assert 1 in route_on_cpu["write"] and max(route_on_cpu["write"]) <= qcache.KERNEL_QUERIES
    assert max(route_on_cpu["attend"]) > 64


def test_speculative_verify_through_the_write_keeps_greedy_output(llama, route_on_cpu):
    eng = Engine.load(llama, kv_bits=8, prefill_chunk=16, spec_max_tokens=64)
    prompts = [[7 + 3 * i for i in range(n)] for n in (5, 40, 17)]
    refs = {tuple(p): reference_greedy_q(eng.model, p, 30, 8) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    route_on_cpu["write"].clear()
    spec = SamplingParams(max_tokens=30, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
    assert [r.token_ids for r in eng.generate(prompts, spec)] == [refs[tuple(p)] for p in prompts]
    assert 5 in route_on_cpu["write"]  # verify forwards: 4 drafts + 1 written together


def test_the_write_serves_only_where_its_check_and_the_attention_kernel_passed(llama, monkeypatch, caplog):
    """The target's facts decide (bind's for_target), as the plan says: a failed write check keeps
    today's path (mx.quantize and slice writes, then the attention kernel) and says why in the log."""
    from graphc.compiler.compile import compile_graph
    from graphc.compiler.target import Target
    from graphc.runtime.target import probe_target

    eng = Engine.load(llama)

    def plan_for(write_why):
        target = Target(device="cuda", kernels=(("quantized_attention", None, ""), ("quantized_write", write_why, "")))
        return compile_graph(None, eng.model, eng.config, kv_bits=8, target=target)

    on = plan_for(None)
    assert on.binding.policies[0].write and issubclass(on.binding.policies[0].cache_class, qcache.WritingQuantizedKV)
    assert "quantized write kernel" in dict(on.decode.plan.passes)["quantized KV attention"]
    qcache._TOLD.clear()
    with caplog.at_level(logging.INFO, logger="graphc.load"):
        off = plan_for("quantized KV write: key codes differ from mx.quantize's")
    policy = off.binding.policies[0]
    assert policy.kernel and not policy.write
    assert policy.cache_class.__mro__[1] is qcache.KernelQuantizedKV
    assert "key codes differ" in caplog.text and "write kernel is off" in caplog.text
    assert "write kernel off: quantized KV write" in dict(off.decode.plan.passes)["quantized KV attention"]
    # probed: the write's check runs only after the attention kernel's passed
    monkeypatch.setattr(qa, "check", lambda seed=0: "no")
    monkeypatch.setattr(qw, "check", lambda seed=0: None)
    assert probe_target(quantized=True).why_not("quantized_write") == "the quantized attention kernel is off (no)"
    monkeypatch.setattr(qa, "check", lambda seed=0: None)
    assert probe_target(quantized=True).why_not("quantized_write") is None
    assert "quantized_write" not in {n for n, _, _ in probe_target().kernels}


def test_the_cache_writes_columns_and_grows_as_append_does(route_on_cpu):
    """The write at idx of a cache at full capacity: grown first (the planes kept), the new codes at
    idx, idx advanced, the end handed on; the same planes as QuantizedKV's own append."""
    cls = qcache.WritingQuantizedKV.with_format(8, 64)
    ref_cls = qcache.QuantizedKV.with_format(8, 64)
    a, b = cls(2, left_pad=[0, 3]), ref_cls(2, left_pad=[0, 3])
    key = mx.random.key(3)
    for step in range(12):  # prefill of 60 (the plain append), then 11 one-column writes, past 64 columns
        ks = mx.random.split(key, 3)
        key = ks[2]
        n = 60 if step == 0 else 1
        k, v = (mx.random.normal((2, 2, n, 64), key=x).astype(mx.bfloat16) for x in ks[:2])
        b.update_and_fetch(k, v)
        if n > qcache.KERNEL_QUERIES:
            a.update_and_fetch(k, v)
        else:
            assert int(a.write_new(k, v).item()) == a.idx
    assert a.idx == b.idx == 71 and a.keys.shape[2] == b.keys.shape[2] == 128
    for p in qcache.QuantizedKV.PLANES:
        assert mx.array_equal(getattr(a, p)[..., :71, :], getattr(b, p)[..., :71, :]).item(), p
