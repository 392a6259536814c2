"""Tool calling: the request's tools and tool_choice, and the grammar that makes every call well formed.

A call is written in the model's format (`ToolFormat`; Hermes/Qwen style by default:
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`). The grammar built here
constrains the whole reply through llguidance, so a call can never carry invalid JSON or
arguments outside the function's schema:

- tool_choice "required" or a named function: the reply is one call (or, with
  parallel_tool_calls, one or more), arguments held to the schema from the first token;
- "auto": the reply is free text that never contains the start marker, or free text up to
  the start marker followed by calls — once the model opens a call, the rest is held to the
  schemas (a lexeme "text then marker" means the grammar never has to guess where text ends);
- "none": no tools reach the prompt and no grammar is added.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import llguidance

from graphc.runtime.grammar import Grammar
from graphc.runtime.grammar.schema import close_objects

from .errors import bad_request

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


@attrs.frozen
class ToolFormat:
    """How a model writes a call: `start` + JSON {"name", "arguments"} + `end`, calls separated by `sep`."""

    name: str
    start: str
    end: str
    sep: str = "\n"


HERMES = ToolFormat("hermes", "<tool_call>\n", "\n</tool_call>")
FORMATS = {"hermes": HERMES}


@attrs.frozen
class Function:
    name: str
    description: str | None
    parameters: dict

    def as_tool(self) -> dict:
        fn = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


@attrs.frozen
class ToolPlan:
    functions: tuple[Function, ...]
    choice: str  # "auto" | "required" | "none" | "function"
    named: str | None  # the function tool_choice names
    parallel: bool
    fmt: ToolFormat = HERMES

    @property
    def active(self) -> bool:
        return self.choice != "none"

    def allowed(self) -> tuple[Function, ...]:
        return tuple(f for f in self.functions if f.name == self.named) if self.named else self.functions

    def grammar(self) -> Grammar:
        """The reply's grammar; a function schema llguidance cannot compile is a 400 naming the function."""
        for f in self.allowed():
            err = llguidance.LLMatcher.validate_grammar(f"start: %json {json.dumps(call_schema(f))}", None)
            if err:
                reason = err.split("\n", 1)[0].split("JSON schema: ", 1)[-1]
                raise bad_request(f"tools: the parameters schema of function '{f.name}' is not usable: {reason}",
                                  "tools")
        return Grammar.lark(tool_grammar(self))


def _function(i: int, tool: Any) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise bad_request(f"{where}: only tools of type 'function' are supported", "tools")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"{where}.function must be an object with a name", "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise bad_request(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}", "tools")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", "tools")
    desc = fn.get("description")
    return Function(name, desc if isinstance(desc, str) else None, params)


def plan_tools(req) -> ToolPlan | None:
    """The request's tools (or legacy `functions`) and tool_choice, checked; None without tools."""
    tools = req.tools
    choice = req.tool_choice
    if tools is None and req.functions is not None:  # the legacy spelling
        tools = [{"type": "function", "function": f} for f in req.functions]
        fc = req.function_call
        choice = {"type": "function", "function": fc} if isinstance(fc, dict) else fc
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function tools", "tools")
    functions = tuple(_function(i, t) for i, t in enumerate(tools))
    names = [f.name for f in functions]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise bad_request(f"tools: the function name '{dup}' appears twice", "tools")
    named = None
    if choice is None or choice == "auto":
        mode = "auto"
    elif choice in ("none", "required"):
        mode = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = choice["function"].get("name")
        if named not in names:
            raise bad_request(f"tool_choice names the function {named!r}, which is not in tools "
                              f"({', '.join(names)})", "tool_choice")
        mode = "function"
    else:
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    parallel = True if req.parallel_tool_calls is None else bool(req.parallel_tool_calls)
    if mode == "function":
        parallel = False  # a named function is one call, as OpenAI does
    return ToolPlan(functions, mode, named, parallel)


def call_schema(f: Function) -> dict:
    """{"name": <const>, "arguments": <the function's schema>}, name first, nothing else.

    The parameters' `$defs` / `definitions` move to the root: their `$ref`s ("#/$defs/X", as
    pydantic writes them) resolve against the root of the schema they are embedded in."""
    params = dict(close_objects(f.parameters))
    defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    return {"type": "object",
            "properties": {"name": {"const": f.name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False, **defs,
            # compact JSON: a model cannot wander in whitespace until max_tokens cuts the call short
            "x-guidance": {"whitespace_flexible": False}}


def _lit(s: str) -> str:
    return json.dumps(s)  # a lark string literal: JSON escaping is lark's escaping


def _not_containing(marker: str) -> str:
    # Lark regexes are Rust regexes; escape the marker for use inside one.
    return f"/(?s:.*)/ & ~/(?s:.*{re.escape(marker)}.*)/"


def tool_grammar(plan: ToolPlan) -> str:
    fmt = plan.fmt
    funcs = plan.allowed()
    lines = []
    bodies = []
    for i, f in enumerate(funcs):
        lines.append(f"body_{i}: %json {json.dumps(call_schema(f))}")
        bodies.append(f"body_{i}")
    lines.append("body: " + " | ".join(bodies))
    more = f'({_lit(fmt.end + fmt.sep + fmt.start)} body)*' if plan.parallel else ""
    lines.append(f"calls: body {more} {_lit(fmt.end)}")
    if plan.choice == "auto":
        marker = fmt.start.strip()
        head = [
            "start: TEXT | LEAD calls",
            f"TEXT: {_not_containing(marker)}",
            # all text up to and including the first start marker is one lexeme: no guessing where text ends
            f"LEAD: {_not_containing(marker)} {_lit(fmt.start)}",
        ]
    else:
        head = [f"start: {_lit(fmt.start)} calls"]
    return "\n".join(head + lines) + "\n"
