"""The prompt side of tool calling: tools and past calls/results rendered for the model.

A chat template that knows tools (it mentions `tools`, as Qwen's and Hermes' do) gets them
through apply_chat_template(tools=...) and gets assistant `tool_calls` with their arguments
as objects (transformers' convention). A template that does not (SmolLM2's, plain ChatML)
gets the same information as text: a system message that lists the functions and says how
to call them, past calls as the call markup, and tool results as user turns.
"""

from __future__ import annotations

import json

from .errors import bad_request
from .tools import ToolFormat, ToolPlan


def template_knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def _call_text(call: dict, fmt: ToolFormat) -> str:
    fn = call.get("function") or {}
    return fmt.start + json.dumps({"name": fn.get("name"), "arguments": _args(fn.get("arguments"))},
                                  ensure_ascii=False) + fmt.end


def _args(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def check_tool_calls(calls, where: str) -> None:
    """An assistant message's past `tool_calls` as OpenAI sends them: null, or a list of
    {"function": {"name": str, "arguments": str or object}, ...}; anything else is the client's 400
    (the template and the call markup read these fields)."""
    if calls is None:
        return
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list of tool calls, got {type(calls).__name__}", "messages")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{j}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                              "\"arguments\": ...}}", "messages")
        if not isinstance(fn.get("arguments"), (str, dict, type(None))):
            raise bad_request(f"{where}[{j}].function.arguments must be a JSON string or an object", "messages")


def system_text(plan: ToolPlan) -> str:
    fmt = plan.fmt
    listing = "\n".join(json.dumps(f.as_tool(), ensure_ascii=False) for f in plan.functions)
    example = fmt.start + '{"name": "<function name>", "arguments": {<arguments as JSON>}}' + fmt.end
    return ("You can call functions to help answer. The functions, one JSON description per line:\n"
            f"{listing}\n"
            f"To call a function, reply with:\n{example}\n"
            "Call only these functions, with arguments that match their parameters.")


def render_messages(messages: list[dict], plan: ToolPlan | None, template: str | None,
                    fmt: ToolFormat) -> tuple[list[dict], list[dict] | None]:
    """(messages for apply_chat_template, its tools= argument)."""
    native = template_knows_tools(template)
    out = []
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            if native:
                m["tool_calls"] = [{**c, "function": {**(c.get("function") or {}),
                                                      "arguments": _args((c.get("function") or {}).get("arguments"))}}
                                   for c in calls]
            else:
                m.pop("tool_calls")
                text = "\n".join(_call_text(c, fmt) for c in calls)
                m["content"] = (m.get("content") or "") + ("\n" if m.get("content") else "") + text
        elif m["role"] == "tool" and not native:
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if plan is None or not plan.active:
        return out, None
    if native:
        return out, [f.as_tool() for f in plan.functions]
    text = system_text(plan)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, None
