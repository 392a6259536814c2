"""Reference computations with mlx-lm's own forward and caches: the ground truth graphc is checked against."""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache


def reference_greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's generate_step with its own caches, one prompt at a time, greedy."""
    out = []
    for tok, _ in generate_step(mx.array(prompt_ids), model, max_tokens=max_tokens,
                                prompt_cache=make_prompt_cache(model)):
        out.append(int(tok))
    return out


def reference_logits(model, ids: list[int]) -> mx.array:
    """Logits at every position of `ids` [L, V], float32, from one mlx-lm forward with its cache."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(ids)[None], cache=cache)
    return logits[0].astype(mx.float32)


def reference_last_logits_stepwise(model, ids: list[int], prompt_len: int) -> list[mx.array]:
    """Last-position logits after the prompt and after each following token, fed one at a time."""
    cache = make_prompt_cache(model)
    out = [model(mx.array(ids[:prompt_len])[None], cache=cache)[0, -1].astype(mx.float32)]
    for t in ids[prompt_len:]:
        out.append(model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32))
    return out


def random_prompts(n: int, vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Token-id prompts drawn at random (not tuned): ids 3.. so special tokens are avoided."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]
