"""Request fields -> graphc.runtime.SamplingParams, one per choice.

The OpenAI names map one to one where they exist; vLLM's extensions (top_k, min_p,
repetition_penalty, stop_token_ids, ignore_eos, min_tokens) are accepted as plain
fields (the `openai` client sends them with `extra_body`). SamplingParams.validate
has the last word on ranges; its ValueError names the field, which becomes `param`.
"""

from __future__ import annotations

from typing import Mapping

from graphc.runtime import SamplingParams
from graphc.runtime.grammar import Grammar

from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest, ResponseFormat

# SamplingParams field -> request field, where the names differ.
_PARAM_NAMES = {"logprobs": "logprobs", "grammar": "response_format", "token id": "logit_bias"}
MAX_LOGIT_BIAS = 100.0
MAX_SCALE = 1e4  # temperature, repetition_penalty
MIN_TOP_P = 1e-6
# Stop strings are matched against the text on the engine thread after every token, in the
# step every request shares: bound their number and length so no request slows the others.
MAX_STOPS = 32
MAX_STOP_CHARS = 4096
# Entries of logit_bias / stop_token_ids become per-row edit tensors rebuilt on the engine
# thread whenever the batch changes (OpenAI itself caps logit_bias at 300).
MAX_TOKEN_LIST = 1024


def logit_bias_ids(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if not bias:
        return None
    if len(bias) > MAX_TOKEN_LIST:
        raise bad_request(f"logit_bias may have at most {MAX_TOKEN_LIST} entries, got {len(bias)}", "logit_bias")
    out = {}
    for k, v in bias.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad_request(f"logit_bias keys must be token ids, got {k!r}", "logit_bias") from None
        if not 0 <= tid < vocab_size:
            raise bad_request(f"logit_bias token id {tid} is out of range for a vocabulary of {vocab_size}",
                              "logit_bias")
        if not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS:
            raise bad_request(f"logit_bias values must be in [-100, 100], got {v} for token {tid}", "logit_bias")
        out[tid] = float(v)
    return out


def grammar_for(fmt: ResponseFormat | None):
    """response_format -> the engine's Grammar (None for text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Grammar.json_object()
    js = fmt.json_schema
    if js is None or js.schema_ is None:
        raise bad_request("response_format of type json_schema needs json_schema.schema", "response_format")
    schema = js.schema_
    if schema is True:
        schema = {}
    if schema is False or not isinstance(schema, dict):
        raise bad_request("response_format.json_schema.schema must be a JSON schema object", "response_format")
    try:
        return Grammar.json_schema(schema)
    except ValueError as e:
        raise bad_request(f"response_format: {e}", "response_format") from None


def logprobs_count(req) -> int | None:
    """How many top alternatives per token the request asks for (None = no logprobs)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    assert isinstance(req, ChatCompletionRequest)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def build_params(req, *, max_tokens: int, vocab_size: int, defaults: Mapping[str, float | int],
                 choice: int = 0) -> SamplingParams:
    """SamplingParams for choice `choice` of `req`; a sampling field the request leaves out takes
    its value from `defaults` (ServerState.sampling_defaults: the flags, the model's
    generation_config.json, then OpenAI's), else off. Seeded requests with n > 1 give choice i
    the seed + i, so the choices differ and each stays reproducible."""

    def pick(name: str, off: float | int):
        value = getattr(req, name)
        return value if value is not None else defaults.get(name, off)

    top_k = pick("top_k", 0)
    if top_k == -1 or top_k >= vocab_size:
        top_k = 0  # -1 is vLLM's spelling of "off"; k >= vocabulary keeps everything anyway
    seed = req.seed + choice if req.seed is not None else None
    # The sampler runs in float32: keep values where float32 still means what the client asked.
    for name in ("temperature", "repetition_penalty"):
        v = getattr(req, name)
        if v is not None and v > MAX_SCALE:
            raise bad_request(f"{name} must be at most {MAX_SCALE:g}, got {v}", name, code="invalid_value")
    stops = req.stop_list
    if len(stops) > MAX_STOPS or sum(map(len, stops)) > MAX_STOP_CHARS:
        raise bad_request(f"stop: at most {MAX_STOPS} strings of {MAX_STOP_CHARS} characters in all, got "
                          f"{len(stops)} of {sum(map(len, stops))}", "stop", code="invalid_value")
    if len(req.stop_token_ids or ()) > MAX_TOKEN_LIST:
        raise bad_request(f"stop_token_ids may have at most {MAX_TOKEN_LIST} entries, got {len(req.stop_token_ids)}",
                          "stop_token_ids", code="invalid_value")
    top_p = pick("top_p", 1.0)
    if 0 < top_p < MIN_TOP_P:
        top_p = MIN_TOP_P  # below this float32 rounds to 0; any such top_p keeps only the top token anyway
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=pick("temperature", 1.0),
            top_k=top_k,
            top_p=top_p,
            min_p=pick("min_p", 0.0),
            seed=seed,
            repetition_penalty=pick("repetition_penalty", 1.0),
            frequency_penalty=req.frequency_penalty or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            logit_bias=logit_bias_ids(req.logit_bias, vocab_size),
            min_tokens=req.min_tokens,
            logprobs=logprobs_count(req),
            stop=tuple(s for s in req.stop_list if s),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            grammar=grammar_for(req.response_format),
            speculative=req.speculative,
        )
        return params.validate(vocab_size)
    except APIError:
        raise
    except (ValueError, TypeError) as e:
        raise param_error(e, req) from None


def param_error(e: Exception, req=None) -> APIError:
    """A SamplingParams / engine ValueError -> 400 naming the request field it came from."""
    msg = str(e)
    first = msg.split(" ", 1)[0]
    param = _PARAM_NAMES.get(first, first)
    if msg.startswith("token id"):
        param = "logit_bias" if req is not None and req.logit_bias else "stop_token_ids"
    if isinstance(req, ChatCompletionRequest):
        if param == "max_tokens" and req.max_completion_tokens is not None:
            param = "max_completion_tokens"
        elif param == "logprobs":
            param = "top_logprobs"  # chat's logprobs is a bool; the count is top_logprobs
    if "grammar" in msg or type(e).__name__ == "GrammarError":
        param = "response_format"
    if req is not None and param not in type(req).model_fields:
        param = None
    return bad_request(msg, param, code="invalid_value")
