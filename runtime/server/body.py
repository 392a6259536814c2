"""Reading a request body: size-limited, strict JSON, then the pydantic model.

Parsed by hand rather than by FastAPI so that an oversized body is cut off while it
streams in (413), and malformed JSON or a wrong field is a 400 in OpenAI's shape
rather than FastAPI's 422.
"""

from __future__ import annotations

import json

from fastapi import Request
from pydantic import BaseModel, ValidationError

from .errors import APIError, bad_request, from_validation_errors


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, max_bytes: int) -> dict:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            declared = int(cl)
        except ValueError:
            raise bad_request("invalid Content-Length header") from None
        if declared > max_bytes:
            raise _too_large(max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
    if not body:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        data = json.loads(body, parse_constant=_no_constants)  # NaN / Infinity are not JSON
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than the server's limit of {limit} bytes",
                    code="request_too_large")


def parse(model: type[BaseModel], data: dict):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from None


async def read_request(request: Request, state, model: type[BaseModel]):
    """The common start of a generation endpoint: the size-limited JSON body validated as
    `model`, the engine ready, and the request's `model` name and `n` accepted (each an
    OpenAI-style error otherwise)."""
    req = parse(model, await read_json(request, state.config.max_body_bytes))
    state.require_ready()
    state.check_model(req.model)
    state.check_n(req.n)
    return req
