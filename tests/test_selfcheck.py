"""The load-time self-check picks the lowering, falls back from a wrong fast path, and refuses
what no lowering serves exactly; unsupported caches are refused with the model type, layer and reason."""

from __future__ import annotations

import json
import logging

import attrs
import mlx.core as mx
import mlx_lm
import pytest

from graphc.compiler import archs
from graphc.compiler.compile import compile_graph
from graphc.compiler.errors import UnsupportedModel
from graphc.compiler.inspect import inspect_plan
from graphc.runtime import Engine, SamplingParams
from helpers import random_prompts, reference_greedy


class _ScaledEmbed(archs.ArchAdapter):
    """A fast path with a bug of the kind issue #11 found (an embedding scale it gets wrong)."""

    def embed(self, tokens):
        return super().embed(tokens) * 1.5


@pytest.fixture(scope="module")
def llama(model_dir):
    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    return d, model, json.loads((d / "config.json").read_text())


def test_fast_path_serves_its_architectures(llama):
    _, model, config = llama
    b = compile_graph(None, model, config).binding
    assert b.lowering == "fast" and [c.lowering for c in b.checks] == ["fast"] and b.check.ok


def test_the_binding_is_frozen_and_each_lowering_tried_gets_its_own(llama, monkeypatch):
    _, model, config = llama
    monkeypatch.setitem(archs.ADAPTERS, "llama", _ScaledEmbed)
    compiled = compile_graph(None, model, config)
    b = compiled.binding
    assert b.lowering == "generic" and isinstance(b.checks, tuple)
    assert compiled.decode.plan.lowering == "generic"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        b.lowering = "fast"
    assert b.folding_layers == ()  # found at bind time: a llama's caches count no positions


def test_a_wrong_fast_path_falls_back_to_the_generic_lowering_and_says_so(llama, monkeypatch, caplog):
    d, _, _ = llama
    monkeypatch.setitem(archs.ADAPTERS, "llama", _ScaledEmbed)
    with caplog.at_level(logging.WARNING, logger="graphc.compile"):
        eng = Engine.load(d, prefill_chunk=8)
    b = eng.compiled.binding
    assert b.lowering == "generic"
    assert [(c.lowering, c.ok) for c in b.checks] == [("fast", False), ("generic", True)]
    assert "fast path failed the self-check" in caplog.text
    text = inspect_plan(eng.compiled, "decode", trace=False)
    assert "lowering: generic" in text and "self-check fast:" in text and "MISMATCH" in text
    assert "generic lowering: the model's own forward (the fast path failed the self-check)" in text
    plan = json.loads(inspect_plan(eng.compiled, "decode", fmt="json", trace=False))
    assert plan["lowering"] == "generic"
    assert [c["ok"] for c in plan["self_check"]] == [False, True]
    assert plan["self_check"][0]["max_abs_diff"] > plan["self_check"][0]["tolerance"]
    # And what it serves is right.
    prompts = random_prompts(2, eng.vocab_size, [9, 3], seed=1)
    for p, r in zip(prompts, eng.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))):
        assert r.token_ids == reference_greedy(eng.model, p, 6)


def test_forcing_the_wrong_fast_path_refuses_the_model(llama, monkeypatch):
    _, model, config = llama
    monkeypatch.setitem(archs.ADAPTERS, "llama", _ScaledEmbed)
    with pytest.raises(UnsupportedModel, match=r"model type 'llama': no lowering reproduces .*fast: max \|diff\|"):
        compile_graph(None, model, config, lowering="fast")


def test_generic_and_fast_give_the_same_tokens(llama):
    d = llama[0]
    prompts = random_prompts(3, 1024, [12, 5, 30], seed=2)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    fast = Engine.load(d, prefill_chunk=8).generate(prompts, params)
    gen_engine = Engine.load(d, prefill_chunk=8, lowering="generic")
    assert gen_engine.compiled.binding.lowering == "generic"
    assert [r.token_ids for r in gen_engine.generate(prompts, params)] == [r.token_ids for r in fast]


def test_no_fast_path_for_a_type_without_one_is_a_clear_error(model_dir):
    from generic_models import make_tiny

    d = make_tiny("phi", model_dir("llama").parent / "phi-fast")
    with pytest.raises(ValueError, match="model type 'phi' has no fast path"):
        Engine.load(d, lowering="fast")


def test_a_cache_graphc_cannot_batch_is_served_on_mlx_lms_own_cache_one_request_at_a_time(llama, monkeypatch):
    from mlx_lm.models.cache import RotatingKVCache

    d, model, config = llama
    monkeypatch.setattr(type(model), "make_cache",
                        lambda self: [RotatingKVCache(max_size=64, keep=4) for _ in self.layers], raising=False)
    compiled = compile_graph(None, model, config)
    b = compiled.binding
    assert {(l.kind, p.name) for l, p in zip(b.layers, b.policies)} == {("native", "native")}
    assert not b.batched and [(c.batched, c.ok) for c in b.checks] == [(False, True)]
    text = inspect_plan(compiled, "decode", trace=False)
    assert "one request at a time (max_batch 1) on mlx-lm's own cache: model type 'llama': layer 0" in text
    assert "keeps the first 4 tokens" in text and "prefix reuse off" in text


def test_an_own_cache_the_model_does_not_match_is_refused_naming_type_layer_and_reason(llama, monkeypatch):
    """A cache class graphc cannot batch, which is also wrong when a prompt comes in chunks (the
    way graphc prefills): the unbatched check fails too and the model is refused."""
    from mlx_lm.models.cache import ConcatenateKVCache

    class Broken(ConcatenateKVCache):
        calls = 0

        def update_and_fetch(self, k, v):
            self.calls += 1
            k, v = super().update_and_fetch(k, v)
            return (k, v) if self.calls == 1 else (k * 0.5, v)

    _, model, config = llama
    monkeypatch.setattr(type(model), "make_cache", lambda self: [Broken() for _ in self.layers], raising=False)
    with pytest.raises(UnsupportedModel) as e:
        compile_graph(None, model, config)
    msg = str(e.value)
    assert "model type 'llama'" in msg and "layer 0 (cache Broken)" in msg
    assert "no batched equivalent" in msg and "would need" in msg and "does not match either" in msg


def test_when_graphcs_caches_break_the_model_it_runs_on_its_own_caches_or_is_refused(llama, monkeypatch):
    """Both lowerings run on graphc's caches: a cache bug fails both checks. With the graph
    picked automatically the model then runs one request at a time on mlx-lm's own caches
    (checked too); with a graph the user chose, it is refused at load — never wrong later."""
    from graphc.runtime.cache.full import FullKV

    _, model, config = llama
    monkeypatch.setattr(FullKV, "make_mask", lambda self, N, window_size=None, return_array=False: None)
    compiled = compile_graph(None, model, config)
    b = compiled.binding
    assert not b.batched and {l.kind for l in b.layers} == {"native"}
    assert [(c.lowering, c.batched, c.ok) for c in b.checks] == [("generic", False, True)]
    assert "graphc's caches do not reproduce it (fast: max |diff|" in inspect_plan(compiled, "decode", trace=False)
    with pytest.raises(UnsupportedModel) as e:
        compile_graph("dense", model, config)
    msg = str(e.value)
    assert "model type 'llama'" in msg and "fast: max |diff|" in msg and "generic: max |diff|" in msg
    assert "prompt 0 prefill" in msg


def test_grouped_head_scores_get_rank_5_row_masks(model_dir):
    """gemma2 with grouped KV heads reshapes attention scores to [B, kv, repeats, N, T], so a
    per-row [B, 1, N, T] mask lines up with the wrong axes (mlx-lm's BatchGenerator has the same
    limit). The batched check fails, the retry with rank-5 row masks passes: served batched."""
    from generic_models import make_tiny

    d = make_tiny("gemma2_gqa", model_dir("llama").parent / "gemma2-gqa")
    eng = Engine.load(d, prefill_chunk=8)
    b = eng.compiled.binding
    assert b.batched and b.mask_rank == 5 and eng.scheduler.max_batch > 1
    assert [(c.mask_rank, c.ok) for c in b.checks] == [(4, False), (5, True)]
    assert b.checks[0].batched_only and "(batched" in b.checks[0].error
    prompts = random_prompts(4, eng.vocab_size, [5, 17, 2, 30], seed=4)
    for p, r in zip(prompts, eng.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))):
        assert r.token_ids == reference_greedy(eng.model, p, 8)


def test_a_model_exact_only_unbatched_is_served_one_request_at_a_time(model_dir):
    """gpt_bigcode adds learned positions indexed by `cache.offset` as one integer: rows at
    different positions cannot share a forward. graphc serves it with max_batch 1 and says so."""
    from generic_models import make_tiny

    d = make_tiny("gpt_bigcode", model_dir("llama").parent / "gpt-bigcode")
    eng = Engine.load(d, prefill_chunk=8)
    b = eng.compiled.binding
    assert not b.batched and eng.scheduler.max_batch == 1 and not eng.batch_prefill
    assert [(c.batched, c.ok) for c in b.checks] == [(True, False), (True, False), (False, True)]
    assert "at decode step 1 (batched" in b.checks[0].error
    text = inspect_plan(eng.compiled, "decode", trace=False)
    assert "self-check generic (one request at a time):" in text and "one request at a time (max_batch 1)" in text
    prompts = random_prompts(3, eng.vocab_size, [5, 17, 2], seed=4)
    for p, r in zip(prompts, eng.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))):
        assert r.token_ids == reference_greedy(eng.model, p, 8)


def test_inspect_cli_picks_the_graph_and_forces_a_lowering(llama, capsys):
    from graphc.cli import main as cli

    d = llama[0]
    assert cli(["inspect", "auto", "--model", str(d), "--lowering", "generic", "--no-trace"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graph dense") and "lowering: generic" in out
    assert "self-check generic: max |diff|" in out and "generic lowering: the model's own forward (forced)" in out


def test_a_folder_mlx_lm_cannot_load_is_a_clear_error(llama, tmp_path):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(llama[0], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "no_such_model_type"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModel, match=r"model type 'no_such_model_type': mlx_lm.load could not load"):
        Engine.load(d)


def test_quantized_models_get_the_quantized_bound_and_a_wrong_lowering_still_fails(llama, monkeypatch):
    """Quantized matmul kernels differ by row count (CUDA: 3.2e-4 of the scale on SmolLM2 Q4_1),
    so a quantized model's bound is QUANTIZED_TOLERANCE; a real lowering bug stays far above it."""
    import mlx.nn as nn

    from graphc.compiler import selfcheck

    _, model, config = llama
    plain = selfcheck.reference_run(model, "llama")
    assert not plain.quantized and plain.tolerance == pytest.approx(selfcheck.TOLERANCE["float32"] * plain.scale)

    qmodel, _ = mlx_lm.load(str(llama[0]))
    nn.quantize(qmodel, group_size=32, bits=4)
    ref = selfcheck.reference_run(qmodel, "llama")
    assert ref.quantized and ref.tolerance == pytest.approx(selfcheck.QUANTIZED_TOLERANCE * ref.scale)
    b = compile_graph(None, qmodel, config).binding
    assert b.lowering == "fast" and b.check.ok
    # The bound still catches the embedding-scale bug of the test above on the quantized model.
    monkeypatch.setitem(archs.ADAPTERS, "llama", _ScaledEmbed)
    b = compile_graph(None, qmodel, config).binding
    assert [(c.lowering, c.ok) for c in b.checks] == [("fast", False), ("generic", True)]
    assert b.checks[0].max_abs_diff > 10 * b.checks[0].tolerance


class _LastAloneRoundsApart:
    """A final norm whose output moves when it is given one position: on CPU every schedule of
    mlx-lm's forward is bit-exact, so this stands in for a GPU where the last token alone takes
    other kernels than the whole prompt (a bf16 mixture of experts turned that into another
    expert on an H100: benchmarks/probes/selfcheck_noise.py)."""

    def __init__(self, norm):
        self.norm = norm

    def __call__(self, h):
        y = self.norm(h)
        return y + 0.05 if h.shape[1] == 1 else y


def test_schedules_are_the_pieces_mlx_lm_feeds_a_prompt_in():
    from graphc.compiler import selfcheck

    assert selfcheck.schedules(7) == [(7,), (6, 1)]
    assert selfcheck.schedules(4) == [(4,), (3, 1)]
    assert selfcheck.schedules(1) == [(1,)]


def test_a_row_that_rounds_like_mlx_lms_own_last_token_alone_passes_and_the_check_says_so(llama, monkeypatch):
    from graphc.compiler import selfcheck

    d, _, config = llama
    model, _ = mlx_lm.load(str(d))
    monkeypatch.setattr(model.model, "norm", _LastAloneRoundsApart(model.model.norm))
    ref = selfcheck.reference_run(model, "llama")
    # The whole prompt's row and the last-token-alone row are apart by far more than the bound ...
    (pieces, rows), *_ = ref.others(0)
    assert pieces == (6, 1)
    assert float(mx.abs(rows[0] - ref.logits[0][0]).max()) > 10 * ref.tolerance
    # ... and both lowerings run a final chunk's last token alone on the CPU: each matches that row.
    for lowering in ("fast", "generic"):
        b = compile_graph(None, model, config, lowering=lowering).binding
        assert b.lowering == lowering and b.check.ok
        assert "prompt 0 prefill: (6, 1)" in b.check.other_schedules
        assert "last token fed alone, as mlx_lm.generate feeds it (prompt 0 prefill: (6, 1)" in b.check.describe()
    # The plan says so, in text and JSON.
    compiled = compile_graph(None, model, config)
    line = next(l for l in inspect_plan(compiled, "decode", trace=False).splitlines() if l.startswith("self-check"))
    assert "-> ok (" in line and "with the last token fed alone: prompt 0 prefill: (6, 1)" in line
    plan = json.loads(inspect_plan(compiled, "decode", fmt="json", trace=False))
    assert "prompt 0 prefill: (6, 1)" in plan["self_check"][0]["other_schedules"]
    # Against the whole prompt alone, as before, the same lowering fails.
    monkeypatch.setattr(selfcheck.Reference, "others", lambda self, i: [])
    with pytest.raises(UnsupportedModel, match=r"prompt 0 prefill: max \|diff\|"):
        compile_graph(None, model, config, lowering="generic")


def test_other_schedules_do_not_excuse_a_wrong_lowering(llama, monkeypatch):
    from graphc.compiler import selfcheck

    d, _, config = llama
    model, _ = mlx_lm.load(str(d))
    monkeypatch.setattr(model.model, "norm", _LastAloneRoundsApart(model.model.norm))
    monkeypatch.setitem(archs.ADAPTERS, "llama", _ScaledEmbed)
    b = compile_graph(None, model, config).binding
    assert [(c.lowering, c.ok) for c in b.checks] == [("fast", False), ("generic", True)]
    assert b.checks[0].max_abs_diff > 10 * b.checks[0].tolerance
    assert selfcheck.schedules(len(selfcheck.PROMPTS[0]))[1] == (6, 1)


def test_the_second_reference_runs_in_the_first_ones_context(llama):
    """The chunked reference (compile.py) swaps the gated-delta recurrence in for as long as its
    context is entered: the last-token-alone rows, run later and only on a miss, must see the same
    forward, so reference_run enters the context again for them."""
    import contextlib

    from graphc.compiler import selfcheck

    _, model, _ = llama
    entered = []

    @contextlib.contextmanager
    def context():
        entered.append(True)
        yield

    ref = selfcheck.reference_run(model, "llama", context=context)
    assert entered == []  # the first reference runs inside the caller's own `with`
    (pieces, rows), = ref.others(0)
    assert pieces == (6, 1) and entered == [True]
    assert ref.others(0)[0][1] is rows and entered == [True]  # run once, kept
    ref.others(1)
    assert len(entered) == 2
