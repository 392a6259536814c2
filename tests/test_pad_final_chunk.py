"""pad_final_chunk: a prompt's last prefill chunk padded to a multiple of CHUNK_ALIGN (128).

Forced on here (on the CPU "auto" leaves it off), with the final chunk run whole and split
(`final_chunk`, compiler/passes/prefill_choices.py). Reference: mlx-lm's own forward with its
own caches (tests/helpers.py), and the same engine with the switch off. The padding must never
show: the pad columns are trimmed off the cache, the prefix cache keeps real tokens only,
prompt-logprobs chunks are not padded, and graphs whose layers cannot be padded exactly
(sliding windows, recurrent state) keep the unpadded chunk.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.cli.main import build_parser
from graphc.runtime import Engine, EngineConfig, SamplingParams, chunk_pad
from graphc.runtime.scheduler import Scheduler
from graphc.runtime.server.cli import config_from_args
from graphc.runtime.server.state import load_engine
from helpers import assert_greedy_matches_mlx_lm, random_prompts, reference_greedy, reference_logits

ALIGN = Scheduler.CHUNK_ALIGN
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)
# Lengths around the alignment: 1 token (nothing to pad), 2 (127 pads), an exact 128 + 1 (the
# part before the last token is aligned already), and lengths that need padding.
LENGTHS = [5, 300, 17, 1, 129, 2, 200, 64]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def dense_dir(request, model_dir):
    return model_dir(request.param)


@pytest.fixture(params=["whole", "split"])
def final_chunk(request):
    """Both ways a final chunk runs (compiler/passes/prefill_choices.py), forced: padded either way."""
    return request.param


def _joined_lengths(eng) -> list:
    """Wrap the runner's join so each joining row's cache length is recorded next to its prompt
    length: what every layer's cache holds when the row enters the decode batch."""
    seen, join = [], eng.runner._join_rows

    def record(reqs, parts):  # parts: each prefilled group's layer caches, its rows in reqs' order
        rows = iter(reqs)
        for caches in parts:
            shared_pad = min(caches[0].left_pad)  # columns every row of the group pads
            for row in range(caches[0].batch):
                seen.append((len(next(rows).context_ids), {c.row_length(row) for c in caches}, shared_pad))
        join(reqs, parts)

    eng.runner._join_rows = record
    return seen


def test_auto_is_off_on_the_cpu_and_bad_values_name_the_option(model_dir):
    assert EngineConfig().pad_final_chunk == "auto"
    eng = Engine.load(model_dir("llama"))
    pad = eng.compiled.prefill.plan.choice("final chunk padding")
    assert (pad.choice, eng.runner.final_chunk.align) == ("off", 0)
    assert "device is cpu" in pad.why and eng.runner.final_chunk.off == pad.why
    off = Engine.load(model_dir("llama"), pad_final_chunk=False)
    assert off.runner.final_chunk.off == "the engine asks pad_final_chunk=False"
    with pytest.raises(ValueError, match="pad_final_chunk must be 'auto', True or False"):
        EngineConfig(pad_final_chunk="on")


def test_pad_lengths():
    split = chunk_pad.FinalChunk(whole=False, align=128, off=None)  # the n - 1 before the last token aligned
    assert [split.pad(n) for n in (0, 1, 2, 128, 129, 130, 300)] == [0, 0, 127, 1, 0, 127, 85]
    whole = chunk_pad.FinalChunk(whole=True, align=128, off=None)  # all n tokens aligned
    assert [whole.pad(n) for n in (0, 1, 2, 128, 129, 130, 300)] == [0, 0, 126, 0, 127, 126, 84]
    assert chunk_pad.FinalChunk(whole=True, align=0, off="off").pad(300) == 0


@pytest.mark.parametrize("prefill_chunk", [2048, 128, 48])
def test_batched_and_chunked_greedy_equal_mlx_lm_and_unpadded(dense_dir, prefill_chunk, final_chunk):
    """Whole prompts batched (2048), prompts chunked on aligned ends (128) and on unaligned ones
    (48 < CHUNK_ALIGN: the scheduler does not align, the last chunk starts anywhere)."""
    prompts = random_prompts(len(LENGTHS), 1024, LENGTHS, seed=prefill_chunk)
    padded = Engine.load(dense_dir, prefill_chunk=prefill_chunk, pad_final_chunk=True, final_chunk=final_chunk)
    fc = padded.runner.final_chunk
    assert (fc.align, fc.off, fc.whole) == (ALIGN, None, final_chunk == "whole")
    seen = _joined_lengths(padded)
    results = padded.generate(prompts, PARAMS)
    assert padded.runner.padded_tokens > 0
    assert_greedy_matches_mlx_lm(padded.model, prompts, results, 12)
    plain = Engine.load(dense_dir, prefill_chunk=prefill_chunk, pad_final_chunk=False,
                        final_chunk="split" if final_chunk == "whole" else "whole")
    assert [r.token_ids for r in plain.generate(prompts, PARAMS)] == [r.token_ids for r in results]
    assert plain.runner.padded_tokens == 0
    # Every row joined with exactly its prompt in every layer's cache, and no column that every
    # row of its group pads (a batched prefill's extra left padding is dropped before joining).
    assert sorted(n for n, _, _ in seen) == sorted(LENGTHS)
    assert all(lengths == {n} and shared_pad == 0 for n, lengths, shared_pad in seen), seen


def test_batched_prefill_pads_on_the_left_to_an_aligned_width(model_dir, final_chunk):
    eng = Engine.load(model_dir("llama"), pad_final_chunk=True, final_chunk=final_chunk, prefill_lanes=1)
    seen = _joined_lengths(eng)
    prompts = random_prompts(3, eng.vocab_size, [40, 7, 100], seed=4)
    results = eng.generate(prompts, PARAMS)
    assert_greedy_matches_mlx_lm(eng.model, prompts, results, 12)
    # One batched forward: whole pads the 100 columns to 128 in each of 3 rows, split the 99
    # before the last column.
    assert eng.runner.padded_tokens == 3 * (ALIGN - (100 if final_chunk == "whole" else 99))
    assert all(lengths == {n} for n, lengths, _ in seen)


def _logprob_rows(results) -> list:
    """Per output token: its logprob and the top-5 (id, logprob) pairs."""
    return [[[lp["logprob"]] + [v for _, v in lp["top"]] for lp in r.logprobs] for r in results]


def test_logprobs_equal_unpadded_and_mlx_lm(model_dir, final_chunk):
    """The first token (sampled at the last real position of a padded chunk) and the decode steps
    after it carry the logprobs the unpadded engine computes, to float32 rounding, and the first
    token's equal mlx-lm's log-softmax over its own forward."""
    d = model_dir("llama")
    prompts = random_prompts(3, 1024, [150, 3, 77], seed=9)
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=5)
    padded = Engine.load(d, prefill_chunk=64, pad_final_chunk=True, final_chunk=final_chunk)
    a = padded.generate(prompts, params)
    b = Engine.load(d, prefill_chunk=64, pad_final_chunk=False).generate(prompts, params)
    assert padded.runner.padded_tokens > 0
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [[[t for t, _ in lp["top"]] for lp in r.logprobs] for r in a] == \
        [[[t for t, _ in lp["top"]] for lp in r.logprobs] for r in b]
    np.testing.assert_allclose(np.array(_logprob_rows(a)), np.array(_logprob_rows(b)), atol=1e-4, rtol=0)
    for p, r in zip(prompts, a):
        ref = np.array(reference_logits(padded.model, p)[-1])
        ref = ref - np.logaddexp.reduce(ref)
        assert abs(r.logprobs[0]["logprob"] - ref[r.token_ids[0]]) < 1e-4


def _conversation(eng) -> tuple:
    """Prompts sharing a prefix one after another, then the first one's next turn: each checked
    against mlx-lm; returns (cached tokens per request, the tree's tokens)."""
    shared = random_prompts(1, eng.vocab_size, [190], seed=18)[0]
    hits, first = [], None
    for tail in ([9, 8, 7], [5], list(range(20, 70)), None):
        p = shared + tail if tail is not None else first + [11, 12, 13]
        [r] = eng.generate([p], PARAMS)
        assert r.token_ids == reference_greedy(eng.model, p, 12)
        hits.append(r.cached_tokens)
        first = first or p + r.token_ids
    eng.prefix.check()
    return hits, eng.prefix.stats()["tree_tokens"]


def test_prefix_cache_hits_store_and_restore_real_tokens_only(model_dir, final_chunk):
    """Later prompts hit what the earlier (padded) prefills stored, the next turn hits the first
    conversation's prompt and output; the tree's size equals the unpadded engine's (a pad column
    stored as a prompt position would change the later answers or the tree), and each hit is the
    unpadded engine's cut down to a multiple of the alignment (the rest of the prompt then starts
    on an aligned offset: its chunks keep warmed shapes)."""
    d = model_dir("llama")
    padded = Engine.load(d, prefill_chunk=128, pad_final_chunk=True, max_total_tokens=8192, final_chunk=final_chunk)
    assert padded.scheduler.hit_align == ALIGN == padded.describe()["scheduling"]["prefix_hit_align"]
    hits, tree = _conversation(padded)
    assert hits[0] == 0 and all(h >= ALIGN and h % ALIGN == 0 for h in hits[1:]), hits
    assert padded.runner.padded_tokens > 0
    plain = Engine.load(d, prefill_chunk=128, pad_final_chunk=False, max_total_tokens=8192)
    assert plain.scheduler.hit_align == 0 == plain.describe()["scheduling"]["prefix_hit_align"]
    plain_hits, plain_tree = _conversation(plain)
    assert all(h >= 190 for h in plain_hits[1:]) and any(h % ALIGN for h in plain_hits), plain_hits
    assert (hits, tree) == ([h - h % ALIGN for h in plain_hits], plain_tree)


@pytest.mark.parametrize("shared, hits", [(300, [0, 256, 256]), (100, [0, 0, 0])])
def test_a_burst_waits_for_a_shared_prefix_only_when_an_aligned_hit_gains(model_dir, shared, hits):
    """Prompts sent together that share a prefix: the later ones wait a step for the first to
    store it only when the hit admit would give them (cut to the alignment) is worth it; a
    shared prefix under the alignment would make them wait for nothing."""
    eng = Engine.load(model_dir("llama"), pad_final_chunk=True, max_total_tokens=8192, prefill_chunk=2048)
    head = random_prompts(1, eng.vocab_size, [shared], seed=30)[0]
    prompts = [head + t for t in random_prompts(3, eng.vocab_size, [40, 7, 90], seed=31)]
    reqs = [eng.request(eng.add_request(p, PARAMS)) for p in prompts]
    eng.step()
    waited = [r.prefilled == 0 for r in reqs]
    assert waited == [False] + [any(hits)] * 2  # the first computes; the rest wait only for a gain
    while eng.has_unfinished():
        eng.step()
    results = [eng.result(r) for r in reqs]
    assert [r.cached_tokens for r in results] == hits
    for p, r in zip(prompts, results):
        assert r.token_ids == reference_greedy(eng.model, p, 12)


def test_hits_shorter_than_the_alignment_are_declined(model_dir, final_chunk):
    """A prompt sharing only its first few tokens with a cached one (text prompts often share a
    first word) is computed whole when padding is on: a hit of 1-4 tokens started every such
    prompt's chunks at an offset no warm-up had built. Answers stay mlx-lm's."""
    d = model_dir("llama")
    eng = Engine.load(d, pad_final_chunk=True, final_chunk=final_chunk, max_total_tokens=8192)
    first, second = random_prompts(2, eng.vocab_size, [150, 90], seed=21)
    second = first[:3] + second
    for p in (first, second):
        [r] = eng.generate([p], PARAMS)
        assert r.token_ids == reference_greedy(eng.model, p, 12)
    assert r.cached_tokens == 0 and eng.prefix.counters["declined_hits"] == 1
    eng.prefix.check()


def test_prompt_logprobs_chunks_are_not_padded(model_dir):
    d = model_dir("llama")
    prompt = random_prompts(1, 1024, [150], seed=5)[0]
    params = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=2)
    padded = Engine.load(d, prefill_chunk=64, pad_final_chunk=True)
    [a] = padded.generate([prompt], params)
    [b] = Engine.load(d, prefill_chunk=64, pad_final_chunk=False).generate([prompt], params)
    assert padded.runner.padded_tokens == 0
    assert len(a.prompt_logprobs) == len(prompt) and a.prompt_logprobs[0] is None
    assert a.token_ids == b.token_ids == reference_greedy(padded.model, prompt, 4)
    for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert x["token"] == y["token"] and [t for t, _ in x["top"]] == [t for t, _ in y["top"]]
        assert abs(x["logprob"] - y["logprob"]) < 1e-4


def test_generic_lowering_padded_equals_mlx_lm(model_dir, final_chunk):
    eng = Engine.load(model_dir("llama"), prefill_chunk=128, lowering="generic", pad_final_chunk=True,
                      final_chunk=final_chunk)
    assert eng.compiled.binding.lowering == "generic" and eng.runner.final_chunk.whole == (final_chunk == "whole")
    prompts = random_prompts(4, eng.vocab_size, [300, 2, 45, 129], seed=6)
    assert_greedy_matches_mlx_lm(eng.model, prompts, eng.generate(prompts, PARAMS), 12)
    assert eng.runner.padded_tokens > 0


def _oracle(refs: dict, vocab: int):
    """Drafts from the reference continuation with one wrong token, so verify steps accept some."""

    def draft(req, k):
        n = len(req.output_ids)
        d = list(refs[tuple(req.prompt_ids)][n:n + k])
        if len(d) > 1:
            d[1] = (d[1] + 1) % vocab
        return d

    return draft


def test_speculative_verify_after_padded_prefill(model_dir, final_chunk):
    """Verify steps (every position's logits, then trims) run on caches a padded prefill made."""
    eng = Engine.load(model_dir("llama"), prefill_chunk=128, pad_final_chunk=True, spec_max_tokens=64,
                      final_chunk=final_chunk)
    prompts = random_prompts(3, eng.vocab_size, [200, 5, 60], seed=3)
    refs = {tuple(p): reference_greedy(eng.model, p, 24) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    params = SamplingParams(max_tokens=24, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
    assert [r.token_ids for r in eng.generate(prompts, params)] == [refs[tuple(p)] for p in prompts]
    assert eng.stats["spec_steps"] > 0 and eng.runner.padded_tokens > 0


@pytest.mark.parametrize("arch, sizes, says", [
    ("gpt_oss", {"sliding_window": 8}, "sliding window or recurrent state"),
    ("qwen3_next", {}, "sliding window or recurrent state"),
])
def test_sliding_and_hybrid_models_keep_the_unpadded_chunk(model_dir, arch, sizes, says, final_chunk):
    eng = Engine.load(model_dir(arch, **sizes), prefill_chunk=16, max_total_tokens=4096, pad_final_chunk=True,
                      final_chunk=final_chunk)
    pad = eng.compiled.prefill.plan.choice("final chunk padding")
    assert pad.choice == "off" and says in pad.why and eng.runner.final_chunk.align == 0
    assert eng.scheduler.hit_align == 0  # hits end where their window or snapshot does
    prompts = random_prompts(4, eng.vocab_size, [5, 40, 1, 150], seed=2)
    assert_greedy_matches_mlx_lm(eng.model, prompts, eng.generate(prompts, PARAMS), 12)
    assert eng.runner.padded_tokens == 0


def test_quantized_kv_padded_equals_unpadded(model_dir, final_chunk):
    """kv_bits is not exact against bf16 KV, but quantizing is per token: padding changes nothing."""
    d = model_dir("llama", hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32)
    prompts = random_prompts(3, 1024, [150, 9, 70], seed=8)
    out = [Engine.load(d, kv_bits=8, kv_group_size=32, prefill_chunk=64, pad_final_chunk=pad,
                       final_chunk=final_chunk).generate(prompts, PARAMS) for pad in (True, False)]
    assert [r.token_ids for r in out[0]] == [r.token_ids for r in out[1]]


def test_serve_flag_reaches_the_engine(model_dir):
    p = build_parser()
    assert config_from_args(p.parse_args(["serve"])).pad_final_chunk == "auto"
    on = config_from_args(p.parse_args(["serve", "--model", str(model_dir("llama")), "--pad-final-chunk", "on"]))
    assert on.pad_final_chunk is True
    assert load_engine(on).runner.final_chunk.align == ALIGN
    off = config_from_args(p.parse_args(["serve", "--pad-final-chunk", "off"]))
    assert off.pad_final_chunk is False
