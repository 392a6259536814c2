"""The decoder's layer groups (compiler/layer_groups.py) and the shipped graphs' `decode:` sections.

Graphs differ where models differ: each shipped graph's attention node declares the layer
groups it serves and the ones it requires; validation checks them against `cache:`, binding
against the model, and inspect prints the model's layers group by group and where every decode
option came from.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import mlx_lm
import pytest

from graphc.compiler.bind import _graph_for_kinds
from graphc.compiler.compile import compile_graph, load_spec
from graphc.compiler.errors import GraphError
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.layer_groups import LAYER_TYPES, decoder_node, groups_of
from graphc.compiler.parse import GRAPHS_DIR, parse_collect
from graphc.compiler.plan import Plan
from graphc.compiler.validate import validate
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.compiled_decode import CompiledDecode
from helpers import random_prompts

GENERATION = ("dense", "dense_noprefix", "dense_paged", "sliding", "hybrid")
SHIPPED = sorted(p.stem for p in GRAPHS_DIR.glob("*.yaml"))


def _load(model_dir, arch, **sizes):
    d = model_dir(arch, **sizes)
    model, _ = mlx_lm.load(str(d))
    return model, json.loads((Path(d) / "config.json").read_text())


def _declaration(name: str) -> tuple:
    """(group name, kinds, required) of a shipped graph's decoder, as the compiler reads them."""
    return tuple(sorted((g.name, g.kinds, g.required) for g in groups_of(load_spec(name))))


def test_every_shipped_graph_declares_its_decoder_layers():
    for name in SHIPPED:
        node = decoder_node(load_spec(name))
        assert node.param_dict.get("layers") is not None, name


def test_the_shipped_graphs_differ_where_the_models_differ():
    decl = {name: _declaration(name) for name in GENERATION}
    assert decl["dense"] == decl["dense_noprefix"] == decl["dense_paged"] == (("attention", ("full_attention",), True),)
    assert len({decl["dense"], decl["sliding"], decl["hybrid"]}) == 3
    sliding = {g: (kinds, req) for g, kinds, req in decl["sliding"]}
    assert sliding["windowed"] == (("sliding_attention",), True) and sliding["attention"][1] is False
    hybrid = {g: (kinds, req) for g, kinds, req in decl["hybrid"]}
    # Recurrent layers are declared apart from attention layers, and they are what the graph is for.
    assert hybrid["recurrent"] == (("linear_attention",), True)
    assert "linear_attention" not in hybrid["attention"][0] and hybrid["attention"][1] is False
    for name in ("embed", "score"):  # any model: every kind served, none required
        groups = groups_of(load_spec(name))
        assert sorted(k for g in groups for k in g.kinds) == sorted(LAYER_TYPES) and not any(g.required for g in groups)


@pytest.mark.parametrize("kinds", [{"full_attention"}, {"full_attention", "sliding_attention"}, {"sliding_attention"},
                                   {"full_attention", "linear_attention"}, {"linear_attention"}, {"cache_list"},
                                   {"native"}, {"sliding_attention", "cache_list"}, {"full_attention", "native"}])
def test_the_graph_picked_for_a_model_accepts_its_layers(kinds):
    """default_graph_for's rule and the shipped graphs' declarations agree: the picked graph
    serves every kind the model has and finds a layer of a group it requires."""
    groups = groups_of(load_spec(_graph_for_kinds(kinds)))
    assert all(any(k in g.kinds for g in groups) for k in kinds)
    assert any(k in g.kinds for g in groups if g.required for k in kinds)


def test_generation_graphs_carry_a_decode_section_and_the_others_none():
    for name in SHIPPED:
        decode = load_spec(name).decode_options
        if name in GENERATION:
            assert decode.get("compile") is False and "sampling_kernel" in decode, name
        else:
            assert decode == {}, name
    # Options that only compiled steps read are declared where compiled steps can run.
    assert "kv_write_kernel" in load_spec("dense").decode_options
    for name in ("sliding", "hybrid", "dense_paged"):
        assert "kv_write_kernel" not in load_spec(name).decode_options


@pytest.mark.parametrize("graph, arch, sizes, words", [
    ("hybrid", "llama", {}, ["requires mixed (cache_list, native) or recurrent (linear_attention) layers",
                             "model 'llama' has none", "dense.yaml"]),
    ("sliding", "llama", {}, ["requires windowed (sliding_attention) layers", "model 'llama' has none", "dense.yaml"]),
    ("dense", "qwen3_next", {}, ["model 'qwen3_next' has linear_attention layers", "layer groups are attention: "
                                "full_attention", "hybrid.yaml"]),
    ("dense", "gemma3_text", {"sliding_window": 8}, ["sliding_attention layers", "sliding.yaml"]),
])
def test_binding_refuses_a_model_the_decoder_was_not_written_for(model_dir, graph, arch, sizes, words):
    model, config = _load(model_dir, arch, **sizes)
    with pytest.raises(GraphError) as exc:
        compile_graph(graph, model, config)
    (diag,) = exc.value.diagnostics
    node = decoder_node(load_spec(graph))
    assert diag.node == "decoder" and diag.loc.line == node.loc.line and diag.loc.file.endswith(f"{graph}.yaml")
    text = str(exc.value)
    assert f"{graph}.yaml:{node.loc.line}: error in node 'decoder'" in text
    for w in words:
        assert w in text, text


GOOD = textwrap.dedent("""\
    name: t
    cache:
      full_attention: {policy: full}
      linear_attention: {policy: ssm_state}
    nodes:
      - {id: embed, op: embed, inputs: [tokens]}
      - id: decoder
        op: attention
        inputs: [embed]
        params:
          layers: {attention: [full_attention], recurrent: [linear_attention]}
          requires: [recurrent]
      - {id: logits, op: logits, inputs: [decoder]}
      - {id: sample, op: sample, inputs: [logits]}
    outputs:
      next_tokens: sample
    """)


def _errors(text: str) -> list[str]:
    spec, diags = parse_collect(text, "g.yaml")
    diags += validate(spec) if spec is not None else []
    return [str(d) for d in diags if d.severity == "error"]


def test_good_groups_validate():
    assert _errors(GOOD) == []


@pytest.mark.parametrize("old, new, words", [
    ("  linear_attention: {policy: ssm_state}\n", "", "lists linear_attention, but `cache:` declares no policy"),
    ("recurrent: [linear_attention]}", "recurrent: [linear_attention], windowed: []}", "group 'windowed' lists no"),
    ("layers: {attention: [full_attention], recurrent: [linear_attention]}",
     "layers: {attention: [full_attention, linear_attention], recurrent: [linear_attention]}",
     "'linear_attention' is in groups 'attention' and 'recurrent'"),
    ("[full_attention]", "[full_atention]", "unknown layer kind 'full_atention'"),
    ("requires: [recurrent]", "requires: [recurent]", "`requires` names 'recurent', which is not a layer group"),
    ("layers: {attention: [full_attention], recurrent: [linear_attention]}", "layers: full_attention",
     "param 'layers' must map group names to lists of layer kinds"),
    ("layers: {attention: [full_attention], recurrent: [linear_attention]}\n", "", "declares no `layers:`"),
    ("  linear_attention: {policy: ssm_state}\n",
     "  linear_attention: {policy: ssm_state}\n  sliding_attention: {policy: windowed}\n",
     "`cache:` declares a policy for sliding_attention, but no layer group"),
])
def test_bad_groups_are_graph_errors_naming_the_node_and_line(old, new, words):
    text = GOOD.replace(old, new)
    errors = _errors(text)
    assert len(errors) == 1 and words in errors[0], errors
    line = text.splitlines().index("  - id: decoder") + 1
    assert errors[0].startswith(f"g.yaml:{line}: error in node 'decoder'"), errors


def test_a_graph_without_layers_gets_one_group_per_cache_entry(model_dir):
    text = GOOD.replace("        params:\n", "").replace(
        "      layers: {attention: [full_attention], recurrent: [linear_attention]}\n      requires: [recurrent]\n", "")
    assert _errors(text) == []
    spec, _ = parse_collect(text, "g.yaml")
    assert [(g.name, g.kinds, g.required) for g in groups_of(spec)] == [
        ("full_attention", ("full_attention",), False), ("linear_attention", ("linear_attention",), False)]


def test_a_repeated_top_level_key_is_an_error():
    errors = _errors(GOOD + "decode: {compile: true}\ndecode: {compile: false}\n")
    assert any("top-level key 'decode' given twice" in e for e in errors), errors


def test_inspect_shows_the_groups_and_the_decode_options(model_dir):
    model, config = _load(model_dir, "qwen3_next")
    compiled = compile_graph("hybrid", model, config)
    text = inspect_plan(compiled, "decode", trace=False)
    recurrent = [l.index for l in compiled.binding.layers if l.kind == "linear_attention"]
    assert "decoder layer groups (declared by node 'decoder', line " in text
    assert f"  recurrent   {','.join(map(str, recurrent))} ({len(recurrent)})" in text
    assert "  mixed       none              (serves cache_list, native; this model has none)" in text
    assert "requires a layer in: recurrent or mixed" in text
    assert "decode options (the graph's `decode:` section" in text
    assert "  compile            false  declared by the graph\n" in text
    assert "  kv_write_kernel    true   default (the graph does not declare it); unused: compiled steps only" in text
    assert f"{len(recurrent)} recurrent +" in text  # the attention step names the groups too
    plan = compiled.plan("decode")
    assert dict(plan.decode_sources)["compile"] == "graph" and dict(plan.decode_sources)["fuse_projections"] == "default"
    back = Plan.from_dict(json.loads(inspect_plan(compiled, "decode", "json", trace=False)))
    assert back.groups == plan.groups and back.decode_sources == plan.decode_sources


def test_compile_asked_of_a_model_with_windowed_layers_runs_eager_and_says_why(model_dir):
    d = model_dir("gemma3_text", sliding_window=8)
    eng = Engine.load(d, compile=True)
    plan = eng.compiled.plan("decode")
    mode = plan.choice("compile mode")
    assert mode.choice == "eager" and "the engine asks compile=True" in mode.why
    assert "windowed layers (sliding_attention)" in mode.why
    assert dict(plan.passes)["compile"].startswith("declared but not applied")
    assert not isinstance(eng.compiled.decode, CompiledDecode)
    prompts = random_prompts(3, eng.vocab_size, [5, 12, 9], seed=2)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    eager = Engine.load(d)
    assert [r.token_ids for r in eng.generate(prompts, params)] == [r.token_ids for r in eager.generate(prompts, params)]
