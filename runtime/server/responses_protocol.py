"""The OpenAI Responses API request (`POST /v1/responses`) and its translation to a chat request.

Field names follow the official `openai` client's types (openai/types/responses/). The
translation is what lets the chat machinery serve it unchanged:

- `input` (a string, or a list of items: messages with text parts, `function_call` and
  `function_call_output` items) -> chat messages, with `instructions` as the system
  message in front and the stored conversation of `previous_response_id` before them;
- function tools (`{"type": "function", "name", "parameters"}`, flat) -> chat's nested
  `{"type": "function", "function": {...}}`; `tool_choice` likewise;
- `text.format` (`json_schema` with `name`/`schema` flat) -> chat's `response_format`;
- `max_output_tokens` -> max_tokens; `reasoning.effort` -> reasoning_effort, and effort
  "none" also turns a Qwen3-style template's thinking off (enable_thinking false).

Errors name the Responses field (`input`, `max_output_tokens`, `text`), not the chat one.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from .body import parse
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, RequestModel

# chat field -> the Responses field a client sent it as
_PARAM = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text",
          "reasoning_effort": "reasoning", "enable_thinking": "reasoning",
          "max_completion_tokens": "max_output_tokens", "prompt": "input"}
_TEXT_PARTS = ("input_text", "output_text", "text")


class TextFormat(RequestModel):
    type: str
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(RequestModel):
    format: TextFormat | None = None


class ResponsesRequest(RequestModel):
    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension, as on chat
    seed: int | None = None  # extension
    logit_bias: dict[str, float] | None = None  # extension, as on chat
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: the template's thinking switch
    store: bool | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Asked for and not served here: refused rather than ignored, since ignoring them changes
    # the answer (a conversation's earlier turns) or the contract (a background job to poll).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None


def remap(e: APIError) -> APIError:
    """A chat-side error re-addressed to the Responses field it came from."""
    if e.param in _PARAM:
        e.param = _PARAM[e.param]
    return e


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of text parts", "input")
    out = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad_request(f"{where}.content[{j}]: only text parts (input_text, output_text) are supported, "
                              f"got {kind!r}", "input")
        out.append(part["text"])
    return "\n".join(out)


def input_messages(items, where: str = "input") -> list[dict]:
    """Responses input items -> chat messages (function calls as assistant tool_calls)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"{at}.role must be user, assistant, system or developer, got {role!r}", "input")
            out.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), at)})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(args, str) or not isinstance(call_id, str):
                raise bad_request(f"{at}: a function_call item needs call_id, name and arguments as strings", "input")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":  # parallel calls: one assistant turn
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise bad_request(f"{at}: a function_call_output item needs call_id as a string", "input")
            text = output if isinstance(output, str) else _text(output, at) if isinstance(output, list) else \
                json.dumps(output)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            continue  # earlier reasoning is not replayed into the prompt
        else:
            raise bad_request(f"{at}: input items of type {kind!r} are not supported (message, function_call, "
                              "function_call_output)", "input")
    return out


def _tools(tools: list[dict] | None) -> list[dict] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function":
            raise bad_request(f"tools[{i}]: only tools of type 'function' are supported, got {t.get('type')!r}",
                              "tools")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                      "tool_choice")


def _format(text: TextConfig | None):
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise bad_request("text.format of type json_schema needs a schema", "text")
        return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    raise bad_request(f"text.format.type must be text, json_object or json_schema, got {fmt.type!r}", "text")


def chat_request(req: ResponsesRequest, history: list[dict]) -> tuple[ChatCompletionRequest, list[dict]]:
    """(the chat request to run, the conversation without instructions: what a follow-up replays)."""
    if req.background:
        raise bad_request("background responses are not supported here: send the request without background "
                          "(stream=true to see it as it is made)", "background")
    if req.conversation is not None:
        raise bad_request("conversation objects are not supported here: chain turns with previous_response_id",
                          "conversation")
    conversation = history + input_messages(req.input)
    if not conversation:
        raise bad_request("input is empty: give a string or at least one message", "input")
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    body = {"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
            "logit_bias": req.logit_bias,
            "tools": _tools(req.tools), "tool_choice": _tool_choice(req.tool_choice),
            "parallel_tool_calls": req.parallel_tool_calls, "response_format": _format(req.text)}
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        body["reasoning_effort"] = effort
        if effort == "none":
            body["enable_thinking"] = False
    return parse(ChatCompletionRequest, {k: v for k, v in body.items() if v is not None}), conversation
