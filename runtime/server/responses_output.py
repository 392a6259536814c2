"""The Responses API objects we send: output items, usage, and the response itself.

Plain dicts with the field names of the `openai` client's types (Response, ResponseUsage,
ResponseOutputMessage, ResponseFunctionToolCall); the streaming events (responses_stream.py)
carry the same items, first `in_progress` and then `completed`.
"""

from __future__ import annotations

import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call: dict, status: str, arguments: str | None = None) -> dict:
    """A chat tool call (tool_output.py's dict) as a function_call item; its call id is kept."""
    fn = call["function"]
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if arguments is None else arguments, "status": status}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict:
    """The thinking as a reasoning item: its text in `content` (reasoning_text), no summary."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def reasoning_tokens(state, reasoning: str | None) -> int:
    """About how many of the output tokens were thinking (the text re-tokenized, tags not counted)."""
    return len(state.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int, reasoning: int = 0) -> dict:
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": min(reasoning, output_tokens)},
            "total_tokens": prompt_tokens + output_tokens}


def status_of(finish_reason: str | None) -> tuple[str, dict | None, dict | None]:
    """(status, incomplete_details, error) for how the sequence ended."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    if finish_reason == "error":
        return "failed", None, {"code": "server_error", "message": "the engine failed while generating"}
    if finish_reason == "abort":
        return "incomplete", None, None
    return "completed", None, None


class ResponseShell:
    """The fields of a response fixed at creation; `render` fills in the outcome."""

    def __init__(self, rid: str, model: str, req, defaults: dict | None = None):
        self.rid, self.model, self.req = rid, model, req
        # the sampling values the request ran with where it left them out (ServerState.sampling_defaults)
        self.defaults = defaults or {}
        self.created_at = int(time.time())

    def _ran(self, name: str, off: float) -> float:
        value = getattr(self.req, name)
        return value if value is not None else self.defaults.get(name, off)

    def render(self, status: str, output: list, usage_: dict | None = None,
               incomplete: dict | None = None, error: dict | None = None) -> dict:
        req = self.req
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format \
            else {"type": "text"}
        done = status in ("completed", "incomplete", "failed")
        return {
            "id": self.rid, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error, "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id, "temperature": self._ran("temperature", 1.0),
            "top_p": self._ran("top_p", 1.0), "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "text": {"format": fmt}, "truncation": "disabled", "store": req.store is not False,
            "metadata": req.metadata or {}, "user": req.user, "reasoning": None,
            "usage": usage_ if done else None,
        }


def reply_message(text: str | None, calls: list[dict]) -> dict:
    """The assistant turn a follow-up (previous_response_id) replays, in chat form."""
    msg = {"role": "assistant", "content": text or ""}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": dict(c["function"])} for c in calls]
    return msg
