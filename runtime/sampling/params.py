"""Host-side sampling parameters of one request.

The tensor builder (``tensors.py``) reads request parameters through
``SamplingParamsLike`` — any object with these attributes will do; the public
``graphc.runtime.SamplingParams`` is one. ``validate_params`` holds the rules.
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, Sequence


MAX_LOGPROBS = 20
# Counts reach the sampler as int32 arrays (min_tokens, top_k, token ids); a larger value would
# overflow there, inside the engine step, and fail every request that shares it.
MAX_INT32 = 2**31 - 1
# Seeds are folded to 64 bits (noise.split_seed); a wider one is almost surely a client bug.
SEED_RANGE = (-(2**63), 2**64 - 1)


class SamplingParamsLike(Protocol):
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    penalize_prompt: bool
    logit_bias: Mapping[int, float] | None
    banned_token_ids: Sequence[int]
    min_tokens: int
    logprobs: int | None
    logprob_token_ids: Sequence[int]
    prompt_logprobs: int | None


# The one public SamplingParams lives in runtime/params.py (it adds max_tokens, stops,
# grammar, ...) and imports the rules below; this package re-exports it lazily
# (sampling/__init__.py), so neither module imports the other at load time.


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def validate_params(p: SamplingParamsLike) -> None:
    """Validate any ``SamplingParamsLike``; messages name the field and value."""
    t = _num("temperature", p.temperature)
    if t < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {p.temperature}")
    if not _is_int(p.top_k) or not 0 <= p.top_k <= MAX_INT32:
        raise ValueError(f"top_k must be an integer in 0..{MAX_INT32} (0 disables it), got {p.top_k!r}")
    top_p = _num("top_p", p.top_p)
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p}")
    min_p = _num("min_p", p.min_p)
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {p.min_p}")
    if p.seed is not None and (not _is_int(p.seed) or not SEED_RANGE[0] <= p.seed <= SEED_RANGE[1]):
        raise ValueError(f"seed must be None or an integer in [-2**63, 2**64), got {p.seed!r}")
    rep = _num("repetition_penalty", p.repetition_penalty)
    if rep <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 disables it), got {p.repetition_penalty}")
    for name in ("frequency_penalty", "presence_penalty"):
        v = _num(name, getattr(p, name))
        if not -2.0 <= v <= 2.0:
            raise ValueError(f"{name} must be in [-2, 2], got {v}")
    if not isinstance(p.penalize_prompt, bool):
        raise ValueError(f"penalize_prompt must be a bool, got {p.penalize_prompt!r}")
    if p.logit_bias is not None:
        for k, v in p.logit_bias.items():
            if not _is_int(k) or not 0 <= k <= MAX_INT32:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {k!r}")
            v = _num(f"logit_bias[{k}]", v)
            if not -100.0 <= v <= 100.0:
                raise ValueError(f"logit_bias[{k}] must be in [-100, 100], got {v}")
    for name in ("banned_token_ids", "logprob_token_ids"):
        for i in getattr(p, name):
            if not _is_int(i) or not 0 <= i <= MAX_INT32:
                raise ValueError(f"{name} must hold token ids >= 0, got {i!r}")
    if not _is_int(p.min_tokens) or not 0 <= p.min_tokens <= MAX_INT32:
        raise ValueError(f"min_tokens must be an integer in 0..{MAX_INT32}, got {p.min_tokens!r}")
    for name in ("logprobs", "prompt_logprobs"):
        v = getattr(p, name)
        if v is not None and (not _is_int(v) or not 0 <= v <= MAX_LOGPROBS):
            raise ValueError(f"{name} must be None or an integer in 0..{MAX_LOGPROBS}, got {v!r}")


def check_token_ids(p: SamplingParamsLike, vocab_size: int) -> None:
    """Token ids must exist in the model's vocabulary (known only at build time)."""
    ids = list(p.banned_token_ids) + list(p.logprob_token_ids) + list((p.logit_bias or {}).keys())
    bad = [i for i in ids if i >= vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range for a vocabulary of {vocab_size}")
