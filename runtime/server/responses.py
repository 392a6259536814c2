"""POST /v1/responses (OpenAI's Responses API), plus GET/DELETE of stored responses.

The body becomes a chat request (responses_protocol.py) that the chat machinery runs
(chat_run.py); the reply comes back as output items: a `message` with `output_text`, and
one `function_call` item per tool call, after a `reasoning` item with the `<think>` text
for a model that thinks (reasoning.py). A response is kept (responses_store.py) unless
`store` is false, so a follow-up can name it in `previous_response_id` instead of
resending the conversation. Streaming is responses_stream.py.
"""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import chat_run
from .body import parse, read_json
from .errors import APIError
from .responses_output import (ResponseShell, call_item, message_item, new_id, reasoning_item, reasoning_tokens,
                               reply_message, status_of, usage)
from .responses_protocol import ResponsesRequest, chat_request, remap
from .responses_store import ResponseStore
from .responses_stream import stream_events
from .sse import drain


async def create_response(request: Request, state, store: ResponseStore):
    req = parse(ResponsesRequest, await read_json(request, state.config.max_body_bytes))
    state = state.route(req.model)  # this model's state (models.py): 404 unknown, 503 while it loads
    history = store.get(req.previous_response_id, "previous_response_id").conversation \
        if req.previous_response_id is not None else []
    try:
        chat, conversation = chat_request(req, history)
        run = await chat_run.start(state, request, chat, "max_output_tokens")
    except APIError as e:
        raise remap(e) from None
    shell = ResponseShell(new_id("resp"), state.model_name, req, state.sampling_defaults)

    def keep(text: str | None, calls: list[dict], response: dict) -> None:
        if req.store is not False:
            store.put(shell.rid, conversation + [reply_message(text, calls)], response)

    if req.stream:
        return StreamingResponse(stream_events(state, run, shell, keep), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    await drain(run.watcher, run.group, False)
    res = run.group.results[0]
    reasoning, text, calls = run.split(res.text)
    output = [reasoning_item(new_id("rs"), reasoning, "completed")] if reasoning else []
    if text or not (calls or reasoning):  # a message, if empty, unless calls or reasoning are the reply
        output.append(message_item(new_id("msg"), text or "", "completed" if res.finish_reason == "stop"
                                   else "incomplete"))
    output += [call_item(new_id("fc"), c, "completed") for c in calls]
    status, incomplete, error = status_of(res.finish_reason)
    thought = await state.run_cpu(reasoning_tokens, state, reasoning)
    body = shell.render(status, output, usage(len(run.prompt_ids), len(res.token_ids), res.cached_tokens, thought),
                        incomplete, error)
    keep(text, calls, body)
    return Response(json.dumps(body, ensure_ascii=False), media_type="application/json")


def get_response(rid: str, store: ResponseStore):
    return JSONResponse(store.get(rid).response)


def delete_response(rid: str, store: ResponseStore):
    if not store.delete(rid):
        store.get(rid)  # the same 404 as a GET
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})
