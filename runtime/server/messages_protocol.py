"""The Anthropic Messages request (`POST /v1/messages`, `/v1/messages/count_tokens`), its
translation to a chat request, and Anthropic's error body.

Field names follow the official `anthropic` client's types (anthropic/types/). The
translation lets the chat machinery serve it unchanged:

- `system` (a string or text blocks) -> the system message;
- content blocks -> chat messages: `text` blocks joined, an assistant's `tool_use` blocks
  -> its tool_calls, a user's `tool_result` blocks -> `tool` messages (before its text);
- `tools` (`name`, `description`, `input_schema`) -> function tools; `tool_choice`
  auto / any / tool / none -> auto / required / the named function / none, and
  `disable_parallel_tool_use` -> parallel_tool_calls false;
- `thinking` `{"type": "enabled"}` / `{"type": "disabled"}` -> enable_thinking (the
  template's switch, where it has one); the thinking comes back as `thinking` blocks;
- `stop_sequences` -> stop; `output_config.format` (a JSON schema) -> structured output;
  max_tokens, temperature, top_p, top_k as they are (newer `anthropic` clients no longer
  take the sampling fields as arguments: send them with `extra_body`).

Errors leave as `{"type": "error", "error": {"type": "invalid_request_error", "message"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from .body import parse
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, RequestModel

# HTTP status -> Anthropic's error type (docs: "Errors"); 503 is their overloaded_error.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
                499: "invalid_request_error", 500: "api_error", 503: "overloaded_error"}


class MessagesError(APIError):
    """An APIError that renders in Anthropic's shape (the handlers call body())."""

    def body(self) -> dict:
        kind = _ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def as_messages_error(e: APIError) -> MessagesError:
    if isinstance(e, MessagesError):
        return e
    msg = e.message if e.param is None or e.param in e.message else f"{e.param}: {e.message}"
    return MessagesError(e.status, msg, param=e.param, code=e.code, headers=e.headers)


class MessagesRequest(RequestModel):
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int = Field(ge=1)  # Anthropic's floor; past the context it is cut (messages.py)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None  # extension (graphc): reproducible sampling
    logit_bias: dict[str, float] | None = None  # extension, as on chat
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # {"type": "enabled" | "disabled"}: the template's switch
    stream: bool = False
    metadata: dict[str, Any] | None = None


class CountTokensRequest(RequestModel):
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


def _block_text(block: dict, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise bad_request(f"{where}: only text blocks are supported here, got {kind!r}", "messages")
    return block["text"]


def _system(system) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return "\n".join(_block_text(b, f"system[{i}]") for i, b in enumerate(system))


def _result_text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "\n".join(_block_text(b, f"{where}.content[{j}]") for j, b in enumerate(content))
    raise bad_request(f"{where}.content must be a string or a list of text blocks", "messages")


def _turn(i: int, m: dict) -> list[dict]:
    where = f"messages[{i}]"
    role, content = m.get("role"), m.get("content")
    if role not in ("user", "assistant"):
        raise bad_request(f"{where}.role must be 'user' or 'assistant', got {role!r}", "messages")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content blocks", "messages")
    texts, calls, results = [], [], []
    for j, b in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            texts.append(_block_text(b, at))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_request(f"{at}: a tool_use block needs id and name as strings", "messages")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise bad_request(f"{at}: a tool_result block needs tool_use_id as a string", "messages")
            text = _result_text(b.get("content"), at)
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": f"Error: {text}" if b.get("is_error") else text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier thinking is not replayed into the prompt
        else:
            raise bad_request(f"{at}: content blocks of type {kind!r} are not supported in a {role} turn "
                              "(text, tool_use from the assistant, tool_result from the user)", "messages")
    if role == "assistant":
        msg = {"role": "assistant", "content": "\n".join(texts)}
        return [dict(msg, tool_calls=calls) if calls else msg]
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _tools(tools: list[dict] | None) -> list[dict] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom"):
            raise bad_request(f"tools[{i}]: only client tools (name, description, input_schema) are supported, "
                              f"got type {t.get('type')!r}", "tools")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise bad_request(f"tools[{i}].input_schema must be a JSON schema object", "tools")
        fn = {"name": t.get("name"), "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict | None) -> tuple[Any, bool | None]:
    """(chat tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, False
    raise bad_request(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", "tool_choice")


def _output_format(config: dict | None) -> dict | None:
    """output_config.format ({"type": "json_schema", "schema": ...}) -> chat's response_format."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad_request("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                          "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _thinking(thinking: dict | None) -> bool | None:
    kind = (thinking or {}).get("type")
    if thinking is None:
        return None
    if kind not in ("enabled", "disabled"):
        raise bad_request(f"thinking.type must be 'enabled' or 'disabled', got {kind!r}", "thinking")
    return kind == "enabled"


def chat_request(req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    messages = [m for i, turn in enumerate(req.messages) for m in _turn(i, turn)]
    system = _system(req.system)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    choice, parallel = _tool_choice(req.tool_choice)
    body = {"model": req.model, "messages": messages, "tools": _tools(req.tools), "tool_choice": choice,
            "parallel_tool_calls": parallel}
    last = messages[-1]
    if last["role"] == "assistant" and not last.get("tool_calls") and last["content"]:
        # A prefill: Anthropic continues the last assistant turn's text (a "{" before JSON, a
        # voice), and the reply holds only what comes after it.
        body.update(add_generation_prompt=False, continue_final_message=True)
    if isinstance(req, MessagesRequest):
        body.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                    seed=req.seed, logit_bias=req.logit_bias, stop=req.stop_sequences,
                    response_format=_output_format(req.output_config),
                    enable_thinking=_thinking(req.thinking))
    return parse(ChatCompletionRequest, {k: v for k, v in body.items() if v is not None})
