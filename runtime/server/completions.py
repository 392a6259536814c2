"""/v1/completions: prompts (text or token ids, one or many) x n choices, streamed or not.

Choice index = prompt index * n + choice, as OpenAI numbers them. Usage counts each
prompt once (not once per choice) and the completion tokens of every choice.
"""

from __future__ import annotations

import time
import uuid

import attrs

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .body import read_request
from .errors import bad_request
from .logprobs import completion_logprobs, logprob_source
from .prompts import completion_prompts, prompt_text
from .protocol import CompletionChoice, CompletionRequest, CompletionResponse, make_usage
from .sampling import build_params
from .sse import DONE, drain, guarded, sse, watch_disconnect


async def create_completion(request: Request, state):
    req = await read_request(request, state, CompletionRequest)
    state = state.route(req.model)
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of must equal n (ranking several samples is not supported)", "best_of")
    # echo + logprobs scores the prompt (prompt logprobs); max_tokens 0 then means "score only",
    # as lm-eval-harness asks for log-likelihoods.
    score_prompt = req.echo and req.logprobs is not None
    if score_prompt and req.stream:
        raise bad_request("echo with logprobs is only supported without stream", "echo")
    score_only = req.echo and req.max_tokens == 0
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    prompts, texts = await state.run_cpu(completion_prompts, state, req.prompt)
    items = []
    for ids in prompts:
        requested = req.max_tokens
        max_tokens = state.max_tokens_for(len(ids), requested, state.config.default_completion_max_tokens)
        for j in range(req.n):
            params = build_params(req, max_tokens=max_tokens, vocab_size=state.vocab_size,
                                  defaults=state.sampling_defaults, choice=j)
            if score_prompt:
                params = attrs.evolve(params, prompt_logprobs=req.logprobs)
            items.append((ids, params, None))
    echo = [prompt_text(state, ids, t) for ids, t in zip(prompts, texts)] if req.echo else None
    group = await state.submit(items, req)
    # Watch from here, not from inside the stream: a client gone before streaming starts must abort too.
    watcher = watch_disconnect(request, group.abort)
    rid = f"cmpl-{uuid.uuid4().hex}"
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(guarded(_stream(state, req, group, rid, prompts, echo, include_usage), watcher, group),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(watcher, state, req, group, rid, prompts, echo, score_only)


def _usage(group, prompts, n, score_only=False):
    completion = 0 if score_only else sum(len(r.token_ids) for r in group.results if r is not None)
    cached = sum((group.results[p * n].cached_tokens if group.results[p * n] else 0) for p in range(len(prompts)))
    return make_usage(sum(len(p) for p in prompts), completion, cached)


async def _collect(watcher, state, req, group, rid, prompts, echo, score_only):
    n = req.n
    want_lp = req.logprobs is not None
    entries, have_lp = await drain(watcher, group, want_lp)
    choices = []
    for i, res in enumerate(group.results):
        prefix = echo[i // n] if echo else ""
        lp = None
        src = logprob_source(res, entries[i], have_lp[i]) if want_lp else None
        if echo and want_lp and res is not None:
            # Prompt tokens first (the first has no logprob), offsets from the start of the prompt.
            lp, end = completion_logprobs(res.prompt_logprobs or [None] * len(res.prompt_ids), res.prompt_ids,
                                          state.texts, 0)
            if src is not None and not score_only:
                rest, _ = completion_logprobs(src, res.token_ids, state.texts, end)
                for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    getattr(lp, name).extend(getattr(rest, name))
        elif src is not None:
            lp, _ = completion_logprobs(src, res.token_ids, state.texts, len(prefix))
        text = "" if score_only or res is None else res.text
        choices.append(CompletionChoice(index=i, text=prefix + text, logprobs=lp,
                                        finish_reason=res.finish_reason if res else "abort"))
    resp = CompletionResponse(id=rid, model=state.model_name, choices=choices,
                              usage=_usage(group, prompts, n, score_only))
    return Response(resp.model_dump_json(), media_type="application/json")


async def _stream(state, req, group, rid, prompts, echo, include_usage):
    created = int(time.time())
    n = req.n
    want_lp = req.logprobs is not None
    offsets = [len(echo[i // n]) if echo else 0 for i in range(len(group.results))]
    usage_null = {"usage": None} if include_usage else {}

    def chunk(i, text, lp=None, finish=None):
        return sse(CompletionResponse(id=rid, created=created, model=state.model_name,
                                      choices=[CompletionChoice(index=i, text=text, logprobs=lp, finish_reason=finish)],
                                      **usage_null))

    if echo:
        for i in range(len(group.results)):
            yield chunk(i, echo[i // n])
    async for i, out in group:
        lp = None
        if want_lp and out.new_token_ids and out.new_logprobs is not None:
            lp, offsets[i] = completion_logprobs(out.new_logprobs, out.new_token_ids, state.texts, offsets[i])
        if out.new_text or lp is not None or out.finished:
            yield chunk(i, out.new_text, lp, out.finish_reason if out.finished else None)
    if include_usage:
        yield sse(CompletionResponse(id=rid, created=created, model=state.model_name, choices=[],
                                     usage=_usage(group, prompts, n)))
    yield DONE
