"""Speculative decoding (runtime/speculative/, the graphs' `verify` node): greedy output is the
target's own, token for token, whatever the drafts; rejected positions leave the caches."""

from __future__ import annotations

import mlx.core as mx
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.full import FullKV
from graphc.runtime.speculative import NgramIndex, SpecConfig, parse_speculative
from helpers import random_prompts, reference_greedy

SPEC = SamplingParams(max_tokens=40, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
PLAIN = SamplingParams(max_tokens=40, ignore_eos=True)
# Verify positions per forward for the correctness tests (the CPU default, 4, would turn
# speculation off for their multi-row batches; test_verify_position_budget covers it).
WIDE = 64


# -- prompt lookup ------------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_suffix():
    idx = NgramIndex(max_ngram=3, min_ngram=1)
    seq = [5, 6, 7, 8, 9, 1, 2, 6, 7]
    assert idx.draft(seq, 3) == [8, 9, 1]  # "6 7" was followed by 8 9 1


def test_prompt_lookup_prefers_the_longest_ngram_then_the_latest_occurrence():
    idx = NgramIndex(max_ngram=3, min_ngram=1)
    # "2 3" occurs twice, followed by 4 and then 9; "1 2 3" only once (followed by 4).
    assert idx.draft([1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3], 2) == [4, 0]
    idx = NgramIndex(max_ngram=2, min_ngram=1)
    assert idx.draft([1, 2, 3, 4, 0, 2, 3, 9, 7, 2, 3], 1) == [9]  # latest "2 3"


def test_prompt_lookup_is_incremental_and_empty_without_a_match():
    idx = NgramIndex(max_ngram=2, min_ngram=2)
    seq = [1, 2, 3]
    assert idx.draft(seq, 4) == []
    seq += [4, 1, 2]
    assert idx.draft(seq, 4) == [3, 4, 1, 2]
    seq += [3]
    assert idx.draft(seq, 2) == [4, 1]  # "2 3" -> 4 1, from the index built across calls


# -- settings ------------------------------------------------------------------------------
@pytest.mark.parametrize("value, k, message", [
    ("ngram", None, "speculative method"), ({"method": "prompt_lookup", "depth": 3}, None, "unknown key"),
    ("prompt_lookup", 0, "num_draft_tokens"), ("prompt_lookup", 99, "num_draft_tokens"),
    (None, 4, "num_draft_tokens needs speculative"), (3, None, "speculative must be"),
    ({"min_ngram": 5, "max_ngram": 2}, None, "min_ngram"),
])
def test_bad_speculative_settings_name_the_field(value, k, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(speculative=value, num_draft_tokens=k).validate()


def test_speculative_settings_parse():
    assert parse_speculative("off") == "off" and parse_speculative(None) is None
    assert parse_speculative("prompt_lookup", 6) == SpecConfig(num_draft_tokens=6)
    assert parse_speculative({"method": "prompt_lookup", "max_ngram": 3}) == SpecConfig(max_ngram=3)


# -- cache rollback ------------------------------------------------------------------------
def _cache(rows: int, cols: int, pads) -> FullKV:
    c = FullKV(rows, pads)
    k = mx.arange(rows * cols).reshape(rows, 1, cols, 1).astype(mx.float32)
    c.update_and_fetch(k, k + 100)
    return c


def test_trim_rows_keeps_each_rows_accepted_positions():
    c = _cache(3, 6, [2, 0, 1])
    c.trim_rows([1, 3, 2])
    assert c.idx == 5 and c.left_pad == [2, 2, 2]
    assert [c.row_length(r) for r in range(3)] == [3, 3, 3]
    keys = c.keys[..., : c.idx, 0]
    # Each row's kept columns are its first written (non-pad) ones, right-aligned at idx.
    assert keys[0, 0, 2:].tolist() == [2, 3, 4]
    assert keys[1, 0, 2:].tolist() == [6, 7, 8]
    assert keys[2, 0, 2:].tolist() == [13, 14, 15]
    assert c.values[2, 0, 2:5, 0].tolist() == [113, 114, 115]
    assert c.offset.tolist() == [3, 3, 3]


def test_trim_rows_with_equal_counts_moves_the_write_column_only():
    c = _cache(2, 4, [0, 1])
    c.trim_rows([2, 2])
    assert c.idx == 2 and c.left_pad == [0, 1] and c.keys[0, 0, :2, 0].tolist() == [0, 1]


def test_trim_rows_refuses_more_than_a_row_holds():
    c = _cache(2, 4, [0, 3])
    with pytest.raises(ValueError, match="exceed"):
        c.trim_rows([0, 2])


# -- greedy output is the target's ---------------------------------------------------------
def _oracle(refs: dict, vocab: int):
    """Drafts from the reference continuation, with a wrong token at a position that moves with
    the step, so steps accept all, some or none of their drafts (and rows differ)."""

    def draft(req, k):
        ref = refs[tuple(req.prompt_ids)]
        n = len(req.output_ids)
        d = list(ref[n:n + k])
        bad = (n * 7 + len(req.prompt_ids)) % (k + 2)
        if bad < len(d):
            d[bad] = (d[bad] + 1) % vocab
        return d

    return draft


@pytest.mark.parametrize("shrink", [True, False])
def test_a_rejected_draft_halves_k_only_where_longer_drafts_cost_more(model_dir, shrink):
    from graphc.runtime.speculative.config import SpecConfig
    from graphc.runtime.speculative.prompt_lookup import NgramIndex
    from graphc.runtime.speculative.speculator import _RowState

    spec = Engine.load(model_dir("llama")).speculator
    spec.shrink_k = shrink

    class Req:
        pass

    lookup, drafter = Req(), Req()
    spec._rows[lookup] = _RowState(SpecConfig(num_draft_tokens=16), NgramIndex(), 16)
    spec._rows[drafter] = _RowState(SpecConfig(method="draft_model", num_draft_tokens=16), NgramIndex(), 16)
    spec._learn(lookup, 16, 0)
    spec._learn(drafter, 16, 0)
    assert spec._rows[lookup].k == (8 if shrink else 16)
    assert spec._rows[drafter].k == 8  # a draft model's drafts cost a step each: it always shrinks
    spec._learn(lookup, 5, 5)  # a whole draft accepted: k grows back toward the most
    assert spec._rows[lookup].k == (9 if shrink else 16)


def test_greedy_identical_when_k_never_shrinks(model_dir):
    """The GPU policy (k kept at its most after a rejection), run on the CPU: output unchanged."""
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)
    eng.speculator.shrink_k = False
    prompts = random_prompts(3, eng.vocab_size, [5, 40, 17], seed=7)
    refs = {tuple(p): reference_greedy(eng.model, p, 40) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    params = SamplingParams(max_tokens=40, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=8)
    assert [r.token_ids for r in eng.generate(prompts, params)] == [refs[tuple(p)] for p in prompts]
    assert eng.stats["spec_steps"] > 0


CASES = [("llama", "dense", "auto", None), ("qwen3", "dense", "auto", None), ("llama", "dense_noprefix", "auto", None),
         ("llama", "dense", "generic", None), ("llama", "dense", "auto", True)]


@pytest.mark.parametrize("arch, graph, lowering, compile", CASES)
def test_greedy_identical_with_partly_wrong_drafts(model_dir, arch, graph, lowering, compile):
    # compile=True: plain steps run the compiled decode path on the caches verify steps trimmed.
    eng = Engine.load(model_dir(arch), graph, prefill_chunk=16, lowering=lowering, compile=compile,
                      spec_max_tokens=WIDE)
    prompts = random_prompts(5, eng.vocab_size, [5, 40, 17, 1, 23], seed=3)
    refs = {tuple(p): reference_greedy(eng.model, p, 40) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    out = eng.generate(prompts, SPEC)
    for p, r in zip(prompts, out):
        assert r.token_ids == refs[tuple(p)]
    s = eng.stats
    assert s["spec_steps"] > 0 and 0 < s["spec_accepted_tokens"] < s["spec_drafted_tokens"]
    # Fewer forwards than tokens: the accepted drafts came for free.
    assert s["spec_emitted_tokens"] > s["spec_steps"] * 1.5
    assert [r.token_ids for r in eng.generate(prompts, PLAIN)] == [refs[tuple(p)] for p in prompts]
    if compile:  # the plain steps between verify steps did run compiled, on the trimmed caches,
        assert eng.compiled.decode.compiled_steps > 0  # and the verify steps ran traced too
        assert eng.compiled.decode.verify_steps > 0


@pytest.mark.parametrize("arch, graph, compile", [("llama", "dense", None), ("llama", "dense_noprefix", None),
                                                   ("qwen3", "dense", None), ("llama", "dense", True)])
def test_pipelined_verify_keeps_greedy_output(model_dir, arch, graph, compile):
    """Verify N + 1 queued on N's lazy bonus token, assuming full acceptance: kept when N accepted
    everything, discarded (positions trimmed) when it did not; tokens stay the target's own,
    with rows finishing at different lengths (their leaving discards a verify in flight)."""
    eng = Engine.load(model_dir(arch), graph, prefill_chunk=16, spec_max_tokens=WIDE, spec_pipeline=True,
                      compile=compile)
    prompts = random_prompts(4, eng.vocab_size, [5, 40, 17, 23], seed=3)
    lengths = [40, 13, 27, 40]
    refs = {tuple(p): reference_greedy(eng.model, p, n) for p, n in zip(prompts, lengths)}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    out = eng.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True, speculative="prompt_lookup",
                                                num_draft_tokens=4) for n in lengths])
    assert [r.token_ids for r in out] == [refs[tuple(p)] for p in prompts]
    s = eng.stats
    assert s["spec_pipeline_discards"] > 0  # rows leaving, drafts rejected
    # One row at a time, the same partly wrong drafts: pipelined verifies kept and discarded.
    before = dict(s)
    for p, n in zip(prompts, lengths):
        [r] = eng.generate([p], SamplingParams(max_tokens=n, ignore_eos=True, speculative="prompt_lookup",
                                               num_draft_tokens=4))
        assert r.token_ids == refs[tuple(p)]
    assert s["spec_pipelined_steps"] > before["spec_pipelined_steps"]
    assert s["spec_pipeline_discards"] > before["spec_pipeline_discards"]
    # Exact drafts: every verify after the first is the pipelined one.
    [p] = prompts[:1]
    eng.speculator.drafter = lambda req, k: refs[tuple(p)][len(req.output_ids):len(req.output_ids) + k]
    before = dict(s)
    [r] = eng.generate([p], SPEC)
    assert r.token_ids == refs[tuple(p)]
    steps = s["spec_steps"] - before["spec_steps"]
    assert s["spec_pipelined_steps"] - before["spec_pipelined_steps"] >= steps - 2
    if compile:
        assert eng.compiled.decode.verify_steps >= s["spec_steps"] - 2  # traced (padded L), kept exact


def test_pipelined_prompt_lookup_matches_plain_decoding(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE, spec_pipeline=True)
    prompts = [p * 3 for p in random_prompts(3, eng.vocab_size, [9, 14, 6], seed=8)]
    plain = [r.token_ids for r in eng.generate(prompts, PLAIN)]
    assert [r.token_ids for r in eng.generate(prompts, SPEC)] == plain
    assert [r.token_ids for r in eng.generate(prompts[:1], SPEC)] == plain[:1]
    assert eng.stats["spec_accepted_tokens"] > 0


def test_prompt_lookup_on_repetitive_prompts_matches_plain_decoding(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)
    prompts = [p * 3 for p in random_prompts(3, eng.vocab_size, [9, 14, 6], seed=8)]
    plain = [r.token_ids for r in eng.generate(prompts, PLAIN)]
    assert [r.token_ids for r in eng.generate(prompts, SPEC)] == plain
    assert eng.stats["spec_accepted_tokens"] > 0


def test_engine_default_and_per_request_off(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, speculative="prompt_lookup", num_draft_tokens=3,
                      spec_max_tokens=WIDE)
    prompts = [p * 3 for p in random_prompts(2, eng.vocab_size, [7, 11], seed=2)]
    eng.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True, speculative="off"))
    assert eng.stats["spec_steps"] == 0
    on = eng.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert eng.stats["spec_steps"] > 0
    assert [r.token_ids for r in on] == [reference_greedy(eng.model, p, 24) for p in prompts]


def test_off_for_large_batches_and_sampled_rows(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=64, spec_max_batch=3, spec_max_tokens=WIDE)
    prompts = [p * 3 for p in random_prompts(3, eng.vocab_size, [7, 11, 5], seed=2)]
    eng.speculator.drafter = lambda req, k: [1] * k
    eng.generate(prompts, SPEC)  # 3 rows >= spec_max_batch 3
    assert eng.stats["spec_steps"] == 0
    sampled = SamplingParams(max_tokens=8, temperature=0.8, seed=1, speculative="prompt_lookup")
    eng.generate(prompts[:1], sampled)
    assert eng.stats["spec_steps"] == 0
    eng.generate(prompts[:2], SPEC)  # 2 rows: on
    assert eng.stats["spec_steps"] > 0


def test_max_tokens_is_never_overshot(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)
    eng.speculator.drafter = lambda req, k: [7] * k
    [p] = random_prompts(1, eng.vocab_size, [12], seed=4)
    ref = reference_greedy(eng.model, p, 9)
    eng.speculator.drafter = lambda req, k: ref[len(req.output_ids):len(req.output_ids) + k]
    [r] = eng.generate([p], SamplingParams(max_tokens=9, ignore_eos=True, speculative="prompt_lookup"))
    assert r.token_ids == ref and r.finish_reason == "length"


def test_prefix_cache_stores_only_accepted_tokens(model_dir):
    """A request after a speculative one reuses its prompt + output from the prefix cache; the
    KV it gathers must be the accepted sequence's (rejected drafts were trimmed)."""
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)
    [p] = random_prompts(1, eng.vocab_size, [30], seed=9)
    ref = reference_greedy(eng.model, p, 40)
    eng.speculator.drafter = _oracle({tuple(p): ref}, eng.vocab_size)
    [first] = eng.generate([p], SPEC)
    assert first.token_ids == ref and eng.stats["spec_drafted_tokens"] > eng.stats["spec_accepted_tokens"]
    follow = p + ref[:30]
    [second] = eng.generate([follow], PLAIN)
    assert second.cached_tokens >= len(p) + 16
    assert second.token_ids == reference_greedy(eng.model, follow, 40)


def test_windowed_model_is_off_with_the_reason(model_dir):
    eng = Engine.load(model_dir("gemma3_text"), prefill_chunk=16)
    assert "windowed" in eng.speculator.problem or "cannot remove" in eng.speculator.problem
    with pytest.raises(ValueError, match="speculative decoding is off for this model"):
        eng.add_request([1, 2, 3], SamplingParams(speculative="prompt_lookup"))
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=2, speculative="off"))  # asking for off is fine
    verify = [s for s in eng.compiled.plan("decode").steps if s.op == "verify"]
    assert verify and "OFF for this model" in verify[0].detail


def test_inspect_shows_the_verify_node(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)
    decode = eng.compiled.plan("decode")
    [step] = [s for s in decode.steps if s.op == "verify"]
    assert step.when == "rows that ask" and "rejected positions trimmed" in step.detail
    assert all(s.op != "verify" for s in eng.compiled.plan("prefill").steps)


# -- bench ---------------------------------------------------------------------------------
@pytest.mark.parametrize("gated", [False, True])
def test_bench_grounded_workload_reports_both_modes(tmp_path, monkeypatch, gated):
    """With the measured gate on (the default outside tests), an ungated third mode runs the
    same speculative requests."""
    import json

    from graphc.cli import main as graphc_main
    from graphc.runtime.speculative import speculator

    monkeypatch.setattr(speculator, "default_adaptive", lambda: gated)
    out = tmp_path / "grounded.json"
    assert graphc_main(["bench", "--user-api", "--user-workloads", "grounded", "--model", "tiny", "--batches", "1,2",
                        "--long-new", "12", "--short-new", "4", "--user-repeats", "3", "--no-compile", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = [r for r in res["rows"] if r["workload"] == "grounded"]
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        modes = {"plain", "speculative"} | ({"ungated"} if gated else set())
        assert set(r["values"]) == modes and len(r["values"]["plain"]["runs"]) == 3
        assert "speculative/plain" in r["ratios"] and 0 <= r["acceptance"] <= 1
        assert ("speculative/ungated" in r["ratios"]) == gated and (r["gate"] is not None) == gated
        if r["verify_steps"]:
            assert set(r["verify_ms"]) == {"draft", "build", "wait", "post"} and r["verify_ms"]["build"] > 0
    assert not any("differs" in n or "cold prefill" in n for n in res["notes"])


def test_bench_grounded_blames_a_cold_prefill_difference_on_the_cache_not_speculation(tmp_path, monkeypatch):
    """Outputs are compared at one cache state; a cold plain run that differs from the cached plain
    run (bf16 rounding of another prefill shape, seen on the H200) gets its own note."""
    import json

    from graphc.cli import main as graphc_main
    from graphc.runtime import Engine

    generate, calls = Engine.generate, []

    def first_differs(self, prompts, params=None, *a, **k):
        res = generate(self, prompts, params, *a, **k)
        calls.append(1)
        if len(calls) == 1:  # the cold run
            import attr

            res = [attr.evolve(r, token_ids=[t ^ 1 for t in r.token_ids]) for r in res]
        return res

    monkeypatch.setattr(Engine, "generate", first_differs)
    out = tmp_path / "grounded.json"
    assert graphc_main(["bench", "--user-api", "--user-workloads", "grounded", "--model", "tiny", "--batches", "1",
                        "--long-new", "8", "--short-new", "4", "--user-repeats", "3", "--no-compile", "--json", str(out)]) == 0
    notes = json.loads(out.read_text())["notes"]
    assert any("cold prefill" in n for n in notes) and not any("differs" in n for n in notes)


# -- draft model ---------------------------------------------------------------------------
@pytest.mark.parametrize("draft", ["self", "other"])
def test_draft_model_greedy_identical(model_dir, draft):
    """The target as its own draft model (drafts always right) and another random model of the same
    tokenizer (drafts mostly wrong): output is the target's greedy output either way."""
    target = model_dir("llama")
    path = target if draft == "self" else model_dir("llama", seed=5)
    eng = Engine.load(target, prefill_chunk=16, draft_model=path, num_draft_tokens=3, spec_max_tokens=WIDE)
    prompts = random_prompts(3, eng.vocab_size, [6, 30, 13], seed=12)
    out = eng.generate(prompts, PLAIN)  # the engine's default is now "draft_model"
    for p, r in zip(prompts, out):
        assert r.token_ids == reference_greedy(eng.model, p, 40)
    s = eng.stats
    assert s["spec_steps"] > 0
    if draft == "self":
        assert s["spec_accepted_tokens"] == s["spec_drafted_tokens"]
    else:
        assert s["spec_accepted_tokens"] < s["spec_drafted_tokens"]


def test_draft_model_method_needs_a_draft_model(model_dir):
    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)
    with pytest.raises(ValueError, match="needs a draft model"):
        eng.add_request([1, 2, 3], SamplingParams(speculative="draft_model"))


def test_draft_model_with_another_tokenizer_is_refused(model_dir):
    from graphc.runtime.speculative import DraftModel

    eng = Engine.load(model_dir("llama"), prefill_chunk=16, spec_max_tokens=WIDE)

    class Other:
        def get_vocab(self):
            return {str(i): i for i in range(7)}

        def encode(self, s):
            return [1, 2]

    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        DraftModel(eng.model, Other(), target_tokenizer=eng.tokenizer, path="other")


def test_rows_without_matches_stop_breaking_the_chain(model_dir, monkeypatch):
    """When prompt lookup finds nothing, the row pauses looking and its plain steps chain again
    (the next step is queued before the host reads the current one)."""
    eng = Engine.load(model_dir("llama"), prefill_chunk=64, speculative="prompt_lookup", spec_max_tokens=WIDE)
    monkeypatch.setattr(NgramIndex, "draft", lambda self, tokens, k: [])
    [p] = random_prompts(1, eng.vocab_size, [8], seed=21)
    eng.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True))
    chained = 0
    while eng.has_unfinished():
        eng.step()
        chained += eng.runner.pending is not None
    assert eng.stats["spec_steps"] == 0
    # 40 steps: unchained while looking (4 of every 4 + 16), chained while paused.
    assert chained >= 25


def test_verify_position_budget(model_dir):
    """rows x (k + 1) stays within spec_max_tokens: k shrinks to fit, and a batch where no row
    fits 2 positions decodes plainly."""
    # Pipelined off: a pipelined guess asks the drafter for k + 1 (the bonus token's stand-in too).
    eng = Engine.load(model_dir("llama"), prefill_chunk=64, spec_max_tokens=4, spec_pipeline=False)
    prompts = [p * 3 for p in random_prompts(3, eng.vocab_size, [7, 11, 5], seed=2)]
    seen = []
    eng.speculator.drafter = lambda req, k: seen.append(k) or [1] * k
    eng.generate(prompts, SPEC)  # 3 rows: 4 // 3 = 1 position each -> off
    assert eng.stats["spec_steps"] == 0 and not seen
    out = eng.generate(prompts[:2], SPEC)  # 2 rows: 2 positions each -> k = 1
    assert eng.stats["spec_steps"] > 0 and set(seen) == {1}
    assert [r.token_ids for r in out] == [reference_greedy(eng.model, p, 40) for p in prompts[:2]]


def test_the_docs_first_example_runs():
    """docs/speculative.md's first Python example, as written (the built-in demo model)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "speculative.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "docs/speculative.md", "exec"), {})


def test_default_draft_length_follows_the_device(monkeypatch):
    """GPU, where a verify forward's cost barely grows with its positions: prompt lookup drafts up to
    16 (its drafts cost nothing), a draft model 8 (each draft is a step of it); CPU: 4."""
    import mlx.core as mx

    from graphc.runtime.speculative.config import SpecConfig, parse_speculative

    assert SpecConfig().num_draft_tokens == 4 and parse_speculative("prompt_lookup").num_draft_tokens == 4
    assert SpecConfig(method="draft_model").num_draft_tokens == 4
    monkeypatch.setattr(mx, "default_device", lambda: mx.gpu)
    assert SpecConfig().num_draft_tokens == 16 and parse_speculative("prompt_lookup").num_draft_tokens == 16
    assert SpecConfig(method="draft_model").num_draft_tokens == 8
    assert parse_speculative("prompt_lookup", 3).num_draft_tokens == 3


def test_bench_dequantize_measures_the_same_weights_unquantized(model_dir, tmp_path):
    """`graphc bench --user-api --dequantize`: a quantized folder runs with its weights dequantized
    (no quantized layer left, the same logits within rounding); a folder that is not quantized is
    refused with the reason."""
    import json
    import shutil

    import mlx.nn as nn
    import mlx_lm
    from mlx_lm.utils import quantize_model, save_config, save_model

    from graphc.benchmarks.shapes import load_shape

    src = model_dir("llama")
    model, _ = mlx_lm.load(str(src))
    config = json.loads((src / "config.json").read_text())
    model, config = quantize_model(model, config, group_size=32, bits=8)
    q = tmp_path / "q8"
    q.mkdir()
    save_model(q, model)
    save_config(config, q / "config.json")
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, q / f.name)
    deq, _, cfg, label = load_shape(str(q), "float32", dequantize=True)
    assert "quantization" not in cfg and "dequantized to float32" in label
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in deq.named_modules())
    toks = mx.array([[3, 5, 7, 9]])
    assert mx.allclose(deq(toks), model(toks), atol=1e-3, rtol=1e-3).item()
    with pytest.raises(SystemExit, match="not quantized"):
        load_shape(str(src), "float32", dequantize=True)
    with pytest.raises(SystemExit, match="random unquantized"):
        load_shape("tiny", "float32", dequantize=True)


def test_the_runner_is_built_with_the_engines_speculator_and_kernel_views(model_dir):
    """The Engine hands the runner its speculator and kernel views at construction (nothing is
    assigned into the runner afterwards: tests/test_component_wiring.py); the speculator is given
    the engine's end-of-sequence ids and stats dict as values."""
    eng = Engine.load(model_dir("llama"))
    spec = eng.speculator
    assert eng.runner.speculator is spec and spec is not None
    assert eng.runner.views is spec.views and spec.views is not None
    assert spec.eos_token_ids == eng.eos_token_ids and spec.eos_token_ids is not eng.eos_token_ids
    assert spec.stats is eng.stats and "spec_steps" in eng.stats and "preemptions" in eng.stats
