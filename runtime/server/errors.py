"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Every failure the server can see — a bad field, a bad key, malformed JSON, an unknown
route, an engine error — leaves through `APIError` or one of the handlers below, so a
client always gets the same body shape and never a stack trace.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("graphc.server")

# OpenAI's `type` per status family.
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 499: "invalid_request_error",
          500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = dict(self.headers or {})
        if self.status >= 500:
            # Tell the client this connection is done: after a server error it is not reused,
            # and a pooled client that is not told so sees a reset on its next request.
            headers["Connection"] = "close"
        return _SafeJSON(self.body(), status_code=self.status, headers=headers)


class _SafeJSON(JSONResponse):
    """ASCII-escaped JSON: an error message can never fail to encode, whatever text it quotes."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def client_gone() -> APIError:
    """The client hung up before its request was read: nobody will see this response; 499 is
    nginx's "client closed request", counted apart from server errors in /metrics."""
    return APIError(499, "the client closed the connection before the request body was read",
                    code="client_closed_request")


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400 naming the field; `invalid_value` unless a more specific code applies (docs/server.md#errors)."""
    return APIError(400, message, param=param, code=code)


def from_validation_errors(errors: list[dict]) -> APIError:
    """Pydantic's error list -> one 400 naming the first bad field (the rest in the message)."""
    parts, first = [], None
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
        # pydantic puts union member names in the path ("str", "list[int]"); they only confuse.
        loc = [x for x in loc if not any(c in x for c in "[]") and x not in ("str", "int", "float", "bool", "function-after")]
        field = ".".join(loc) or None
        first = first or field
        parts.append(f"{field}: {e.get('msg')}" if field else str(e.get("msg")))
    msg = "; ".join(dict.fromkeys(parts)) or "invalid request"
    return bad_request(msg, param=first, code="invalid_value")


def install_handlers(app: FastAPI, reshape: Callable[[Request, APIError], APIError] | None = None) -> None:
    """The app's error handlers; `reshape(request, error)` may give an error another protocol's
    body on that request's route (app.py: Anthropic's on /v1/messages)."""
    reshape = reshape or (lambda request, err: err)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return reshape(request, from_validation_errors(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            msg, code = f"no route {request.method} {request.url.path}", "not_found"
        elif exc.status_code == 405:
            msg, code = f"method {request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            msg, code = str(exc.detail), None
        return reshape(request, APIError(exc.status_code, msg, code=code,
                                         headers=getattr(exc, "headers", None))).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        if isinstance(exc, ClientDisconnect):  # the client hung up mid-upload: not a server error
            return client_gone().response()
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return reshape(request, APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")).response()
