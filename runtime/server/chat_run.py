"""One chat generation started from a ChatCompletionRequest built by another protocol.

/v1/responses and /v1/messages translate their bodies into the chat request the chat
endpoint already understands, then share everything after that with it: the chat
template (prompts.chat_prompt), the tool plan and its grammar (tools.py), sampling
(sampling.build_params), admission (ServerState.submit) and the disconnect watch. Only
the shape of what goes back to the client differs, so only that lives in those modules.
"""

from __future__ import annotations

import attrs
from fastapi import Request

from .errors import bad_request
from .prompts import chat_prompt
from .protocol import ChatCompletionRequest
from .sampling import build_params
from .sse import watch_disconnect
from .tools import ToolPlan, plan_tools


@attrs.define
class ChatRun:
    prompt_ids: list[int]
    group: object  # the StreamGroup of the one sequence
    watcher: object  # the disconnect watch task; drain / guarded cancel it
    tools: ToolPlan | None  # the active tool plan (None: plain text or structured output)


def active_plan(chat: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tool plan when tools are in play; structured output and tools exclude each other."""
    plan = plan_tools(chat)
    if plan is not None and plan.active and chat.response_format is not None and chat.response_format.type != "text":
        raise bad_request("a JSON output format cannot be combined with tools unless tool_choice is 'none'",
                          "response_format")
    return plan


async def prompt_ids(state, chat: ChatCompletionRequest) -> tuple[list[int], ToolPlan | None]:
    """The chat-templated prompt, tools included (what generation would see)."""
    plan = active_plan(chat)
    return await state.run_cpu(chat_prompt, state, chat, plan), plan


async def start(state, request: Request, chat: ChatCompletionRequest, max_param: str) -> ChatRun:
    """Template, budget, sample and submit `chat` as one sequence; `max_param` names the
    client's own max-tokens field in a context-length error."""
    ids, plan = await prompt_ids(state, chat)
    max_tokens = state.max_tokens_for(len(ids), chat.max_tokens, None, max_param)
    params = build_params(chat, max_tokens=max_tokens, vocab_size=state.vocab_size,
                          default_temperature=state.config.default_temperature)
    tools = plan if plan is not None and plan.active else None
    if tools is not None:
        params = attrs.evolve(params, grammar=tools.grammar())
    group = await state.submit([(ids, params, None)], chat)
    # Watch from here: a client gone before the first event is sent must abort too.
    watcher = watch_disconnect(request, group.abort)
    return ChatRun(ids, group, watcher, tools)
