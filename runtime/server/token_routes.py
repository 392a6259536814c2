"""POST /tokenize and /detokenize, in vLLM's shapes (llama.cpp serves the same paths): a
prompt's token ids exactly as this server would run them, without generating anything.

    POST /tokenize    {"prompt": "text", "add_special_tokens": true}
                   or {"messages": [...], "add_generation_prompt": true, "tools": [...], ...}
                      (the chat fields of /v1/chat/completions: the chat-templated prompt, tools
                      and template keywords included, as /v1/chat/completions would run it)
                   -> {"count": N, "max_model_len": M, "tokens": [...]}
                      (+ "token_strs": the vocabulary's spelling of each, with return_token_strs)
    POST /detokenize  {"tokens": [ids]} -> {"prompt": "text"}

`model` is optional and routes like every endpoint. A prompt longer than the server accepts is
still counted (that is what clients ask /tokenize for); only text past what any accepted
prompt could hold is refused, as on the generating routes.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from . import chat_run
from .body import parse, read_json
from .prompts import check_text_length, check_token_ids
from .protocol import ChatCompletionRequest, RequestModel


class TokenizePrompt(RequestModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(ChatCompletionRequest):
    return_token_strs: bool = False


class Detokenize(RequestModel):
    model: str | None = None
    tokens: list[int]


def _encode(state, req: TokenizePrompt) -> list[int]:
    check_text_length(state, len(req.prompt), "prompt", "prompt")
    return list(state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens))


async def tokenize(request: Request, state):
    data = await read_json(request, state.config.max_body_bytes)
    chat = "messages" in data
    req = parse(TokenizeChat if chat else TokenizePrompt, data)
    state = state.route(req.model)
    if chat:
        ids, _, _ = await chat_run.prompt_ids(state, req)
    else:
        ids = await state.run_cpu(_encode, state, req)
    body = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
    if req.return_token_strs:
        body["token_strs"] = await state.run_cpu(state.tokenizer.convert_ids_to_tokens, ids)
    return JSONResponse(body)


async def detokenize(request: Request, state):
    req = parse(Detokenize, await read_json(request, state.config.max_body_bytes))
    state = state.route(req.model)
    check_token_ids(state, req.tokens, "tokens", "tokens")
    return JSONResponse({"prompt": await state.run_cpu(state.tokenizer.decode, req.tokens)})
