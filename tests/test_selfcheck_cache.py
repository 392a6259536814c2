"""The self-check's stored verdict (compiler/selfcheck_cache.py): a second start of the same model,
graph and graphc skips the check; anything the verdict depends on changing, a damaged file or
GRAPHC_SELFCHECK=always runs it again. conftest.py sets `always` for every other test."""

from __future__ import annotations

import json
import logging
import os

import mlx_lm
import pytest

from graphc.compiler import compile as compile_mod
from graphc.compiler import selfcheck_cache as sc
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.selfcheck import reference_run, run_check
from graphc.compiler.target import Requested
from graphc.runtime import Engine, SamplingParams


@pytest.fixture(scope="module")
def llama(model_dir):
    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    return d, model, json.loads((d / "config.json").read_text())


@pytest.fixture
def checks(monkeypatch, tmp_path):
    """The cache on, in a fresh folder; returns a list that grows by one per self-check run."""
    monkeypatch.setenv("GRAPHC_SELFCHECK", "cached")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    ran: list = []
    real = compile_mod.run_check

    def counted(*a, **k):
        ran.append(a[2])  # the lowering checked
        return real(*a, **k)

    monkeypatch.setattr(compile_mod, "run_check", counted)
    return ran


def _stored(tmp_path) -> list:
    return sorted((tmp_path / "cache" / "selfcheck").glob("*.json"))


def test_a_second_start_reuses_the_verdict_and_serves_the_same_graph(llama, checks, tmp_path):
    d, model, config = llama
    first = sc.compile_cached(None, model, config, model_path=str(d))
    assert checks == ["fast"] and len(_stored(tmp_path)) == 1
    second = sc.compile_cached(None, model, config, model_path=str(d))
    assert checks == ["fast"]  # no second check
    a, b = first.binding, second.binding
    assert (b.lowering, b.batched, b.mask_rank, b.model_type) == (a.lowering, a.batched, a.mask_rank, a.model_type)
    assert b.layers == a.layers and b.checks == a.checks and b.check == a.check
    assert second.vocab_size == first.vocab_size and second.spec.name == first.spec.name
    for kind in ("prefill", "decode"):  # the same plans, choice passes included
        assert inspect_plan(second, kind, trace=False) == inspect_plan(first, kind, trace=False)
    # The rebuilt steps are real: they pass the check itself against mlx-lm's own forward.
    ref = reference_run(b.model, b.model_type)
    assert run_check(second, ref, b.lowering).ok


def test_changed_weights_graph_lowering_or_versions_check_again(llama, checks, tmp_path, monkeypatch):
    d, model, config = llama
    sc.compile_cached(None, model, config, model_path=str(d))
    assert len(checks) == 1
    weights = next(d.glob("*.safetensors"))
    st = weights.stat()
    try:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten weights: a new mtime
        sc.compile_cached(None, model, config, model_path=str(d))
        assert len(checks) == 2
    finally:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    sc.compile_cached("dense", model, config, model_path=str(d))  # a graph named, not picked: other text
    assert len(checks) == 3
    sc.compile_cached(None, model, config, lowering="generic", model_path=str(d))
    assert checks[-1] == "generic"
    monkeypatch.setattr(sc, "_version", lambda dist: "9.9.9" if dist == "mlx" else "1.0")
    sc.compile_cached(None, model, config, model_path=str(d))
    assert len(checks) == 5
    monkeypatch.setattr(sc, "source_digest", lambda: "edited-graphc")  # graphc's code changed, same version
    sc.compile_cached(None, model, config, model_path=str(d))
    assert len(checks) == 6
    sc.compile_cached(None, model, config, model_path=str(d))  # and that one is stored in turn
    assert len(checks) == 6


def test_a_damaged_or_foreign_verdict_is_ignored_and_replaced(llama, checks, tmp_path, caplog):
    d, model, config = llama
    sc.compile_cached(None, model, config, model_path=str(d))
    [path] = _stored(tmp_path)
    for damage in ("{not json", json.dumps({"schema": 999}), json.dumps({**json.loads(path.read_text()), "layers": [{}]})):
        path.write_text(damage)
        n = len(checks)
        with caplog.at_level(logging.WARNING, logger="graphc.compile"):
            compiled = sc.compile_cached(None, model, config, model_path=str(d))
        assert len(checks) == n + 1 and compiled.binding.check.ok
        assert "ignoring the stored verdict" in caplog.text
        assert json.loads(path.read_text())["schema"] == sc.SCHEMA  # rewritten whole
        caplog.clear()


def test_always_checks_and_stores_nothing(llama, checks, tmp_path, monkeypatch):
    d, model, config = llama
    sc.compile_cached(None, model, config, model_path=str(d))
    monkeypatch.setenv("GRAPHC_SELFCHECK", "always")
    sc.compile_cached(None, model, config, model_path=str(d))
    assert len(checks) == 2
    monkeypatch.setenv("GRAPHC_SELFCHECK", "sometimes")
    with pytest.raises(ValueError, match="GRAPHC_SELFCHECK='sometimes'.*cached, always"):
        sc.compile_cached(None, model, config, model_path=str(d))


def test_models_without_a_path_are_always_checked(llama, checks, tmp_path):
    _, model, config = llama
    sc.compile_cached(None, model, config)
    sc.compile_cached(None, model, config)
    sc.compile_cached(None, model, config, model_path="llama-3.1-8b")  # a label, not a file: random weights
    sc.compile_cached(None, model, config, model_path="llama-3.1-8b")
    assert len(checks) == 4 and _stored(tmp_path) == []


def test_a_graph_running_code_from_outside_graphc_is_not_stored(llama, checks, tmp_path, monkeypatch):
    d, model, config = llama
    compiled = sc.compile_cached(None, model, config)
    assert sc._graphc_code(compiled)
    # The same policy class as if a script had registered it: its code is outside the digest.
    monkeypatch.setattr(type(compiled.binding.policies[0]), "__module__", "my_script")
    assert not sc._graphc_code(compiled)
    sc.compile_cached(None, model, config, model_path=str(d))
    sc.compile_cached(None, model, config, model_path=str(d))
    assert len(checks) == 3 and _stored(tmp_path) == []


def test_the_engine_skips_the_check_on_its_second_load_and_generates_the_same(llama, checks, caplog):
    d, _, _ = llama
    params = SamplingParams(max_tokens=6, temperature=0.0)
    first = Engine.load(d, prefix_cache=False).generate(["the quick brown"], params)[0].token_ids
    assert len(checks) == 1
    with caplog.at_level(logging.INFO, logger="graphc.compile"):
        second = Engine.load(d, prefix_cache=False).generate(["the quick brown"], params)[0].token_ids
    assert len(checks) == 1 and second == first
    assert "self-check skipped" in caplog.text and "GRAPHC_SELFCHECK=always" in caplog.text


def test_kv_bits_verdicts_are_their_own_and_rebuild_the_quantized_policy(model_dir, checks):
    d = model_dir("llama", hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64)  # groups of 64 fit
    model, _ = mlx_lm.load(str(d))
    config = json.loads((d / "config.json").read_text())
    sc.compile_cached(None, model, config, model_path=str(d))
    n = len(checks)
    first = sc.compile_cached(None, model, config, kv_bits=8, model_path=str(d))
    assert len(checks) == n + 1
    again = sc.compile_cached(None, model, config, kv_bits=8, model_path=str(d))
    assert len(checks) == n + 1
    assert [p.name for p in again.binding.policies] == [p.name for p in first.binding.policies]
    assert any(p.name == "quantized" for p in again.binding.policies)
    sc.compile_cached(None, model, config, kv_bits=4, model_path=str(d))
    assert len(checks) == n + 2


def test_the_plans_choices_follow_this_starts_options_not_the_stored_ones(llama, checks):
    d, model, config = llama
    off = sc.compile_cached(None, model, config, requested=Requested.of({"compile": False}), model_path=str(d))
    on = sc.compile_cached(None, model, config, requested=Requested.of({"compile": True}), model_path=str(d))
    assert len(checks) == 1  # the options are not part of the verdict: one check
    assert off.decode.plan.option("compile") is False and on.decode.plan.option("compile") is True
    assert on.requested == Requested.of({"compile": True})
