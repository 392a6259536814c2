"""A user-authored cache policy (examples/kv_int8_policy.py) loaded through a graph's `plugins:` key."""

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
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache import policy_names
from helpers import random_prompts, reference_greedy, reference_logits

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kv_int8.yaml"


def test_validate_loads_the_plugin_and_registers_its_policy(capsys):
    assert cli(["validate", str(EXAMPLE)]) == 0
    assert "ok" in capsys.readouterr().out
    assert "kv_int8" in policy_names()
    load_spec(EXAMPLE)  # loading the same file again does not register twice


def test_int8_policy_generates_like_mlx_lm(model_dir):
    d = model_dir("llama")
    eng = Engine.load(d, graph=str(EXAMPLE), prefill_chunk=16)
    assert {p.name for p in eng.compiled.binding.policies} == {"kv_int8"}
    assert eng.prefix is not None  # the policy speaks the prefix protocol (TOKENS)
    prompts = random_prompts(4, eng.vocab_size, [5, 40, 1, 23], seed=11)
    results = eng.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    for p, r in zip(prompts, results):
        assert r.token_ids == reference_greedy(eng.model, p, 20)
    # Rounding to int8 moves logits a little (here ~1% of their range), not a lot.
    from graphc.compiler.lower import StepInputs

    p = prompts[1]
    caches = eng.runner.new_caches()
    out = eng.compiled.prefill(StepInputs(mx.array(p)[None], caches, final=True))
    ref = reference_logits(eng.model, p)[-1]
    err = np.abs(np.array(out.logits[0]) - np.array(ref)).max()
    assert 0 < err < 0.03 * np.abs(np.array(ref)).max()


def test_int8_policy_hits_the_prefix_cache_with_its_own_cold_outputs(model_dir):
    """The example policy takes part in the prefix cache through the protocol alone: hits restore
    its int8 codes and scales from the pool, and every answer equals its own run without a
    prefix cache (same int8 rounding), at each hit length."""
    d = model_dir("llama")
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 900, 37).tolist()
    prompts = [shared + rng.integers(3, 900, k).tolist() for k in (6, 1, 19)] + [shared[:20]]
    prompts.append(list(prompts[0]))  # a full-prefix hit
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    cold = Engine.load(d, graph=str(EXAMPLE), prefill_chunk=16, prefix_cache=False)
    assert cold.prefix is None
    want = [r.token_ids for r in cold.generate(prompts, greedy)]
    eng = Engine.load(d, graph=str(EXAMPLE), prefill_chunk=16, max_total_tokens=512)
    assert [p.prefix_kind.value for p in eng.compiled.binding.policies] == ["tokens"] * len(
        eng.compiled.binding.policies)
    got = [eng.generate([p], greedy)[0] for p in prompts]
    assert [r.token_ids for r in got] == want
    assert [r.cached_tokens for r in got] == [0, 37, 37, 19, len(prompts[0]) - 1]  # never the last token
    # The pool keeps all four planes at their own dtypes: int8 codes, float32 scales.
    pool = eng.runner.prefix_io.pool
    assert [a.dtype for a in pool.planes[0]] == [mx.int8, mx.int8, mx.float32, mx.float32]
    assert eng.cache_stats()["hits"] == 4
    eng.prefix.check()
    text = inspect_plan(eng.compiled, "decode", trace=False)
    assert "prefix reuse off" not in text


def test_a_policy_without_the_prefix_protocol_says_why_in_inspect(model_dir):
    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    config = json.loads((d / "config.json").read_text())
    compiled = compile_graph("dense_noprefix", model, config)
    text = inspect_plan(compiled, "decode", trace=False)
    assert "prefix reuse off: layer 0's policy 'full' keeps each request's KV to itself" in text


def test_inspect_shows_the_smaller_kv(model_dir):
    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    config = json.loads((d / "config.json").read_text())
    plan = compile_graph(str(EXAMPLE), model, config).plan("decode")
    dense = compile_graph("dense", model, config).plan("decode")
    l = compile_graph("dense", model, config).binding.layers[0]
    assert plan.layers[0].bytes_per_token == 2 * l.kv_heads * (l.head_dim + 4)
    assert plan.kv_bytes_per_token < dense.kv_bytes_per_token
    assert "kv_int8" in inspect_plan(compile_graph(str(EXAMPLE), model, config), "decode", trace=False)


@pytest.mark.parametrize("entry, words", [
    ("missing_policy.py", "no such file"),
    ("no_such_module_for_graphc", "No module named"),
])
def test_a_plugin_that_fails_is_a_diagnostic_on_its_line(tmp_path, entry, words):
    text = EXAMPLE.read_text().replace("  - kv_int8_policy.py   # relative to this file; registers the `kv_int8` policy",
                                       f"  - {entry}")
    g = tmp_path / "bad.yaml"
    g.write_text(text)
    with pytest.raises(GraphError) as e:
        load_spec(g)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if entry in l)
    d = next(d for d in e.value.diagnostics if "plugin" in d.message)
    assert d.loc.line == line and words in d.message and d.hint
