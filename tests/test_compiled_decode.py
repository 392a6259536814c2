"""Compiled decode (`Engine(..., compile=True)`) is exact: greedy tokens identical to uncompiled.

The compiled path attends over a fixed-capacity KV with a length mask and writes at an
array column; masked columns get zero weight, so tokens must not change — through
continuous batching (rows joining and leaving), capacity growth past a bucket, chained
and unchained decode. It also matches mlx-lm's own reference loop.
"""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.compiled_decode import CompiledDecode
from graphc.runtime.compiled_decode_kv import bucket
from helpers import random_prompts, reference_greedy


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama")


@pytest.mark.parametrize("chain", [True, False])
def test_compiled_greedy_tokens_identical(llama, chain):
    plain = Engine.load(llama, prefill_chunk=32, max_batch=3, chain=chain)
    comp = Engine.load(llama, prefill_chunk=32, max_batch=3, chain=chain, compile=True)
    assert isinstance(comp.compiled.decode, CompiledDecode)
    # max_batch 3 < 6 prompts: rows join and leave mid-decode; 300 tokens crosses buckets 64..512.
    prompts = random_prompts(6, plain.vocab_size, [5, 40, 17, 1, 33, 9], seed=3)
    lens = [300, 20, 70, 5, 90, 40]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
    want = [r.token_ids for r in plain.generate(prompts, params)]
    got = [r.token_ids for r in comp.generate(prompts, params)]
    assert got == want
    assert [len(t) for t in got] == lens
    d = comp.compiled.decode
    assert d.compiled_steps > 0 and d.fallback_steps == 0
    assert len(d.fused) == len(comp.model.layers)  # llama blocks run with fused projections


def test_compiled_matches_mlx_lm_reference(llama):
    eng = Engine.load(llama, compile=True)
    prompts = random_prompts(3, eng.vocab_size, [7, 30, 2], seed=8)
    res = eng.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    for p, r in zip(prompts, res):
        assert r.token_ids == reference_greedy(eng.model, p, 40)


def test_capacity_buckets():
    assert [bucket(n) for n in (1, 64, 65, 256, 257, 700)] == [64, 64, 128, 256, 512, 768]


def test_auto_compiles_small_batches_only_and_stays_exact(llama, monkeypatch):
    # compile="auto": batches above AUTO_MAX_BATCH run the eager step on the same caches. With
    # the limit at 2 and max_batch 3, the batch crosses it both ways as rows join and leave.
    from graphc.runtime import compiled_decode

    monkeypatch.setattr(compiled_decode, "AUTO_MAX_BATCH", 2)
    plain = Engine.load(llama, prefill_chunk=32, max_batch=3)
    auto = Engine.load(llama, prefill_chunk=32, max_batch=3, compile="auto")
    prompts = random_prompts(6, plain.vocab_size, [5, 40, 17, 1, 33, 9], seed=4)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in [120, 20, 70, 5, 90, 40]]
    want = [r.token_ids for r in plain.generate(prompts, params)]
    assert [r.token_ids for r in auto.generate(prompts, params)] == want
    d = auto.compiled.decode
    assert d.max_batch == 2 and d.compiled_steps > 0 and d.fallback_steps > 0


@pytest.mark.parametrize("speculative", [False, True])
def test_auto_runs_long_contexts_eager_and_stays_exact(llama, monkeypatch, speculative):
    # compile="auto" also leaves a step eager once rows x KV capacity passes AUTO_MAX_KV (on CUDA
    # the compiled step's masked attention reads long contexts slower than the eager one). With
    # the bound at 3 x 128 columns, 3 rows decode compiled up to 128 columns and eager past it;
    # as rows leave, the remaining ones fit again. Verify steps follow the same bound.
    from graphc.runtime import compiled_decode

    monkeypatch.setattr(compiled_decode, "AUTO_MAX_KV", 3 * 128)
    auto = Engine.load(llama, prefill_chunk=32, max_batch=3, compile="auto")
    prompts = random_prompts(4, auto.vocab_size, [5, 40, 17, 9], seed=6)
    lens = [230, 150, 30, 60]
    want = [reference_greedy(auto.model, p, n) for p, n in zip(prompts, lens)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
    if speculative:
        from test_speculative import _oracle

        auto.speculator.drafter = _oracle({tuple(p): w for p, w in zip(prompts, want)}, auto.vocab_size)
        params = [SamplingParams(max_tokens=n, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
                  for n in lens]
    assert [r.token_ids for r in auto.generate(prompts, params)] == want
    d = auto.compiled.decode
    assert d.max_kv == 3 * 128
    if speculative:  # some verify forwards compiled, the long ones eager
        assert auto.speculator.stats["spec_steps"] > d.verify_steps > 0
    else:
        assert d.compiled_steps > 0 and d.fallback_steps > 0


def test_the_kv_bound_counts_rows_times_the_capacity_bucket(llama):
    eng = Engine.load(llama, compile="auto")
    d = eng.compiled.decode

    class _C:  # what `_within` reads of a cache: the written columns
        def __init__(self, idx):
            self.idx = idx

    d.max_batch, d.max_kv = 64, 4 * 256
    assert d._within(4, [_C(255)], 1)  # 256 columns: bucket 256, 4 x 256 fits
    assert not d._within(4, [_C(256)], 1)  # 257: bucket 512
    assert d._within(2, [_C(500)], 9)  # 509: bucket 512, 2 rows
    assert not d._within(65, [_C(1)], 1)  # over max_batch
    d.max_kv = None
    assert d._within(64, [_C(10_000)], 1)


def _measured_engine(llama, cost: dict, **kw):
    """compile="measured" with a fake clock: a decode cycle costs cost[arm] seconds (a test cannot
    rely on this machine's timings)."""
    eng = Engine.load(llama, prefill_chunk=32, compile="measured", **kw)
    gate = eng.compiled.decode.gate
    now = [0.0]
    gate.clock = lambda: now[0]
    decode = eng.runner.decode

    def timed():
        out = decode()
        now[0] += cost[gate._cur[0]] if gate._cur else 1.0
        return out

    eng.runner.decode = timed
    return eng


@pytest.mark.parametrize("faster", ["compiled", "eager"])
def test_measured_compile_keeps_the_faster_step_per_batch_size_and_stays_exact(llama, faster):
    slower = "eager" if faster == "compiled" else "compiled"
    eng = _measured_engine(llama, {faster: 1.0, slower: 2.0}, max_batch=2)
    prompts = random_prompts(3, eng.vocab_size, [5, 40, 17], seed=4)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in [150, 110, 60]]
    res = eng.generate(prompts, params)
    for p, r, n in zip(prompts, res, [150, 110, 60]):
        assert r.token_ids == reference_greedy(eng.model, p, n)
    d = eng.compiled.decode
    rates = d.gate.rates()
    assert all(r[faster][0] > r[slower][0] for r in rates.values() if slower in r) and rates
    runs = {"compiled": d.compiled_steps, "eager": d.fallback_steps}
    assert runs[faster] > 3 * runs[slower] > 0  # the slower one ran only while exploring


def test_measured_compile_is_a_decode_option(llama):
    from graphc.compiler.decode_options import problems

    assert problems({"compile": "measured"}) == [] and problems({"compile": "sometimes"})
    eng = Engine.load(llama, compile="measured")
    line = dict(eng.compiled.decode.plan.passes)["compile"]
    assert "measured" in line


def test_compile_rejects_an_unknown_mode(llama):
    with pytest.raises(ValueError, match="'auto'"):
        Engine.load(llama, compile="fast")


def test_compile_leaves_the_model_untouched(llama):
    """The fused block's weights are graphc's own arrays: the model's parameters (the same array
    objects, the same values, the same tree) are exactly what was loaded."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten

    model, tokenizer = mlx_lm.load(str(llama))
    before = tree_flatten(model.parameters())
    copies = [(k, mx.array(v)) for k, v in before]
    import json
    from pathlib import Path

    eng = Engine(model, tokenizer, json.loads((Path(llama) / "config.json").read_text()), compile=True)
    assert len(eng.compiled.decode.fused) == len(model.layers)
    eng.generate(random_prompts(2, eng.vocab_size, [5, 9], seed=2), SamplingParams(max_tokens=8, ignore_eos=True))
    after = tree_flatten(model.parameters())
    assert [k for k, _ in after] == [k for k, _ in before]
    assert all(a is b for (_, a), (_, b) in zip(after, before))
    assert all(mx.array_equal(a, c).item() for (_, a), (_, c) in zip(after, copies))


def test_an_architecture_without_a_fused_block_says_so(model_dir):
    # qwen3's adapter supplies no fused block: compile still runs its layers under mx.compile,
    # and the plan's compile pass (graphc inspect) says why nothing is fused.
    eng = Engine.load(model_dir("qwen3"), compile=True)
    d = eng.compiled.decode
    assert isinstance(d, CompiledDecode) and len(d.fused) == 0
    line = dict(eng.compiled.plan("decode").passes)["compile"]
    assert "no fused blocks: ArchAdapter supplies no fused decode block for 'qwen3'" in line
    prompts = random_prompts(2, eng.vocab_size, [6, 3], seed=5)
    got = [r.token_ids for r in eng.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))]
    assert got == [reference_greedy(eng.model, p, 12) for p in prompts]
    assert d.compiled_steps > 0


def test_quantized_llama_fuses_its_quantized_projections(model_dir):
    """Quantized q/k/v and gate/up (same group size, bits and mode) are stacked into one quantized
    matmul each: the same per-row dot products, so the tokens are mlx-lm's own."""
    import json

    import mlx.nn as nn
    import mlx_lm

    src = model_dir("llama")
    model, tokenizer = mlx_lm.load(str(src))
    nn.quantize(model, group_size=32, bits=4)
    eng = Engine(model, tokenizer, json.loads((src / "config.json").read_text()), compile=True)
    fused = eng.compiled.decode.fused
    assert len(fused) == len(model.layers) and fused.nbytes > 0
    prompts = random_prompts(3, eng.vocab_size, [9, 30, 4], seed=2)
    got = [r.token_ids for r in eng.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))]
    assert got == [reference_greedy(model, p, 16) for p in prompts]
    assert eng.compiled.decode.compiled_steps > 0
    # Mixed formats are not stacked (a layer whose gate projection says 8 bits).
    from graphc.compiler.fused_block import llama_unfusable

    layer = model.layers[0]
    layer.mlp.gate_proj.bits = 8
    assert llama_unfusable(layer) == "projections quantized with different group sizes, bits or modes"


def test_write_columns_scatter_equals_the_slice_update(monkeypatch):
    """The CUDA write (a scatter at the array column) puts the same values where the slice update does."""
    import mlx.core as mx

    from graphc.runtime import compiled_decode_kv as cd

    buf = mx.random.normal((3, 2, 16, 8), key=mx.random.key(0))
    for L in (1, 5):
        new = mx.random.normal((3, 2, L, 8), key=mx.random.key(L))
        idx = mx.array(6, dtype=mx.int32)
        monkeypatch.setattr(cd, "_scatter_writes", lambda: False)
        want = cd.write_columns(buf, new, idx)
        monkeypatch.setattr(cd, "_scatter_writes", lambda: True)
        got = mx.compile(cd.write_columns)(buf, new, idx)
        assert mx.array_equal(got, want)
        assert mx.array_equal(got[:, :, 6:6 + L], new) and mx.array_equal(got[:, :, :6], buf[:, :, :6])


@pytest.mark.parametrize("speculative", [False, True])
def test_compiled_steps_with_scatter_writes_stay_exact(llama, monkeypatch, speculative):
    """The engine with the CUDA KV write forced on: decode through joins, leaves and capacity
    growth, and compiled verify steps writing L columns, keep mlx-lm's own greedy tokens."""
    from graphc.runtime import compiled_decode_kv as cd

    monkeypatch.setattr(cd, "_scatter_writes", lambda: True)
    comp = Engine.load(llama, prefill_chunk=32, max_batch=3, compile=True)
    prompts = random_prompts(5, comp.vocab_size, [5, 40, 17, 1, 33], seed=4)
    lens = [150, 20, 70, 5, 40]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
    want = [reference_greedy(comp.model, p, n) for p, n in zip(prompts, lens)]
    if speculative:
        from test_speculative import _oracle

        comp.speculator.drafter = _oracle({tuple(p): w for p, w in zip(prompts, want)}, comp.vocab_size)
        params = [SamplingParams(max_tokens=n, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
                  for n in lens]
    got = [r.token_ids for r in comp.generate(prompts, params)]
    assert got == want
    d = comp.compiled.decode
    assert d.compiled_steps > 0
    if speculative:
        assert d.verify_steps > 0


@pytest.mark.parametrize("flag,want", [("graph", False), ("off", False), ("on", True), ("auto", "auto"),
                                       ("measured", "measured")])
def test_serve_compile_flag_reaches_the_engine(llama, flag, want):
    """`graphc serve --compile auto`: the flag's word becomes the Engine's compile= (default: the graph's)."""
    import argparse

    from graphc.runtime.server.cli import add_parser, config_from_args
    from graphc.runtime.server.state import load_engine

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    eng = load_engine(config_from_args(parser.parse_args(["serve", "--model", str(llama), "--compile", flag])))
    assert eng.decode_options["compile"] == want
    assert isinstance(eng.compiled.decode, CompiledDecode) == bool(want)
    if want == "auto":
        assert eng.compiled.decode.max_kv is not None


def test_generate_compile_flag_runs_compiled(llama, capsys, monkeypatch):
    """`graphc generate --compile on` decodes through the compiled step, with the eager text."""
    from graphc.cli.main import main

    engines = []
    load = Engine.load.__func__
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: engines.append(load(cls, *a, **k))
                                                    or engines[-1]))
    assert main(["generate", "hi", "--model", str(llama), "--max-tokens", "3", "--compile", "on"]) == 0
    compiled = capsys.readouterr().out
    assert main(["generate", "hi", "--model", str(llama), "--max-tokens", "3"]) == 0
    assert capsys.readouterr().out == compiled  # greedy: compiled and eager give the same text
    assert engines[0].compiled.decode.compiled_steps > 0
    assert not isinstance(engines[1].compiled.decode, CompiledDecode)
