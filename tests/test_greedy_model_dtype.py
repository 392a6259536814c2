"""A greedy head, and the fused selection of greedy and top-k rows, read the logits in the model's
own dtype: the `logits` node's float32 cast is exact, so the argmax of the cast is the argmax of
its source and the fused selection ranks and scales each logit's float32 value either way; the
cast is never computed (in the compiled step too, whose traced outputs leave it out and rebuild
it lazily). The tokens stay mlx-lm's and the seeded draws the same; edited rows, logprobs and
the other sampling paths still read the float32 logits."""

from __future__ import annotations

import mlx.core as mx
import pytest

from graphc.runtime import Engine, SamplingParams
from helpers import random_prompts, reference_greedy


@pytest.fixture(scope="module")
def bf16_llama(model_dir):
    return model_dir("llama", dtype="bfloat16")


@pytest.fixture(autouse=True)
def as_stored(monkeypatch):
    """The model's own bfloat16 is what these tests are about, as on a GPU: on the CPU Engine.load
    would run it in float32 (runtime/cpu_weights.py), so every load here keeps it as stored."""
    real = Engine.load.__func__
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: real(cls, *a, cpu_weights="stored", **kw)))


def _argmax_dtypes(monkeypatch):
    seen = []
    real = mx.argmax

    def argmax(a, *args, **kw):
        seen.append((a.dtype, a.shape[-1]))
        return real(a, *args, **kw)

    monkeypatch.setattr(mx, "argmax", argmax)
    return seen


@pytest.mark.parametrize("compile_", [False, True])
def test_greedy_reads_the_model_dtype_logits_and_matches_mlx_lm(bf16_llama, monkeypatch, compile_):
    eng = Engine.load(bf16_llama, compile=compile_)
    returned = []
    if compile_:  # what the compiled forward returns (it computes every output it returns)
        d = eng.compiled.decode
        fn = d._fn

        def spy(*a):
            out = fn(*a)
            returned.append(set(out[0]))
            return out

        d._fn = spy
    prompts = random_prompts(3, eng.vocab_size, [7, 30, 2], seed=5)
    want = [reference_greedy(eng.model, p, 24) for p in prompts]
    seen = _argmax_dtypes(monkeypatch)
    got = [r.token_ids for r in eng.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))]
    assert got == want
    vocab_argmaxes = [d for d, n in seen if n == eng.vocab_size]
    assert vocab_argmaxes and all(d == mx.bfloat16 for d in vocab_argmaxes)  # never the float32 cast
    if compile_:
        assert eng.compiled.decode.compiled_steps > 0 and returned
        node = eng.compiled.decode.logits_node
        assert all((node, "model dtype") in keys and node not in keys for keys in returned)


def test_edited_or_sampled_rows_still_read_float32(bf16_llama, monkeypatch):
    eng = Engine.load(bf16_llama)
    prompts = random_prompts(2, eng.vocab_size, [9, 4], seed=6)
    seen = _argmax_dtypes(monkeypatch)
    banned = SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={5: -100.0})  # greedy, edited
    eng.generate(prompts, banned)
    assert any(d == mx.float32 for d, n in seen if n == eng.vocab_size)
    assert not any(d == mx.bfloat16 for d, n in seen if n == eng.vocab_size)
    # sampled rows: the same tokens compiled or not
    params = SamplingParams(max_tokens=12, temperature=0.9, top_k=30, seed=4, ignore_eos=True)
    comp = Engine.load(bf16_llama, compile=True)
    assert [r.token_ids for r in comp.generate(prompts, params)] == [r.token_ids for r in eng.generate(prompts, params)]


def test_fused_sampled_rows_read_the_model_dtype_and_draw_the_same_tokens(bf16_llama, monkeypatch):
    """Greedy and top-k rows (the fused selection) rank and scale each logit's float32 value, so
    they draw the same seeded tokens from the model-dtype logits as from their float32 cast."""
    from graphc.compiler.ops import head
    from graphc.runtime.sampling import fused

    prompts = random_prompts(4, 512, [9, 4, 13, 6], seed=7)
    params = [SamplingParams(max_tokens=14, temperature=0.8, top_p=0.9, top_k=40, seed=11 + i, ignore_eos=True)
              for i in range(3)] + [SamplingParams(max_tokens=14, ignore_eos=True)]
    seen = []
    real = fused.fused_select

    def spy(logits, *a, **k):
        seen.append(logits.dtype)
        return real(logits, *a, **k)

    monkeypatch.setattr(fused, "fused_select", spy)
    for compile_ in (False, True):
        seen.clear()
        got = [r.token_ids for r in Engine.load(bf16_llama, compile=compile_).generate(prompts, params)]
        assert seen and set(seen) == {mx.bfloat16}
        with monkeypatch.context() as m:  # the float32 cast, as before
            m.setattr(head, "_unedited_source", lambda ctx, x: x)
            seen.clear()
            want = [r.token_ids for r in Engine.load(bf16_llama, compile=compile_).generate(prompts, params)]
            assert set(seen) == {mx.float32}
        assert got == want
