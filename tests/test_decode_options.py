"""Compiled decode as a declared option of the graph (`decode: {compile: true}`), shown by inspect."""

from __future__ import annotations

import re

import pytest

from graphc.compiler.compile import load_spec
from graphc.compiler.errors import GraphError
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.parse import GRAPHS_DIR
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.compiled_decode import CompiledDecode
from helpers import random_prompts, reference_greedy


def declared(tmp_path, options: str) -> str:
    """graphs/dense.yaml with its `decode:` section replaced by `options`."""
    text = re.sub(r"\ndecode:\n(?:[ #].*\n)+", f"\ndecode: {options}\n", (GRAPHS_DIR / "dense.yaml").read_text(), count=1)
    assert f"decode: {options}" in text
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return str(p)


def test_graph_declares_compile_and_inspect_shows_it(model_dir, tmp_path):
    d = model_dir("llama")
    eng = Engine.load(d, graph=declared(tmp_path, "{compile: true, fuse_projections: false}"))
    assert isinstance(eng.compiled.decode, CompiledDecode) and len(eng.compiled.decode.fused) == 0
    passes = dict(eng.compiled.plan("decode").passes)
    assert "mx.compile" in passes["compile"] and "fused" not in passes["compile"]
    assert "compile          mx.compile" in inspect_plan(eng.compiled, "decode", trace=False)
    prompts = random_prompts(3, eng.vocab_size, [4, 9, 6], seed=1)
    res = eng.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    assert [r.token_ids for r in res] == [reference_greedy(eng.model, p, 10) for p in prompts]
    assert eng.compiled.decode.compiled_steps > 0
    # An explicit Engine argument overrides the graph: no compile, no compile pass.
    off = Engine.load(d, graph=declared(tmp_path, "{compile: true}"), compile=False)
    assert not isinstance(off.compiled.decode, CompiledDecode)
    assert "compile" not in dict(off.compiled.plan("decode").passes)


def test_default_graph_with_compile_on_shows_the_pass(model_dir):
    eng = Engine.load(model_dir("llama"), compile=True)
    assert "fused q/k/v + gate/up in" in dict(eng.compiled.plan("decode").passes)["compile"]
    assert "compile" not in dict(eng.compiled.plan("prefill").passes)
    assert "compile: auto" not in dict(eng.compiled.plan("decode").passes)["compile"]


def test_compile_auto_says_which_batches_it_compiles(model_dir):
    eng = Engine.load(model_dir("llama"), compile="auto")
    assert "compile: auto" in dict(eng.compiled.plan("decode").passes)["compile"]
    assert eng.compiled.decode.max_batch is not None  # larger batches really run eager


@pytest.mark.parametrize("options, message", [
    ("{compile: yes please}", "decode option 'compile' must be true, false, auto or measured"),
    ("{compiled: true}", "unknown decode option 'compiled'"),
    ("[compile]", "`decode` must be a mapping"),
])
def test_bad_decode_options_are_graph_errors(tmp_path, options, message):
    with pytest.raises(GraphError, match=message):
        load_spec(declared(tmp_path, options))


def test_a_declared_compile_previews_the_fused_blocks_without_an_engine(model_dir, tmp_path):
    # compile_graph alone (graphc inspect without --compile) says what the adapter would fuse,
    # building no weights.
    from graphc.compiler.compile import compile_graph
    import mlx_lm
    import json
    from pathlib import Path

    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    compiled = compile_graph(declared(tmp_path, "{compile: true}"), model, json.loads((Path(d) / "config.json").read_text()))
    line = dict(compiled.plan("decode").passes)["compile"]
    assert f"fused q/k/v + gate/up in {len(model.layers)} of {len(model.layers)} blocks (LlamaAdapter.fused_decode" in line


def test_skinny_table_is_a_decode_option_not_an_environment_variable(tmp_path):
    with pytest.raises(GraphError, match="decode option 'skinny_table' must be a file path or null"):
        load_spec(declared(tmp_path, "{skinny_matmul: true, skinny_table: 3}"))
    spec = load_spec(declared(tmp_path, "{skinny_matmul: true, skinny_table: t.json}"))
    assert spec.decode_options["skinny_table"] == "t.json"
