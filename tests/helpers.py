"""Reference computations with mlx-lm's own forward and caches: the ground truth graphc is checked against."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from graphc.runtime import Engine, SamplingParams


def reference_greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's generate_step with its own caches, one prompt at a time, greedy."""
    out = []
    for tok, _ in generate_step(mx.array(prompt_ids), model, max_tokens=max_tokens,
                                prompt_cache=make_prompt_cache(model)):
        out.append(int(tok))
    return out


def assert_greedy_matches_mlx_lm(model, prompts: list[list[int]], results, max_tokens) -> None:
    """Each result's tokens equal mlx-lm's own greedy decode of its prompt, alone
    (`max_tokens`: one count for every prompt, or one per prompt)."""
    counts = list(max_tokens) if isinstance(max_tokens, (list, tuple)) else [max_tokens] * len(prompts)
    assert len(results) == len(prompts) == len(counts)
    for prompt, n, res in zip(prompts, counts, results):
        assert res.token_ids == reference_greedy(model, prompt, n)


def assert_chained_equals_unchained(path, prompts: list[list[int]], max_tokens: list[int], **load_kw) -> list:
    """The chained decode loop (step N + 1 queued before the host reads step N's tokens) gives the
    tokens the unchained one does; returns the chained results."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    chained = Engine.load(path, chain=True, **load_kw).generate(prompts, params)
    unchained = Engine.load(path, chain=False, **load_kw).generate(prompts, params)
    assert [r.token_ids for r in chained] == [r.token_ids for r in unchained]
    return chained


def reference_logits(model, ids: list[int]) -> mx.array:
    """Logits at every position of `ids` [L, V], float32, from one mlx-lm forward with its cache."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(ids)[None], cache=cache)
    return logits[0].astype(mx.float32)


def random_prompts(n: int, vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Token-id prompts drawn at random (not tuned): ids 3.. so special tokens are avoided."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def prefilled_batch(engine, prompts: list[list[int]], chunk: int = 16) -> list:
    """Each prompt prefilled alone in `chunk`-token pieces through the lowered prefill step, then
    joined into one left-padded decode batch — what the runner does, without the scheduler."""
    from graphc.compiler.lower import StepInputs

    caches = None
    for p in prompts:
        own = [pol.new_cache() for pol in engine.compiled.binding.policies]
        for a in range(0, len(p), chunk):
            end = min(len(p), a + chunk)
            engine.compiled.prefill(StepInputs(mx.array(p[a:end], dtype=mx.int32)[None], own, final=end == len(p)))
        if caches is None:
            caches = own
        else:
            for mine, theirs in zip(caches, own):
                mine.extend(theirs)
    return caches


def assert_decode_logits_match(engine, prompts: list[list[int]], atol: float, chunk: int = 16) -> None:
    """One batched decode step after chunked prefill: each row's logits equal mlx-lm's forward
    over that row's whole sequence (left padding and chunking must not show)."""
    from graphc.compiler.lower import StepInputs

    caches = prefilled_batch(engine, prompts, chunk)
    nxt = [7 + i for i in range(len(prompts))]
    out = engine.compiled.decode(StepInputs(mx.array(nxt, dtype=mx.int32)[:, None], caches))
    for i, p in enumerate(prompts):
        ref = reference_logits(engine.model, p + [nxt[i]])[-1]
        np.testing.assert_allclose(np.array(out.logits[i]), np.array(ref), atol=atol, rtol=0)


def assert_generic_lowering_matches(path, prefill_chunk: int = 8, max_tokens: int = 12) -> None:
    """The generic lowering (the model's own forward on graphc's caches, forced) equals mlx-lm:
    a batch of mixed lengths (some past the prefill chunk), then prompts sharing a prefix one
    after another, so the later ones hit the prefix cache."""
    eng = Engine.load(path, prefill_chunk=prefill_chunk, max_total_tokens=4096, lowering="generic",
                      snapshot_interval=prefill_chunk)  # recurrent layers: snapshots at chunk multiples too
    assert eng.compiled.binding.lowering == "generic" and eng.compiled.binding.check.ok
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompts = random_prompts(5, eng.vocab_size, [5, 3 * prefill_chunk + 3, 11, 1, 2 * prefill_chunk], seed=17)
    for p, r in zip(prompts, eng.generate(prompts, params)):
        assert r.token_ids == reference_greedy(eng.model, p, max_tokens)
    shared = random_prompts(1, eng.vocab_size, [4 * prefill_chunk], seed=18)[0]
    hits = []
    for tail in ([9, 8, 7], [5], [6, 6]):
        [r] = eng.generate([shared + tail], params)
        assert r.token_ids == reference_greedy(eng.model, shared + tail, max_tokens)
        hits.append(r.cached_tokens)
    if eng.prefix is not None:
        assert all(h >= 2 * prefill_chunk for h in hits[1:]), hits
