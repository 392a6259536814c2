"""Every invalid-config case produces its documented error: file, line, node and a hint.

The cases mirror the table in docs/graph-format.md ("Errors").
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from graphc.compiler.compile import compile_graph, load_spec
from graphc.compiler.errors import GraphError
from graphc.compiler.parse import GRAPHS_DIR, parse_collect
from graphc.compiler.validate import validate

GOOD = textwrap.dedent("""\
    name: t
    cache:
      full_attention: {policy: full}
    nodes:
      - {id: embed, op: embed, inputs: [tokens]}
      - {id: decoder, op: attention, inputs: [embed]}
      - {id: logits, op: logits, inputs: [decoder]}
      - {id: sample, op: sample, inputs: [logits]}
    outputs:
      next_tokens: sample
    """)


def diagnose(text: str, config=None):
    spec, diags = parse_collect(text, "g.yaml", config)
    if spec is not None:
        diags += validate(spec)
    return [d for d in diags if d.severity == "error"], [d for d in diags if d.severity == "warning"]


def one_error(text: str, config=None):
    errors, _ = diagnose(text, config)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def test_good_graph_has_no_problems():
    assert diagnose(GOOD) == ([], [])


@pytest.mark.parametrize("old,new,line,node,words", [
    ("op: attention", "op: atention", 6, "decoder", ["unknown op 'atention'", "did you mean 'attention'"]),
    ("inputs: [decoder]}", "inputs: [decodr]}", 7, "logits", ["input 'decodr' names no node", "did you mean 'decoder'"]),
    ("{policy: full}", "{policy: fulll}", 3, None, ["unknown cache policy 'fulll'", "did you mean 'full'"]),
    ("op: logits, inputs: [decoder]}", "op: logits, inputs: [decoder], params: {positions: first}}", 7, "logits",
     ["param 'positions' is 'first'", "allowed: last, all"]),
    ("op: sample, inputs: [logits]}", "op: sample, inputs: [logits], params: {temperature: 2}}", 8, "sample",
     ["unknown param 'temperature'"]),
    ("op: sample, inputs: [logits]}", "op: sample, inputs: [logits], params: {method: 3}}", 8, "sample",
     ["param 'method' must be a str"]),
    ("op: sample, inputs: [logits]}", "op: sample, inputs: [embed]}", 8, "sample",
     ["input 'embed' produces hidden", "expects logits"]),
    ("full_attention: {policy: full}", "full_atention: {policy: full}", 3, None, ["unknown layer type 'full_atention'"]),
    ("next_tokens: sample", "next_tokens: sampl", 10, None, ["output 'next_tokens' names unknown node 'sampl'"]),
    ("{id: embed, op: embed, inputs: [tokens]}", "{id: embed, op: embed, inputs: [tokens], extra: 1}", 5, "embed",
     ["unknown node key 'extra'"]),
])
def test_each_invalid_case_names_file_line_node(old, new, line, node, words):
    assert old in GOOD
    err = one_error(GOOD.replace(old, new, 1))
    text = str(err)
    assert err.loc.file == "g.yaml" and err.loc.line == line, text
    assert err.node == node, text
    for w in words:
        assert w in text, text


def test_duplicate_id_is_reported_at_the_second_definition():
    errors, _ = diagnose(GOOD.replace("- {id: sample, op: sample", "- {id: logits, op: sample"))
    dup = [e for e in errors if "duplicate node id" in e.message]
    assert len(dup) == 1 and dup[0].loc.line == 8 and dup[0].node == "logits"
    assert "first defined at line 7" in dup[0].message


def test_cycle_is_reported():
    text = GOOD.replace("{id: decoder, op: attention, inputs: [embed]}", "{id: decoder, op: attention, inputs: [logits]}")
    errors, _ = diagnose(text)
    msgs = "\n".join(map(str, errors))
    assert "cycle: decoder -> logits -> decoder" in msgs
    assert "g.yaml:6" in msgs


def test_missing_required_node_and_output():
    text = GOOD.replace("  - {id: decoder, op: attention, inputs: [embed]}\n", "").replace(
        "inputs: [decoder]", "inputs: [embed]").replace("next_tokens: sample", "x: logits")
    errors, _ = diagnose(text)
    msgs = [str(e) for e in errors]
    assert any("missing a required 'attention' node" in m for m in msgs)
    assert any("missing output: a step graph needs one of 'next_tokens', 'embeddings', 'scores'" in m for m in msgs)


def test_output_must_carry_its_value_type():
    err = one_error(GOOD.replace("next_tokens: sample", "next_tokens: logits"))
    assert "output 'next_tokens' must carry tokens, but node 'logits' (logits) produces logits" in err.message


def test_template_syntax_error_has_template_line():
    err = one_error(GOOD.replace("name: t", "name: t\n{% if %}"))
    assert err.loc.line == 2 and "template syntax error" in err.message


def test_template_undefined_config_value_names_line_and_hints_model():
    err = one_error(GOOD.replace("{policy: full}", "{policy: full}\n  # {{ config.sliding_window }}"))
    assert err.loc.line == 4 and "sliding_window" in err.message
    assert "--model" in err.hint
    # With a config that has the value, the same template renders fine.
    assert diagnose(GOOD.replace("{policy: full}", "{policy: full}\n  # {{ config.sliding_window }}"),
                    {"sliding_window": 8}) == ([], [])


def test_yaml_error_has_line():
    err = one_error(GOOD.replace("nodes:", "nodes: [", 1))
    assert "YAML error" in err.message and err.loc.line > 0


def test_dead_node_is_a_warning():
    text = GOOD.replace("    outputs:", "") + ""
    text = GOOD.replace("  - {id: sample", "  - {id: extra, op: logit_edits, inputs: [logits]}\n  - {id: sample")
    errors, warnings = diagnose(text)
    assert not errors
    assert any(w.node == "extra" and "reaches no graph output" in w.message for w in warnings)


def test_every_problem_is_reported_not_only_the_first():
    text = (GOOD.replace("op: attention", "op: atention")
                .replace("{policy: full}", "{policy: nope}")
                .replace("inputs: [decoder]}", "inputs: [missing]}"))
    errors, _ = diagnose(text)
    assert len(errors) >= 3
    with pytest.raises(GraphError) as exc:
        from graphc.compiler.parse import parse_text
        spec = parse_text(text, "g.yaml")
        diags = validate(spec)
        raise GraphError(diags)
    assert "3 problem(s)" in str(exc.value) or len(exc.value.diagnostics) >= 3


def test_validate_cli_reports_all_and_exits_nonzero(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("op: attention", "op: atention").replace("{policy: full}", "{policy: nope}"))
    proc = subprocess.run([sys.executable, "-m", "graphc.cli", "validate", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{bad}:6: error in node 'decoder': unknown op 'atention'" in proc.stdout
    assert "unknown cache policy 'nope'" in proc.stdout
    assert "2 error(s)" in proc.stdout


SHIPPED = sorted(p.stem for p in GRAPHS_DIR.glob("*.yaml"))


def test_the_shipped_graphs_are_all_found():
    # The parametrized test below covers whatever graphs/ holds; it must not pass by finding none.
    assert {"dense", "dense_noprefix", "sliding", "hybrid", "embed", "score"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_graph_validates_without_errors_or_warnings(name):
    errors, warnings = diagnose((GRAPHS_DIR / f"{name}.yaml").read_text())
    assert errors == [] and warnings == []
    spec = load_spec(name)  # by name, as users and the CLI resolve it
    assert spec.name == name
    ids = {n.id for n in spec.nodes}
    assert spec.outputs and all(src in ids for _, src in spec.outputs)


@pytest.mark.parametrize("op,words", [("score", "scores need"), ("prompt_logprobs", "prompt logprobs need")])
def test_ops_that_read_every_position_reject_last_position_logits(op, words):
    inputs = "[logits, tokens]"
    text = GOOD.replace("op: logits, inputs: [decoder]}", "op: logits, inputs: [decoder], params: {positions: last}}")
    text = text.replace("  - {id: sample, op: sample, inputs: [logits]}\n",
                        f"  - {{id: sample, op: sample, inputs: [logits]}}\n  - {{id: extra, op: {op}, inputs: {inputs}}}\n")
    text = text.replace("  next_tokens: sample\n", "  next_tokens: sample\n  extra: extra\n")
    errors, _ = diagnose(text)
    assert any(words in d.message and "`positions: all`" in d.message for d in errors), errors


def test_bind_rejects_model_with_layers_the_graph_has_no_policy_for(model_dir):
    import mlx_lm

    d = model_dir("gpt_oss")
    model, _ = mlx_lm.load(str(d))
    config = json.loads((d / "config.json").read_text())
    with pytest.raises(GraphError) as exc:
        compile_graph("dense", model, config)
    msg = str(exc.value)
    assert "sliding_attention layers" in msg and "declares no policy" in msg
    assert "sliding.yaml" in msg


@pytest.mark.parametrize("argv,needle", [
    (["generate", "--model", "/no/such/folder", "hi"], "no model folder at '/no/such/folder'"),
    (["inspect", "no-such-graph", "--no-trace"], "graph 'no-such-graph' not found"),
])
def test_cli_user_errors_are_one_line_without_traceback(argv, needle):
    proc = subprocess.run([sys.executable, "-m", "graphc.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
