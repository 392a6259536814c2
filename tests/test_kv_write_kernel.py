"""Compiled decode steps whose attention kernel also writes the step's K/V columns in place
(decode option `kv_write_kernel`, runtime/kernels/decode_attention.py `new=`), on the CPU.

The CUDA kernel is replaced by an emulation with its semantics: the new columns are written
into the cache buffers' memory (as the kernel does, unseen by MLX's graph), then attention
runs as the kernel's MLX reference. For the buffers to be concrete arrays, `mx.compile` is
switched off during these tests, so the compiled step's Python runs eagerly on the same
caches. What is tested is everything around the kernel: that the step keeps using the
buffers it wrote into (no scatter, no new arrays), across batch changes, left-padded rows,
speculative verify steps (several new columns, then a rollback) and prefix-cache captures —
greedy tokens stay mlx-lm's own. The kernel itself is checked on the device
(`write_check()`: output and buffers) and built for the H200 in tests/test_kernel_builds.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime import compiled_decode as cd
from graphc.runtime import compiled_decode_kv as cdkv
from graphc.runtime.kernels import decode_attention as da
from helpers import random_prompts, reference_greedy
from test_speculative import WIDE, _oracle

KERNEL_SHAPE = dict(head_dim=32)
PLAIN = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.fixture
def kernels(monkeypatch):
    """Both kernel variants 'pass' their checks and run emulated; yields {"attend": [L, ...],
    "write": [L, ...], "scatter": n} — the query lengths of each kind of call, and how many
    scatter writes ran."""
    seen = {"attend": [], "write": [], "scatter": 0}

    def kernel(q, k, v, start, end, scale, kind=None, config=None, new=None):
        L = q.shape[2]
        if new is not None:
            mx.eval(k, v, end, *new)
            e0 = end.item() - L
            for buf, x in zip((k, v), new):
                _raw(buf)[:, :, e0:e0 + L] = _bits(x)  # in place, as on the device
            seen["write"].append(L)
        else:
            seen["attend"].append(L)
        return da.reference(q, k, v, start, end, scale)

    original = cdkv.write_columns

    def scatter(buf, new, idx):
        seen["scatter"] += 1
        return original(buf, new, idx)

    monkeypatch.setattr(da, "check", lambda seed=0: None)
    monkeypatch.setattr(da, "write_check", lambda seed=0: None)
    monkeypatch.setattr(da, "ragged_attention", kernel)
    monkeypatch.setattr(cdkv, "write_columns", scatter)
    mx.disable_compile()
    try:
        yield seen
    finally:
        mx.enable_compile()


def _raw(a: mx.array) -> np.ndarray:
    """A writable numpy view of an evaluated array's memory (bf16 as its 16-bit patterns)."""
    mx.eval(a)
    if a.dtype == mx.bfloat16:
        return np.frombuffer(memoryview(a).cast("B"), dtype=np.uint16).reshape(a.shape)
    return np.asarray(memoryview(a))


def _contiguous(a: mx.array) -> bool:
    mx.eval(a)
    return memoryview(a).c_contiguous


def _bits(a: mx.array) -> np.ndarray:
    """An array's values as `_raw` holds them, from any layout (the writing kernels take strided
    views of the fused q/k/v rows)."""
    return _raw(mx.contiguous(a))


def test_compiled_steps_write_in_the_kernel_and_keep_greedy_tokens(model_dir, kernels):
    """Rows of different lengths (left-padded) that finish at different steps (the batch is
    filtered while the buffers are written in place): mlx-lm's greedy tokens, no scatter."""
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16, compile=True)
    assert eng.compiled.decode.write
    prompts = random_prompts(4, eng.vocab_size, [5, 33, 12, 20], seed=3)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (16, 7, 11, 16)]
    out = eng.generate(prompts, params)
    assert [r.token_ids for r in out] == [reference_greedy(eng.model, p, sp.max_tokens)
                                          for p, sp in zip(prompts, params)]
    assert eng.compiled.decode.compiled_steps > 0
    assert kernels["write"] and set(kernels["write"]) == {1} and kernels["scatter"] == 0


def test_the_buffers_stay_the_same_arrays_across_steps(model_dir, kernels):
    """What makes the write in place: the step hands back the very buffers it was given."""
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16, compile=True)
    seen = []
    forward = cd.CompiledDecode.forward

    def spy(self, inputs):
        before = [c.keys for c in inputs.caches]
        ctx = forward(self, inputs)
        seen.append(all(c.keys is b or _same_buffer(c.keys, b) for c, b in zip(inputs.caches, before)))
        return ctx

    cd.CompiledDecode.forward = spy
    try:
        eng.generate(random_prompts(2, eng.vocab_size, [9, 9], seed=1), PLAIN)
    finally:
        cd.CompiledDecode.forward = forward
    assert seen and all(seen[1:])  # the first step may re-bucket the capacity (one copy)


def _same_buffer(a, b) -> bool:
    mx.eval(a, b)
    return np.asarray(memoryview(a)).ctypes.data == np.asarray(memoryview(b)).ctypes.data


def test_verify_steps_write_their_columns_in_the_kernel(model_dir, kernels):
    """A speculative verify writes L = k + 1 columns in place; rejected ones are rolled back by
    moving the write column, and the next step overwrites them."""
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16, spec_max_tokens=WIDE, compile=True)
    prompts = random_prompts(3, eng.vocab_size, [5, 40, 17], seed=5)
    refs = {tuple(p): reference_greedy(eng.model, p, 30) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    spec = SamplingParams(max_tokens=30, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
    out = eng.generate(prompts, spec)
    assert [r.token_ids for r in out] == [refs[tuple(p)] for p in prompts]
    assert eng.compiled.decode.verify_steps > 0 and any(n > 1 for n in kernels["write"])


def test_prefix_hits_read_columns_written_in_place(model_dir, kernels):
    """Finished rows go to the prefix pool from the buffers the kernel wrote; a later request that
    hits that prefix decodes mlx-lm's tokens."""
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16, compile=True)
    base = random_prompts(1, eng.vocab_size, [24], seed=8)[0]
    first = eng.generate([base], PLAIN)[0].token_ids
    longer = base + first[:12]  # its prefix includes columns decoded (and written in place) above
    out = eng.generate([longer], PLAIN)[0].token_ids
    assert out == reference_greedy(eng.model, longer, 16)
    assert eng.prefix is not None and eng.prefix.stats()["hit_tokens"] > len(base)


def test_the_option_and_the_check_switch_it_off(model_dir, kernels, monkeypatch):
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), compile=True, decode_options={"kv_write_kernel": False})
    d = eng.compiled.decode
    assert not d.write and d.write_note == "off (decode: {kv_write_kernel: false})"
    prompts = random_prompts(2, eng.vocab_size, [6, 14], seed=2)
    assert [r.token_ids for r in eng.generate(prompts, PLAIN)] == [reference_greedy(eng.model, p, 16) for p in prompts]
    assert kernels["write"] == [] and kernels["scatter"] > 0
    line = dict(eng.compiled.plan("decode").passes)["compile"]
    assert "K/V write: off;" in line

    monkeypatch.setattr(da, "write_check", lambda seed=0: "writing vec kernel left the cache buffers wrong")
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), compile=True)
    assert not eng.compiled.decode.write
    assert "K/V write: writing vec kernel left the cache buffers wrong" in dict(eng.compiled.plan("decode").passes)["compile"]


def test_write_check_needs_the_attention_kernel(monkeypatch):
    """Without a passing attention check the writing variant is never compared or used."""
    att = da.DecodeAttention()
    monkeypatch.setattr(att, "check", lambda seed=0: "not a CUDA device")
    assert att._compare_write(0) == "the attention kernel is off (not a CUDA device)"


def test_fused_rows_views_hold_the_same_values_as_strided_views():
    """write_check's second layout: q, new keys and values as views of one fused q/k/v row per
    token (compiler/fused_block.py's split), equal to the arrays they came from."""
    q, nk, nv = (mx.random.normal(s, key=mx.random.key(i)).astype(mx.bfloat16)
                 for i, s in enumerate([(3, 8, 2, 64), (3, 2, 2, 64), (3, 2, 2, 64)]))
    views = da.fused_rows_views(q, nk, nv)
    assert all(mx.array_equal(a, b).item() for a, b in zip(views, (q, nk, nv)))
    assert not any(_contiguous(x) for x in views)


@pytest.mark.parametrize("fault", [None, "no write", "stray write", "old columns"])
def test_write_check_catches_a_kernel_that_does_not_write_exactly(monkeypatch, fault):
    """write_check's comparison (`_compare_write_kind`, what the device runs before any use) on an
    emulated kernel: a correct one passes for every kind; one whose output is right but which
    skips the write or also writes a column it should not, or which writes but attends over the
    old columns, is caught."""

    def attention(q, k, v, start, end, scale):
        out = da.reference(q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32), start, end, scale)
        mx.eval(out)  # before any write below lands in k's memory
        return out.astype(q.dtype)

    layouts = set()

    def kernel(q, k, v, start, end, scale, kind=None, config=None, new=None):
        L, C = q.shape[2], k.shape[2]
        e0 = end.item() - L
        layouts.add(tuple(_contiguous(x) for x in (q, *new)))
        if fault == "old columns":
            out = attention(q, k, v, start, end, scale)
        else:  # the right output, from copies with the new columns
            out = attention(q, mx.slice_update(k, new[0], mx.array([e0]), axes=(2,)),
                            mx.slice_update(v, new[1], mx.array([e0]), axes=(2,)), start, end, scale)
        if fault != "no write":
            for buf, x in zip((k, v), new):
                _raw(buf)[:, :, e0:e0 + L] = _bits(x)
        if fault == "stray write":
            _raw(v)[:, :, (e0 + L) % C] = _bits(new[1])[:, :, 0]
        return out

    att = da.DecodeAttention()
    monkeypatch.setattr(att, "attend", kernel)
    for kind in ("per_head", "grouped", "vec"):
        why = att._compare_write_kind(0, kind)
        if fault is None:
            assert why is None, why
            # compared on row-contiguous inputs and on the strided views of one fused q/k/v row
            # that a compiled step hands it (read without a copy on the device)
            assert layouts == {(True, True, True), (False, False, False)}, layouts
        elif fault == "old columns":
            assert why.startswith(f"writing {kind} kernel") and "differs from masked attention" in why
        else:
            assert why.startswith(f"writing {kind} kernel") and "left the cache buffers wrong" in why
