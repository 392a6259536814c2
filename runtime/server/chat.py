"""/v1/chat/completions: messages through the model's chat template, n choices, streamed or not.

Streaming follows OpenAI's chunk order per choice: a role chunk, content chunks, then an
empty delta carrying finish_reason; with stream_options.include_usage a last chunk with
no choices carries the usage.

With tools (tools.py), the reply is generated under a grammar that keeps every call well
formed; calls come back as `tool_calls` (streamed as OpenAI's tool_call deltas: the id,
type and name first, then the arguments) with finish_reason "tool_calls".

For a model that thinks (reasoning.py), the `<think>` text comes back apart as
`message.reasoning_content` (streamed as `delta.reasoning_content`); tool calls and
response_format apply to the answer after `</think>`, and their grammar lets the thinking run free.
"""

from __future__ import annotations

import json
import time
import uuid

import attrs
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .body import read_request
from .errors import bad_request
from .logprobs import chat_logprobs, logprob_source
from .prompts import chat_prompt_boundaries, prompt_opens_reasoning
from .reasoning import CONTENT, REASONING, ReasoningStream, answer_grammar, split_reasoning
from .protocol import (ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatChunkChoice,
                       ChatDelta, ChatResponseMessage, ToolCallDelta, ToolCallFunctionDelta, make_usage)
from .sampling import build_params
from .sse import DONE, drain, guarded, sse, watch_disconnect
from .tool_output import ToolStream, split_calls
from .tools import plan_tools


async def create_chat_completion(request: Request, state):
    req = await read_request(request, state, ChatCompletionRequest)
    state = state.route(req.model)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    plan = plan_tools(req)
    if plan is not None and plan.active and req.response_format is not None and req.response_format.type != "text":
        raise bad_request("response_format cannot be combined with tools unless tool_choice is 'none'",
                          "response_format")
    ids, started, bounds = await state.run_cpu(_prompt, state, req, plan)
    think = (state.reasoning, started) if state.reasoning is not None else None
    # max_completion_tokens replaced max_tokens in OpenAI's API; take it first.
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = state.max_tokens_for(len(ids), requested, None, param)
    items = [(ids, build_params(req, max_tokens=max_tokens, vocab_size=state.vocab_size,
                                defaults=state.sampling_defaults, choice=j), None)
             for j in range(req.n)]
    items = [(i, attrs.evolve(p, prefix_boundaries=bounds), x) for i, p, x in items]  # where messages end
    if plan is not None and plan.active:
        grammar = plan.grammar()
        items = [(i, attrs.evolve(p, grammar=grammar), x) for i, p, x in items]
    if think is not None and items[0][1].grammar is not None:  # structure binds the answer, not the thinking
        grammar = answer_grammar(items[0][1].grammar, think[0], started=started)
        items = [(i, attrs.evolve(p, grammar=grammar), x) for i, p, x in items]
    tools = plan if plan is not None and plan.active else None
    group = await state.submit(items, req)
    # Watch from here, not from inside the stream: a client gone before streaming starts must abort too.
    watcher = watch_disconnect(request, group.abort)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(guarded(_stream(state, req, group, rid, ids, include_usage, tools, think),
                                         watcher, group),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(watcher, state, req, group, rid, ids, tools, think)


def _prompt(state, req, plan):
    ids, bounds = chat_prompt_boundaries(state, req, plan)
    return ids, prompt_opens_reasoning(state, ids), bounds


def _usage(group, prompt_ids):
    completion = sum(len(r.token_ids) for r in group.results if r is not None)
    cached = group.results[0].cached_tokens if group.results and group.results[0] else 0
    return make_usage(len(prompt_ids), completion, cached)


def _finish(reason, called: bool):
    return "tool_calls" if called and reason == "stop" else reason


async def _collect(watcher, state, req, group, rid, prompt_ids, tools=None, think=None):
    entries, have_lp = await drain(watcher, group, bool(req.logprobs))
    choices = []
    for i, res in enumerate(group.results):
        src = logprob_source(res, entries[i], have_lp[i]) if req.logprobs else None
        lp = chat_logprobs(src, res.token_ids, state.texts) if src is not None else None
        content, calls, reasoning = res.text if res else "", [], None
        if think is not None:
            reasoning, content = split_reasoning(content, think[0], started=think[1])
        if tools is not None and res is not None:
            content, calls = split_calls(content, tools.fmt)
        message = ChatResponseMessage(content=content, reasoning_content=reasoning or None, tool_calls=calls or None)
        choices.append(ChatChoice(index=i, message=message, logprobs=lp,
                                  finish_reason=_finish(res.finish_reason, bool(calls)) if res else "abort"))
    resp = ChatCompletionResponse(id=rid, model=state.model_name, choices=choices, usage=_usage(group, prompt_ids))
    return Response(resp.model_dump_json(), media_type="application/json")


async def _stream(state, req, group, rid, prompt_ids, include_usage, tools=None, think=None):
    created = int(time.time())
    usage_null = {"usage": None} if include_usage else {}

    def chunk(i, delta: ChatDelta, lp=None, finish=None):
        c = ChatCompletionChunk(id=rid, created=created, model=state.model_name,
                                choices=[ChatChunkChoice(index=i, delta=delta, logprobs=lp, finish_reason=finish)],
                                **usage_null)
        d = c.model_dump()
        d["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # OpenAI sends `{}` / only what changed
        if not include_usage:
            d.pop("usage")
        return "data: " + json.dumps(d, separators=(",", ":"), ensure_ascii=False) + "\n\n"

    for i in range(len(group.results)):
        yield chunk(i, ChatDelta(role="assistant", content=""))
    parsers = [ToolStream(tools.fmt) for _ in group.results] if tools is not None else None
    splitters = [ReasoningStream(think[0], started=think[1]) for _ in group.results] if think else None
    async for i, out in group:
        lp = None
        if req.logprobs and out.new_token_ids and out.new_logprobs is not None:
            lp = chat_logprobs(out.new_logprobs, out.new_token_ids, state.texts)
        text = out.new_text or ""
        if splitters is None:
            pieces = [(CONTENT, text)] if text else []
        else:
            pieces = splitters[i].feed(text) + (splitters[i].flush() if out.finished else [])
        if parsers is None:
            for kind, value in pieces:
                yield chunk(i, _delta(kind, value), lp)
                lp = None
            if lp is not None:
                yield chunk(i, ChatDelta(content=""), lp)
            if out.finished:
                yield chunk(i, ChatDelta(), finish=out.finish_reason)
            continue
        p = parsers[i]
        events = []
        for kind, value in pieces:  # the thinking passes by; the answer goes through the call parser
            events += [(kind, value)] if kind == REASONING else p.feed(value)
        if out.finished:
            rest = p.flush()
            if rest:
                events.append(("content", rest))
        for kind, value in events:
            if kind in (CONTENT, REASONING):
                yield chunk(i, _delta(kind, value), lp)
            else:
                yield chunk(i, ChatDelta(tool_calls=[_call_head(value)]), lp)
                yield chunk(i, ChatDelta(tool_calls=[ToolCallDelta(
                    index=value["index"], function=ToolCallFunctionDelta(arguments=value["function"]["arguments"]))]))
            lp = None
        if lp is not None:
            yield chunk(i, ChatDelta(content=""), lp)
        if out.finished:
            yield chunk(i, ChatDelta(), finish=_finish(out.finish_reason, p.calls > 0))
    if include_usage:
        yield sse(ChatCompletionChunk(id=rid, created=created, model=state.model_name, choices=[],
                                      usage=_usage(group, prompt_ids)))
    yield DONE


def _delta(kind: str, text: str) -> ChatDelta:
    return ChatDelta(reasoning_content=text) if kind == REASONING else ChatDelta(content=text)


def _call_head(call: dict) -> ToolCallDelta:
    """The first delta of a call: its index, id, type and name, with empty arguments (OpenAI's order)."""
    return ToolCallDelta(index=call["index"], id=call["id"], type="function",
                         function=ToolCallFunctionDelta(name=call["function"]["name"], arguments=""))
