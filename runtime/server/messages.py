"""POST /v1/messages (Anthropic's Messages API) and /v1/messages/count_tokens.

The body becomes a chat request (messages_protocol.py) run by the chat machinery
(chat_run.py); the reply comes back as content blocks: `text`, then one `tool_use` block
per call (arguments held to the tool's input_schema by the tool grammar), after a
`thinking` block with the `<think>` text for a model that thinks (reasoning.py). stop_reason is
end_turn, max_tokens, stop_sequence (with the sequence that matched) or tool_use.

Usage follows Anthropic's split: `input_tokens` are the prompt tokens not read from the
prefix cache, `cache_read_input_tokens` those that were; count_tokens gives their sum.
Every error is Anthropic-shaped (MessagesError). Streaming is messages_stream.py.
"""

from __future__ import annotations

import json
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import chat_run
from .body import parse, read_json
from .errors import APIError
from .messages_protocol import CountTokensRequest, MessagesRequest, as_messages_error, chat_request
from .messages_output import matched_stop, stop_reason, thinking_block, tool_use_block, usage
from .messages_stream import stream_events
from .sse import drain


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


async def create_message(request: Request, state):
    try:
        req = parse(MessagesRequest, await read_json(request, state.config.max_body_bytes))
        state = state.route(req.model)  # this model's state (models.py): 404 unknown, 503 while it loads
        # Agents send one max_tokens (e.g. 32,000) to every model: past a small local context it
        # is cut to what fits, and the reply ends with stop_reason "max_tokens" when that fills.
        run = await chat_run.start(state, request, chat_request(req), "max_tokens", clamp_to_context=True)
    except APIError as e:
        raise as_messages_error(e) from None
    mid = new_message_id()
    if req.stream:
        return StreamingResponse(stream_events(state, req, run, mid), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        await drain(run.watcher, run.group, False)
    except APIError as e:
        raise as_messages_error(e) from None
    res = run.group.results[0]
    reasoning, text, calls = run.split(res.text)
    content = [thinking_block(reasoning)] if reasoning else []
    # a text block, if empty, unless the reply is calls or thinking alone (thinking that used the budget)
    content += ([{"type": "text", "text": text or ""}] if text or not (calls or reasoning) else [])
    content += [tool_use_block(c) for c in calls]
    seq = await state.run_cpu(matched_stop, state, res, req.stop_sequences)
    body = {"id": mid, "type": "message", "role": "assistant", "model": state.model_name, "content": content,
            "stop_reason": stop_reason(res.finish_reason, bool(calls), seq), "stop_sequence": seq,
            "usage": usage(len(run.prompt_ids), len(res.token_ids), res.cached_tokens)}
    return Response(json.dumps(body, ensure_ascii=False), media_type="application/json")


async def count_tokens(request: Request, state):
    try:
        req = parse(CountTokensRequest, await read_json(request, state.config.max_body_bytes))
        state = state.route(req.model)
        chat = chat_request(req)
        ids, plan, _ = await chat_run.prompt_ids(state, chat)
        if plan is not None and plan.active:  # a tool schema create would refuse is refused here too
            await state.run_cpu(chat_run.reply_grammar, plan, chat)
    except APIError as e:
        raise as_messages_error(e) from None
    return JSONResponse({"input_tokens": len(ids)})
