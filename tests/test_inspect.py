"""`graphc inspect`: text, JSON (round-trips through Plan.from_dict) and dot outputs of real plans."""

from __future__ import annotations

import json
import subprocess
import sys

import mlx_lm
import pytest

from graphc.compiler.compile import compile_graph
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.plan import Plan


@pytest.fixture(scope="module")
def compiled(model_dir):
    d = model_dir("llama", num_layers=3)
    model, _ = mlx_lm.load(str(d))
    return compile_graph("dense", model, json.loads((d / "config.json").read_text())), d


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_json_round_trips_and_lists_every_layer(compiled, kind):
    c, _ = compiled
    data = json.loads(inspect_plan(c, kind, "json"))
    assert data["format"] == "graphc.plan/1" and data["kind"] == kind
    assert [l["index"] for l in data["layers"]] == list(range(len(c.binding.layers)))
    assert all(l["policy"] for l in data["layers"])
    plan = Plan.from_dict(data)
    assert plan.to_dict() == {k: v for k, v in data.items() if k not in ("format", "kv_bytes_per_request")}
    assert [s.op for s in plan.steps][:3] == ["embed", "attention", "logits"]
    # The op counts are read off the traced lazy graph: a decode step has matmuls and a cache write.
    ops = dict(plan.ops)
    assert ops.get("Matmul", 0) > 0 and ops.get("SliceUpdate", 0) > 0


def test_text_shows_steps_layers_chain_and_ops(compiled):
    c, _ = compiled
    text = inspect_plan(c, "decode", "text")
    for needle in ("steps (in order)", "layers", "KV bytes/token", "chain: chain-safe", "ops in the lowered step"):
        assert needle in text
    prefill = inspect_plan(c, "prefill", "text")
    assert "[final chunk]" in prefill and "chain: not chain-safe" in prefill


def test_dot_is_a_digraph_with_every_edge(compiled):
    c, _ = compiled
    dot = inspect_plan(c, "decode", "dot", trace=False)
    assert dot.startswith('digraph "dense_decode"')
    kept = {s.node for s in c.plan("decode").steps}
    for node in c.spec.nodes:
        for src in node.inputs:
            # The decode plan prunes the prompt-logprobs nodes: they are not drawn.
            assert (f'"{src}" -> "{node.id}"' in dot) == (node.id in kept)
    assert "prompt_logits" not in kept


def test_cli_inspect_json(compiled):
    _, d = compiled
    proc = subprocess.run([sys.executable, "-m", "graphc.cli", "inspect", "graphs/dense.yaml", "--model",
                           str(d), "--format", "json"], capture_output=True, text=True, cwd=_repo_root())
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["layers"]) == 3 and {l["policy"] for l in data["layers"]} <= {"full", "pool_backed"}


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent
