"""Host-side sampling parameters of one request.

``SamplingParams`` is the plain, frozen input the runtime re-exports. The
tensor builder (``tensors.py``) reads it through ``SamplingParamsLike`` — any
object with these attributes will do — so the lead's public type and this one
can differ without an adapter.
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, Sequence

import attrs

MAX_LOGPROBS = 20


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


def _bias_converter(v):
    if v is None:
        return None
    # Keys may arrive as strings from JSON (OpenAI's logit_bias is {"123": 5}).
    try:
        return {int(k): float(x) for k, x in dict(v).items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"logit_bias must map token ids to numbers, got {v!r}") from e


def _ids_converter(v):
    return tuple(v) if v is not None else ()


@attrs.frozen
class SamplingParams:
    """Per-request selection parameters. Defaults are greedy with nothing else on.

    temperature        0.0 = greedy (argmax); > 0 divides the logits.
    top_k              0 = off; else keep the k highest-ranked tokens.
    top_p              1.0 = off; nucleus over the (top-k renormalised) probabilities.
    min_p              0.0 = off; keep p >= min_p * p_max.
    seed               None = noise from the step's random key; int = reproducible
                       noise keyed by (seed, position, token id).
    repetition_penalty 1.0 = off; CTRL-style, sign-aware, on tokens seen.
    frequency_penalty  0.0 = off; subtract penalty * count.
    presence_penalty   0.0 = off; subtract penalty once if count > 0.
    penalize_prompt    False: penalties see generated tokens only; True: prompt too.
    logit_bias         {token id: additive bias} or None.
    banned_token_ids   ids that can never be chosen (logit -inf).
    min_tokens         EOS ids are banned until this many tokens were generated.
    logprobs           None = none; N in 0..20 = chosen token's logprob plus top N.
    logprob_token_ids  extra token ids whose logprobs are reported each step.
    prompt_logprobs    None = none; N in 0..20 = per prompt token logprob plus top N.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalize_prompt: bool = False
    logit_bias: dict | None = attrs.field(default=None, converter=_bias_converter, hash=False)
    banned_token_ids: tuple = attrs.field(default=(), converter=_ids_converter)
    min_tokens: int = 0
    logprobs: int | None = None
    logprob_token_ids: tuple = attrs.field(default=(), converter=_ids_converter)
    prompt_logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> "SamplingParams":
        """Raise ValueError naming the first bad field; return self when fine."""
        validate_params(self)
        return self


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
    if not _is_int(p.top_k) or p.top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {p.top_k!r}")
    top_p = _num("top_p", p.top_p)
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p}")
    min_p = _num("min_p", p.min_p)
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {p.min_p}")
    if p.seed is not None and not _is_int(p.seed):
        raise ValueError(f"seed must be an integer or None, got {p.seed!r}")
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
            if not _is_int(k) or k < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {k!r}")
            v = _num(f"logit_bias[{k}]", v)
            if not -100.0 <= v <= 100.0:
                raise ValueError(f"logit_bias[{k}] must be in [-100, 100], got {v}")
    for name in ("banned_token_ids", "logprob_token_ids"):
        for i in getattr(p, name):
            if not _is_int(i) or i < 0:
                raise ValueError(f"{name} must hold token ids >= 0, got {i!r}")
    if not _is_int(p.min_tokens) or p.min_tokens < 0:
        raise ValueError(f"min_tokens must be an integer >= 0, got {p.min_tokens!r}")
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
