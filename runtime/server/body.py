"""Reading a request body: size-limited, strict JSON, then the pydantic model.

Parsed by hand rather than by FastAPI so that an oversized body is cut off while it
streams in (413), and malformed JSON or a wrong field is a 400 in OpenAI's shape
rather than FastAPI's 422. Hostile bodies end here too: a body that is not declared
`application/json` is a 415 (a browser's cross-site "simple" POST cannot declare it),
nesting deeper than MAX_DEPTH and text with lone UTF-16 surrogates (`"\ud800"`, which
no UTF-8 encoder accepts) are 400s before anything reads a field, and a client that
hangs up while uploading is a quiet 499 (no response reaches it; nothing is logged
as an error).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from .errors import APIError, bad_request, client_gone, from_validation_errors

# Containers nested deeper than this are refused: no OpenAI request needs more than a few
# levels (a JSON schema in response_format the most), and deep nesting is what makes
# recursive code (the JSON parser, validation, templates) overflow the stack.
MAX_DEPTH = 64


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


def check_content_type(request: Request) -> None:
    ctype = request.headers.get("content-type", "")
    media = ctype.split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = ctype.encode("ascii", "replace").decode()[:80] if ctype else "none"
        raise APIError(415, f"the request body must be JSON sent with `Content-Type: application/json` "
                            f"(got {shown})", code="unsupported_media_type")


async def read_json(request: Request, max_bytes: int) -> dict:
    check_content_type(request)
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            declared = int(cl)
        except ValueError:
            raise bad_request("invalid Content-Length header") from None
        if declared > max_bytes:
            raise _too_large(max_bytes)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise _too_large(max_bytes)
    except ClientDisconnect:
        raise client_gone() from None
    if not body:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    # Large bodies parse on a worker thread so /health and running streams are not held up.
    data = parse_json(bytes(body)) if len(body) < 65536 else await asyncio.to_thread(parse_json, bytes(body))
    return data


def parse_json(body: bytes) -> dict:
    try:
        data = json.loads(body, parse_constant=_no_constants)  # NaN / Infinity are not JSON
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    check_tree(data)
    return data


def _too_deep() -> APIError:
    return bad_request(f"the request body nests arrays/objects more than {MAX_DEPTH} levels deep",
                       code="invalid_json")


def check_tree(data) -> None:
    """Depth <= MAX_DEPTH and every string (keys too) valid Unicode, iteratively (no recursion)."""
    stack = [(data, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        for k, v in items:
            where = f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]"
            if isinstance(k, str) and not _valid_text(k):
                raise _surrogate(path or "the body")
            if isinstance(v, str):
                if not _valid_text(v):
                    raise _surrogate(_printable(where.lstrip(".")))
            elif isinstance(v, (dict, list)):
                stack.append((v, depth + 1, where))


def _valid_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(path: str) -> str:
    return path.encode("ascii", "replace").decode()[:120]


def _surrogate(where: str) -> APIError:
    field = where.split(".", 1)[0].split("[", 1)[0] or None
    return bad_request(f"{where}: the text holds a lone UTF-16 surrogate (e.g. \\ud800), which is not valid "
                       "Unicode; send well-formed UTF-8 / escape pairs", param=field, code="invalid_text")


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
    state = state.route(req.model)  # the caller routes again: the same pick (models.py)
    state.require_ready()
    state.check_n(req.n)
    return req
