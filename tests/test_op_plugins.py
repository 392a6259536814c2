"""A user-written op (examples/soft_cap_op.py) from YAML alone: validated, shown by inspect, run."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from graphc.cli import main as cli
from graphc.compiler.compile import compile_graph, load_spec
from graphc.compiler.errors import GraphError
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.lower import StepInputs
from graphc.compiler.ops import OPS, register_op
from graphc.runtime import Engine, SamplingParams
from helpers import reference_greedy, reference_logits

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "soft_cap.yaml"
PROMPT = [5, 17, 29, 3, 8, 41, 12]


def test_validate_registers_the_op(capsys):
    assert cli(["validate", str(EXAMPLE)]) == 0
    assert "soft_cap" in OPS
    load_spec(EXAMPLE)  # a second load does not register twice


def test_bad_param_and_misplaced_op_are_graph_errors(tmp_path):
    text = EXAMPLE.read_text().replace("soft_cap_op.py", str(EXAMPLE.parent / "soft_cap_op.py"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("{cap: 2.0}", "{cap: -1.0}"))
    with pytest.raises(GraphError, match="param 'cap' must be > 0"):
        load_spec(bad)
    bad.write_text(text.replace("inputs: [logits], params", "inputs: [decoder], params"))
    with pytest.raises(GraphError, match="input 'decoder' produces hidden, but op 'soft_cap' expects logits"):
        load_spec(bad)


def test_soft_cap_runs_and_inspect_shows_it(model_dir):
    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    config = json.loads((d / "config.json").read_text())
    compiled = compile_graph(str(EXAMPLE), model, config)
    text = inspect_plan(compiled, "decode", trace=False)
    assert "capped     soft_cap     cap * tanh(logits / cap), cap = 2.0  (op from graphc_plugin_soft_cap_op" in text
    # The edits node reads the capped logits: host edits are computed against them.
    assert compiled.decode.logits_node == "capped"
    ctx = compiled.prefill.forward(StepInputs(mx.array([PROMPT]), [p.new_cache() for p in compiled.binding.policies]))
    ref = np.array(reference_logits(model, PROMPT)[-1])
    np.testing.assert_allclose(np.array(ctx.values["capped"][0]), 2.0 * np.tanh(ref / 2.0), atol=1e-5)
    eng = Engine.load(d, graph=str(EXAMPLE))
    # tanh is monotone: greedy tokens are the model's own; logprobs see the capped distribution.
    [res] = eng.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    assert res.token_ids == reference_greedy(model, PROMPT, 6)
    assert all(lp["logprob"] > -4.0 - np.log(config["vocab_size"]) for lp in res.logprobs)


def test_registering_a_taken_name_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_op("sample", inputs=("logits",), output="tokens")(lambda ctx, node, x: x)
