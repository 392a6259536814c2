"""/v1/embeddings: OpenAI's embeddings endpoint, served by the engine's embed graph (graphs/embed.yaml).

Input: a string, a list of strings, a list of token ids, or a list of token-id lists, all
embedded in one call (batched left-padded on the engine thread). `dimensions` truncates
each vector before it is normalized; `encoding_format: base64` (what the official client
asks for by default) sends little-endian float32 bytes.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from .body import parse, read_json
from .errors import APIError, bad_request
from .prompts import check_token_ids


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    input: Any  # str | list[str] | list[int] | list[list[int]]: checked by `inputs` for a clear message
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def inputs(state, value) -> list[list[int]]:
    """Token ids per input, for the four shapes OpenAI accepts; a 400 naming `input` otherwise."""
    shape = "input must be a string, a list of strings, a list of token ids, or a list of those"
    if isinstance(value, str):
        raw = [value]
    elif not isinstance(value, list) or not value:
        raise bad_request(f"{shape}, got {'an empty list' if value == [] else type(value).__name__}", "input")
    elif all(_is_id(t) for t in value):
        raw = [value]
    elif all(isinstance(p, str) or (isinstance(p, list) and all(_is_id(t) for t in p)) for p in value):
        raw = list(value)
    else:
        raise bad_request(shape, "input")
    if len(raw) > state.config.max_prompts:
        raise bad_request(f"at most {state.config.max_prompts} inputs per request, got {len(raw)}", "input")
    out = []
    for i, p in enumerate(raw):
        where = "input" if len(raw) == 1 else f"input[{i}]"
        ids = list(state.tokenizer.encode(p)) if isinstance(p, str) else [int(t) for t in p]
        check_token_ids(state, ids, where, "input")
        if not ids:
            raise bad_request(f"{where} is empty: give at least one token", "input")
        if len(ids) > state.max_prompt_tokens:
            raise bad_request(f"{where} has {len(ids)} tokens; this server accepts at most {state.max_prompt_tokens}",
                              "input", code="context_length_exceeded")
        out.append(ids)
    return out


async def create_embeddings(request: Request, state):
    req = parse(EmbeddingRequest, await read_json(request, state.config.max_body_bytes))
    state = state.route(req.model)
    state.require_ready()
    ids = inputs(state, req.input)
    if req.dimensions is not None and req.dimensions < 1:
        raise bad_request(f"dimensions must be at least 1, got {req.dimensions}", "dimensions", code="invalid_value")
    # On the engine thread, between steps: the model and its stream belong to that thread.
    fut = state.aengine.call(lambda engine: engine.embed(ids, dimensions=req.dimensions))
    try:
        result = await asyncio.wrap_future(fut)
    except ValueError as e:  # the engine's checks: dimensions above the model's width, a graph without it
        raise bad_request(str(e), "dimensions" if "dimensions" in str(e) else "input") from None
    except Exception as e:  # noqa: BLE001 - a failing embed is this request's error, not the server's
        raise APIError(500, f"embedding failed: {type(e).__name__}: {e}", code="embedding_failed") from None
    data = []
    for i, vec in enumerate(result.embeddings):
        emb = (base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
               if req.encoding_format == "base64" else vec)
        data.append(EmbeddingData(index=i, embedding=emb))
    body = EmbeddingResponse(data=data, model=state.model_name,
                             usage=EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens))
    return Response(body.model_dump_json(), media_type="application/json")
