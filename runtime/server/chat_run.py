"""One chat generation started from a ChatCompletionRequest built by another protocol.

/v1/responses and /v1/messages translate their bodies into the chat request the chat
endpoint already understands, then share everything after that with it: the chat
template (prompts.chat_prompt_boundaries), the tool plan and its grammar (tools.py), sampling
(sampling.build_params), admission (ServerState.submit) and the disconnect watch. Only
the shape of what goes back to the client differs, so only that lives in those modules.

For a model that thinks (reasoning.py), the `<think>` text is split off the reply
(`ReplyParser`, whole or streamed) and any grammar binds only the answer after `</think>`.

One thing differs from chat: tools and a JSON output format may come together (agents
with an output type send both); with tool_choice auto the reply is then the JSON answer
or tool calls, each held to its schema (answer_or_calls).
"""

from __future__ import annotations

import json

import attrs
import llguidance
from fastapi import Request

from graphc.runtime.grammar import Grammar
from graphc.runtime.grammar.schema import close_objects

from .errors import bad_request
from .prompts import chat_prompt_boundaries, prompt_opens_reasoning
from .protocol import ChatCompletionRequest, ResponseFormat
from .reasoning import CONTENT, REASONING, ReasoningFormat, ReasoningStream, answer_grammar
from .sampling import build_params
from .sse import watch_disconnect
from .tool_output import ToolStream
from .tools import ToolPlan, plan_tools, tool_grammar

CALL = "call"


@attrs.define
class ChatRun:
    prompt_ids: list[int]
    group: object  # the StreamGroup of the one sequence
    watcher: object  # the disconnect watch task; drain / guarded cancel it
    tools: ToolPlan | None  # the active tool plan (None: plain text or structured output)
    reasoning: ReasoningFormat | None = None  # the model's thinking tags (None: it does not think)
    started: bool = False  # the prompt opened the thinking (DeepSeek-R1 style)

    def parser(self) -> "ReplyParser":
        return ReplyParser(self.tools, self.reasoning, self.started)

    def split(self, text: str) -> tuple[str, str, list[dict]]:
        """(reasoning, answer text, calls) of a whole reply."""
        p = self.parser()
        events = p.feed(text, final=True)
        reasoning = "".join(v for k, v in events if k == REASONING)
        content = "".join(v for k, v in events if k == CONTENT)
        return reasoning, content.strip() if self.tools is not None else content, [v for k, v in events if k == CALL]


class ReplyParser:
    """Generated text in pieces -> ("reasoning", str), ("content", str) and ("call", dict)
    events: the thinking split off first (reasoning.ReasoningStream), then the answer through
    the call parser (tool_output.ToolStream) when tools are active. Neither a thinking tag
    nor call markup ever reaches the content."""

    def __init__(self, tools: ToolPlan | None, reasoning: ReasoningFormat | None, started: bool):
        self.think = ReasoningStream(reasoning, started=started) if reasoning is not None else None
        self.calls = ToolStream(tools.fmt) if tools is not None else None

    def feed(self, piece: str, final: bool = False) -> list[tuple[str, object]]:
        if self.think is None:
            pieces = [(CONTENT, piece)] if piece else []
        else:
            pieces = self.think.feed(piece) + (self.think.flush() if final else [])
        if self.calls is None:
            return pieces
        events = []
        for kind, value in pieces:
            events += [(kind, value)] if kind == REASONING else self.calls.feed(value)
        if final:
            rest = self.calls.flush()
            # An unfinished call after complete ones is dropped, as tool_output.split_calls does
            # for whole replies; with no call made, what was written stays content.
            if rest and not self.calls.calls:
                events.append((CONTENT, rest))
        return events


def answer_or_calls(plan: ToolPlan, fmt: ResponseFormat) -> Grammar:
    """Tools with tool_choice auto *and* a JSON output format (what an agent with an output type
    sends): the reply is either one JSON document held to the format, or tool calls held to
    their schemas. A JSON document cannot begin with the call marker, so the two never overlap."""
    plan.grammar()  # the functions' schemas checked, each a 400 naming the function
    if fmt.type == "json_object":
        schema = {"type": "object"}
    else:
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        schema = {} if schema is True else schema
        if not isinstance(schema, dict):
            raise bad_request("the JSON output format needs a schema object", "response_format")
    answer = {**close_objects(schema), "x-guidance": {"whitespace_flexible": False}}
    head, rest = tool_grammar(attrs.evolve(plan, choice="required")).split("\n", 1)
    text = head.replace("start: ", "start: answer | ", 1) + f"\nanswer: %json {json.dumps(answer)}\n" + rest
    err = llguidance.LLMatcher.validate_grammar(text, None)
    if err:
        raise bad_request(f"the JSON output format is not usable: {err.splitlines()[0]}", "response_format")
    return Grammar.lark(text)


def reply_grammar(plan: ToolPlan, chat: ChatCompletionRequest) -> Grammar:
    fmt = chat.response_format
    if plan.choice == "auto" and fmt is not None and fmt.type != "text":
        return answer_or_calls(plan, fmt)
    return plan.grammar()  # forced calls: the output format has nothing to apply to


def _prompt(state, chat: ChatCompletionRequest, plan: ToolPlan | None) -> tuple[list[int], bool, tuple]:
    ids, bounds = chat_prompt_boundaries(state, chat, plan)
    return ids, prompt_opens_reasoning(state, ids), bounds


async def prompt_ids(state, chat: ChatCompletionRequest) -> tuple[list[int], ToolPlan | None, bool]:
    """(the chat-templated prompt, tools included, as generation would see it; the tool plan;
    whether the prompt opened the thinking)."""
    ids, plan, started, _ = await _templated(state, chat)
    return ids, plan, started


async def _templated(state, chat: ChatCompletionRequest) -> tuple[list[int], ToolPlan | None, bool, tuple]:
    """prompt_ids and the prompt's message boundaries (prompts.chat_prompt_boundaries)."""
    plan = plan_tools(chat)
    ids, started, bounds = await state.run_cpu(_prompt, state, chat, plan)
    return ids, plan, started, bounds


async def start(state, request: Request, chat: ChatCompletionRequest, max_param: str,
                clamp_to_context: bool = False) -> ChatRun:
    """Template, budget, sample and submit `chat` as one sequence on `state` (already routed to
    the request's model); `max_param` names the client's own max-tokens field in a
    context-length error; `clamp_to_context`: a max-tokens past the context is cut to what fits."""
    ids, plan, started, bounds = await _templated(state, chat)
    max_tokens = state.max_tokens_for(len(ids), chat.max_tokens, None, max_param, clamp=clamp_to_context)
    params = build_params(chat, max_tokens=max_tokens, vocab_size=state.vocab_size,
                          defaults=state.sampling_defaults)
    params = attrs.evolve(params, prefix_boundaries=bounds)
    tools = plan if plan is not None and plan.active else None
    if tools is not None:
        params = attrs.evolve(params, grammar=reply_grammar(tools, chat))
    fmt = state.reasoning
    if fmt is not None and params.grammar is not None:  # structure binds the answer, not the thinking
        params = attrs.evolve(params, grammar=answer_grammar(params.grammar, fmt, started=started))
    group = await state.submit([(ids, params, None)], chat)
    # Watch from here: a client gone before the first event is sent must abort too.
    watcher = watch_disconnect(request, group.abort)
    return ChatRun(ids, group, watcher, tools, fmt, started)
