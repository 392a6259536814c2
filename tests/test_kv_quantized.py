"""Quantized KV (`kv_bits`, runtime/cache/quantized.py): checked against mlx-lm's own QuantizedKVCache.

The metric (benchmarks/kv_quantized.py): mlx-lm's forward on QuantizedKVCache decodes each
prompt greedily; graphc runs the same tokens teacher-forced (prompts prefilled alone in
chunks, joined into one left-padded decode batch) and at every position the reference
token's log-probability is compared: mean |logprob diff| and top-1 agreement. On these float32
models graphc computes the same codes and the same quantized attention, so the bound is tight:
graphc's own unquantized KV against the same reference is off by 5e-3 (8 bits) and 8e-2
(4 bits) and fails it (asserted below, so the bound is known to catch a cache that ignores
kv_bits).
"""

from __future__ import annotations

import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from graphc.benchmarks.kv_quantized import (graphc_teacher_forced, kv_bytes_per_token, logprob_agreement,
                                            quantized_reference_caches, reference_run)
from graphc.cli import main as cli
from graphc.compiler.compile import compile_graph
from graphc.compiler.errors import GraphError, UnsupportedModel
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.lower import StepInputs
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.quantized import QuantizedKV
from helpers import random_prompts

# head_dim 64: mx.quantize groups of 64 (mlx-lm's default) fit; 2 layers, 4 heads, 2 KV heads.
DIMS = dict(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64)
MEAN_LOGPROB_BOUND = 1e-3  # graphc vs mlx-lm's QuantizedKVCache, float32 model
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama", **DIMS)


def reference_greedy_q(model, prompt, n, bits, group_size=64):
    """mlx-lm's generate_step on its QuantizedKVCache, one prompt at a time, greedy."""
    caches = quantized_reference_caches(model, bits, group_size)
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=caches)]


@pytest.mark.parametrize("bits", [8, 4])
def test_logprobs_match_mlx_lm_quantized_cache_batched_and_chunked(llama, bits):
    eng = Engine.load(llama, kv_bits=bits, prefill_chunk=16)
    assert {p.name for p in eng.compiled.binding.policies} == {"quantized"}
    prompts = random_prompts(4, eng.vocab_size, [37, 9, 64, 21], seed=3)
    ref = [reference_run(eng.model, p, 24, quantized_reference_caches(eng.model, bits)) for p in prompts]
    tokens = [t for t, _ in ref]
    got, caches = graphc_teacher_forced(eng, prompts, tokens, chunk=16)
    assert isinstance(caches[0], QuantizedKV) and any(caches[0].left_pad)  # rows really left-padded
    m = logprob_agreement(got, [r for _, r in ref], tokens)
    assert m["positions"] == 4 * 24
    assert m["mean_abs_logprob_diff"] < MEAN_LOGPROB_BOUND and m["top1_agreement"] == 1.0, m
    # The bound catches a cache that does not quantize: graphc's bf16/float KV on the same tokens.
    plain, _ = graphc_teacher_forced(Engine.load(llama, prefill_chunk=16), prompts, tokens, chunk=16)
    broken = logprob_agreement(plain, [r for _, r in ref], tokens)
    assert broken["mean_abs_logprob_diff"] > 3 * MEAN_LOGPROB_BOUND, broken


@pytest.mark.parametrize("bits", [8, 4])
def test_engine_greedy_equals_mlx_lm_quantized_and_batched_equals_unbatched(llama, bits):
    eng = Engine.load(llama, kv_bits=bits, prefill_chunk=16)
    prompts = random_prompts(5, eng.vocab_size, [5, 40, 17, 1, 23], seed=7)
    batched = [r.token_ids for r in eng.generate(prompts, GREEDY)]
    want = [reference_greedy_q(eng.model, p, 16, bits) for p in prompts]
    assert batched == want
    one = Engine.load(llama, kv_bits=bits, prefill_chunk=16, max_batch=1, batch_prefill=False)
    assert [one.generate([p], GREEDY)[0].token_ids for p in prompts] == batched
    # Logprobs of the chosen tokens: batched rows within rounding of the same rows alone.
    lp = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0)
    a = [r.logprobs for r in eng.generate(prompts, lp)]
    b = [one.generate([p], lp)[0].logprobs for p in prompts]
    for x, y in zip(a, b):
        np.testing.assert_allclose([e["logprob"] for e in x], [e["logprob"] for e in y], atol=1e-4)


@pytest.mark.parametrize("bits", [8, 4])
def test_prefix_hits_restore_the_codes_a_cold_run_computed(llama, bits):
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 900, 37).tolist()
    prompts = [shared + rng.integers(3, 900, k).tolist() for k in (6, 1, 19)] + [shared[:20]]
    prompts.append(list(prompts[0]))  # a full-prefix hit
    cold = Engine.load(llama, kv_bits=bits, prefill_chunk=16, prefix_cache=False)
    assert cold.prefix is None
    want = [r.token_ids for r in cold.generate(prompts, GREEDY)]
    eng = Engine.load(llama, kv_bits=bits, prefill_chunk=16, max_total_tokens=512)
    got = [eng.generate([p], GREEDY)[0] for p in prompts]
    assert [r.token_ids for r in got] == want
    assert [r.cached_tokens for r in got] == [0, 37, 37, 19, len(prompts[0]) - 1]
    pool = eng.runner.prefix_io.pool
    # Six planes kept at their own dtypes: packed codes, then scales and biases in the model's dtype.
    assert [a.dtype for a in pool.planes[0]] == [mx.uint32, mx.uint32] + [mx.float32] * 4
    eng.prefix.check()


def _oracle(refs: dict, vocab: int):
    """Drafts from the reference continuation with one wrong token at a moving position, so
    verify steps accept all, some or none of their drafts and the caches roll back."""

    def draft(req, k):
        n = len(req.output_ids)
        d = list(refs[tuple(req.prompt_ids)][n:n + k])
        bad = (n * 7 + len(req.prompt_ids)) % (k + 2)
        if bad < len(d):
            d[bad] = (d[bad] + 1) % vocab
        return d

    return draft


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("bits", [8, 4])
def test_speculative_rollback_keeps_greedy_output(llama, bits, compiled):
    eng = Engine.load(llama, kv_bits=bits, compile=compiled, prefill_chunk=16, spec_max_tokens=64)
    assert eng.speculator.problem is None  # QuantizedKV trims per row like FullKV
    prompts = random_prompts(4, eng.vocab_size, [5, 40, 17, 23], seed=3)
    refs = {tuple(p): reference_greedy_q(eng.model, p, 30, bits) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    spec = SamplingParams(max_tokens=30, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
    out = eng.generate(prompts, spec)
    assert [r.token_ids for r in out] == [refs[tuple(p)] for p in prompts]
    s = eng.stats
    assert s["spec_steps"] > 0 and 0 < s["spec_accepted_tokens"] < s["spec_drafted_tokens"]
    if compiled:
        assert eng.compiled.decode.verify_steps > 0  # verify forwards ran compiled on the codes too


def test_trim_rows_drops_every_plane():
    c = QuantizedKV.with_format(8, 32)(2, [1, 0])
    k = mx.random.normal((2, 1, 6, 32))
    c.update_and_fetch(k, k + 1)
    before = {n: np.array(getattr(c, n)[..., :6, :]) for n in c.PLANES}
    c.trim_rows([1, 3])
    assert c.idx == 5 and c.left_pad == [1, 2]
    for n in c.PLANES:  # row 1 keeps its first 3 columns, right-aligned at idx
        np.testing.assert_array_equal(np.array(getattr(c, n)[1, :, 2:5]), before[n][1, :, 0:3])
        np.testing.assert_array_equal(np.array(getattr(c, n)[0, :, 1:5]), before[n][0, :, 1:5])


def test_bytes_per_token_from_the_arrays(llama):
    cfg = json.loads((llama / "config.json").read_text())
    H, D, L = cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_hidden_layers"]
    prompt = list(range(3, 60))
    seen = {}
    for bits in (None, 8, 4):
        eng = Engine.load(llama, kv_bits=bits, prefix_cache=False)
        caches = [p.new_cache() for p in eng.compiled.binding.policies]
        eng.compiled.prefill(StepInputs(mx.array(prompt, dtype=mx.int32)[None], caches, final=True))
        got = kv_bytes_per_token(caches)
        assert got["total"] == sum(p.bytes_per_token() for p in eng.compiled.binding.policies)
        seen[bits] = got["total"]
    # float32 model: K and V rows of D floats; quantized: D*bits/8 bytes of codes + a float32
    # scale and bias per 64 values.
    assert seen[None] == L * 2 * H * D * 4
    assert seen[8] == L * 2 * H * (D + 2 * 4 * D // 64)
    assert seen[4] == L * 2 * H * (D // 2 + 2 * 4 * D // 64)


def test_inspect_says_not_exact(llama):
    model, _ = mlx_lm.load(str(llama))
    config = json.loads((llama / "config.json").read_text())
    compiled = compile_graph(None, model, config, kv_bits=4)
    text = inspect_plan(compiled, "decode", trace=False)
    assert "not exact" in text and "quantized(bits=4, group_size=64" in text
    assert "prefix reuse off" not in text
    assert "not exact" not in inspect_plan(compile_graph(None, model, config), "decode", trace=False)


def test_inspect_cli_flag(llama, capsys):
    assert cli(["inspect", "auto", "--model", str(llama), "--kv-bits", "8", "--no-trace"]) == 0
    assert "quantized(bits=8" in capsys.readouterr().out


def test_the_graph_cache_section_declares_it(llama, tmp_path):
    g = tmp_path / "q.yaml"
    from graphc.compiler.parse import resolve_graph_path

    text = resolve_graph_path("dense").read_text()
    assert "{policy: pool_backed}" in text
    g.write_text(text.replace("{policy: pool_backed}", "{policy: quantized, bits: 4, group_size: 32}"))
    eng = Engine.load(llama, graph=str(g))
    assert eng.compiled.binding.policies[0].describe().startswith("quantized(bits=4, group_size=32")
    assert eng.prefix is not None
    prompts = random_prompts(2, eng.vocab_size, [12, 30], seed=1)
    assert [r.token_ids for r in eng.generate(prompts, GREEDY)] == [
        reference_greedy_q(eng.model, p, 16, 4, 32) for p in prompts]


def test_dense_noprefix_with_kv_bits_stays_without_prefix_cache(llama):
    eng = Engine.load(llama, graph="dense_noprefix", kv_bits=8)
    assert eng.prefix is None and eng.compiled.binding.policies[0].name == "quantized"
    assert "prefix=false" in eng.compiled.binding.policies[0].describe()


@pytest.mark.parametrize("kw, words", [
    (dict(kv_bits=3), "bits (kv_bits) must be one of (4, 8)"),
    (dict(kv_bits=8, kv_group_size=48), "group_size (kv_group_size) must be one of"),
    (dict(kv_group_size=32), "kv_group_size is a setting of kv_bits"),
])
def test_bad_settings_name_the_option(llama, kw, words):
    with pytest.raises((ValueError, GraphError), match=words.replace("(", r"\(").replace(")", r"\)")):
        Engine.load(llama, **kw)


def test_head_dim_that_no_group_fits_names_the_option(model_dir):
    small = model_dir("llama")  # head_dim 16: no mx.quantize group size divides it
    with pytest.raises(GraphError, match=r"head_dim 16 is not a multiple of group_size \(kv_group_size\) 64"):
        Engine.load(small, kv_bits=8)
    mid = model_dir("llama", hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32)
    with pytest.raises(GraphError, match=r"use group_size \(kv_group_size\) 32"):
        Engine.load(mid, kv_bits=4)
    assert Engine.load(mid, kv_bits=4, kv_group_size=32).compiled.binding.policies[0].params["group_size"] == 32


def test_attention_sinks_are_refused_not_served_unquantized(model_dir):
    """mlx-lm's quantized attention has no sinks (gpt-oss): an error naming kv_bits, never a
    silent fallback to unquantized caches."""
    d = model_dir("gpt_oss", hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(UnsupportedModel, match="kv_bits"):
        Engine.load(d, kv_bits=8)


def test_a_backend_without_quantized_attention_says_what_to_do(llama, monkeypatch):
    """Where MLX's quantized_matmul has no kernel for the attention (its CUDA backend at head dim
    64), the load names kv_bits, keeps the backend's message and says to serve without it."""
    from graphc.compiler import compile as compile_module

    plain = compile_module.reference_run

    def no_kernel(*a, **k):
        if "make_caches" not in k:  # the bf16 reference runs as ever; the quantized one has no kernel
            return plain(*a, **k)
        raise UnsupportedModel("model type 'llama': mlx-lm's own forward with its own caches failed on a "
                               "7-token prompt: RuntimeError: [quantized_matmul] No implementation for problem "
                               "shape: 7x7x64x32, transpose: true")

    monkeypatch.setattr(compile_module, "reference_run", no_kernel)
    with pytest.raises(UnsupportedModel, match=r"kv_bits.*No implementation.*serve without --kv-bits"):
        Engine.load(llama, kv_bits=8)


def test_a_plugin_policy_is_not_replaced_silently(llama):
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "kv_int8.yaml"
    with pytest.raises(ValueError, match="kv_bits=8: graph .* policy 'kv_int8', which kv_bits does not replace"):
        Engine.load(llama, graph=str(example), kv_bits=8)


def test_serve_flag_reaches_the_engine(llama, monkeypatch):
    from graphc.runtime.server import state
    from graphc.runtime.server.cli import add_parser, config_from_args
    import argparse

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    args = p.parse_args(["serve", "--model", str(llama), "--kv-bits", "4", "--kv-group-size", "32"])
    cfg = config_from_args(args)
    assert (cfg.kv_bits, cfg.kv_group_size) == (4, 32)
    seen = {}
    monkeypatch.setattr(state.Engine, "load", classmethod(lambda cls, *a, **kw: seen.update(kw)))
    state.load_engine(cfg)
    assert (seen["kv_bits"], seen["kv_group_size"]) == (4, 32)
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--kv-bits", "3"])


# -- the real model: SmolLM2-135M-Instruct (Q4_1 GGUF, tests/real_model.py; skipped when absent) ----

@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from real_model import smollm2_folder

    return smollm2_folder(tmp_path_factory)


QUESTIONS = ("What is the capital of France?", "Name three primary colors.")


def _mlx_lm_forced(model, prompt: list[int], tokens: list[int]) -> list:
    """mlx-lm's float32 logits along `tokens` on its plain (unquantized) caches: one forward."""
    y = model(mx.array(prompt + tokens[:-1])[None], cache=make_prompt_cache(model))[0].astype(mx.float32)
    return [y[len(prompt) - 1 + i] for i in range(len(tokens))]


# The real-model quality report runs with -m slow (MLX's CPU quantized matmul makes each real-model
# token slow: ~23 s for 4 bits on one question); the tiny models above check the same comparison
# in the default run.
@pytest.mark.slow
@pytest.mark.parametrize("bits,questions", [(4, 1), (8, 2)])
def test_smollm2_logprobs_match_mlx_lm_quantized_cache(smol, bits, questions):
    """Chat prompts, 6 teacher-forced tokens each, against mlx-lm on its QuantizedKVCache; the
    bound is tight enough that unquantized KV (mlx-lm's plain caches) falls outside it."""
    eng = Engine.load(smol, kv_bits=bits, prefill_chunk=16)
    tok = eng.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in QUESTIONS[:questions]]
    ref = [reference_run(eng.model, p, 6, quantized_reference_caches(eng.model, bits)) for p in prompts]
    tokens = [t for t, _ in ref]
    got, _ = graphc_teacher_forced(eng, prompts, tokens, chunk=16)
    m = logprob_agreement(got, [r for _, r in ref], tokens)
    assert m["mean_abs_logprob_diff"] < MEAN_LOGPROB_BOUND and m["top1_agreement"] == 1.0, m
    plain = [_mlx_lm_forced(eng.model, p, t) for p, t in zip(prompts, tokens)]
    broken = logprob_agreement(plain, [r for _, r in ref], tokens)
    assert broken["mean_abs_logprob_diff"] > 3 * MEAN_LOGPROB_BOUND, broken


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "qwen3_next"])
def test_other_families_quantize_their_full_attention_layers_only(model_dir, arch):
    """qwen3 (dense), gemma3 (sliding + full: windowed layers stay unquantized), qwen3_next (linear
    attention + full: recurrent state stays): batched greedy equals mlx-lm on QuantizedKVCache for
    the full-attention layers, and prefix hits equal cold runs."""
    d = model_dir(arch, **DIMS)
    eng = Engine.load(d, kv_bits=4, prefill_chunk=16, max_total_tokens=1024)
    names = [p.name for p in eng.compiled.binding.policies]
    kinds = [l.kind for l in eng.compiled.binding.layers]
    assert [n == "quantized" for n in names] == [k == "full_attention" for k in kinds] and "quantized" in names
    prompts = random_prompts(3, eng.vocab_size, [40, 5, 23], seed=9)
    got = [r.token_ids for r in eng.generate(prompts, GREEDY)]
    assert got == [reference_greedy_q(eng.model, p, 16, 4) for p in prompts]
    shared = prompts[0]
    again = [eng.generate([shared + [7, 8, 9]], GREEDY)[0] for _ in range(2)]
    cold = Engine.load(d, kv_bits=4, prefill_chunk=16, prefix_cache=False).generate([shared + [7, 8, 9]], GREEDY)[0]
    assert [r.token_ids for r in again] == [cold.token_ids] * 2
    assert again[1].cached_tokens > 0


def test_generate_cli_takes_the_flag(llama, capsys):
    assert cli(["generate", "hello there", "--model", str(llama), "--kv-bits", "4", "--max-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()
