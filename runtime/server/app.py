"""The OpenAI-compatible app: routes, API key, health, metrics, lifecycle.

    from graphc.runtime.server import ServerConfig, create_app
    app = create_app(ServerConfig(model="/tmp/tiny-llama"))   # then: uvicorn.run(app)

The model loads on a background thread when the app starts, so /health answers (503)
at once; the engine then runs on its own thread (AsyncEngine), prompts are tokenized on a
worker thread, and the event loop only parses, validates and forwards deltas. Middleware:
HTTP counting, the Host check and opt-in CORS (guard.py); shutdown.py drains on SIGTERM.
"""

from __future__ import annotations

import contextlib
import hmac
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from graphc.runtime import gc_pauses
from graphc.runtime.engine import Engine

from .chat import create_chat_completion
from .completions import create_completion
from . import guard
from .config import ServerConfig
from .embeddings import create_embeddings
from .errors import APIError, install_handlers
from .metrics import HTTPCounter
from .messages import count_tokens, create_message
from .messages_protocol import MessagesError, as_messages_error
from .models import ModelRegistry
from .protocol import ModelCard, ModelList
from .responses import create_response, delete_response, get_response
from .responses_store import ResponseStore
from .state import ServerState
from .token_routes import detokenize, tokenize


def _anthropic_on_its_routes(request: Request, err: APIError) -> APIError:
    """Errors the app's own handlers make (a wrong method, a crash) in Anthropic's body on its routes."""
    return as_messages_error(err) if request.url.path.startswith("/v1/messages") else err


def create_app(config: ServerConfig | None = None, *, engine: Engine | None = None,
               loader: Callable[[], Engine] | None = None,
               model_loader: Callable[[str, str], Engine] | None = None) -> FastAPI:
    """An app serving `engine` (already loaded), or what `loader()` / `config.model` loads at startup;
    with config.models / config.models_dir, several models (models.py), each loaded by
    `model_loader(name, path)` (default: Engine.load with the config's settings) on first use."""
    config = config or ServerConfig()
    registry = ModelRegistry(config, loader=model_loader) if config.several_models else None
    # app.state.graphc is the first model's state: single-model code (drain, /metrics) reads it,
    # and its route() asks the registry for the others.
    state = registry.first if registry is not None else ServerState(config, engine=engine, loader=loader)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        gc_pauses.install()  # /metrics counts the process's collections from here on
        (registry or state).start()
        try:
            yield
        finally:
            state.stop()

    app = FastAPI(title="graphc", summary="OpenAI-compatible server on MLX", lifespan=lifespan)
    app.state.graphc = state
    install_handlers(app, reshape=_anthropic_on_its_routes)
    guard.install(app, config)  # Host check (DNS rebinding), opt-in CORS
    app.add_middleware(HTTPCounter, metrics=state.metrics)

    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), config.api_key.encode()):
            raise APIError(401, "invalid or missing API key; send `Authorization: Bearer <key>`",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    def check_anthropic_key(request: Request) -> None:
        """Anthropic clients send the key as `x-api-key`; a Bearer header works too. Errors in their shape."""
        if config.api_key is None:
            return
        key = request.headers.get("x-api-key")
        if key is not None and hmac.compare_digest(key.strip().encode(), config.api_key.encode()):
            return
        try:
            check_key(request)
        except APIError as e:
            raise MessagesError(401, "invalid or missing API key; send `x-api-key: <key>`",
                                code="invalid_api_key", headers=e.headers) from None

    anthropic = APIRouter(prefix="/v1", dependencies=[Depends(check_anthropic_key)])

    @anthropic.post("/messages")
    async def messages(request: Request):
        return await create_message(request, state)

    @anthropic.post("/messages/count_tokens")
    async def messages_count_tokens(request: Request):
        return await count_tokens(request, state)

    @v1.post("/completions")
    async def completions(request: Request):
        return await create_completion(request, state)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        return await create_chat_completion(request, state)

    responses = ResponseStore()  # previous_response_id: this server's lifetime, bounded

    @v1.post("/responses")
    async def create_responses(request: Request):
        return await create_response(request, state, responses)

    @v1.get("/responses/{response_id}")
    async def read_response(response_id: str):
        return get_response(response_id, responses)

    @v1.delete("/responses/{response_id}")
    async def remove_response(response_id: str):
        return delete_response(response_id, responses)

    @v1.post("/embeddings")
    async def embeddings(request: Request):
        return await create_embeddings(request, state)

    def _card(st: ServerState = state) -> ModelCard:
        # a model not loaded yet has no known context length
        return ModelCard(id=st.model_name, created=st.created, max_model_len=st.max_model_len or None)

    @v1.get("/models")
    async def models():
        if registry is None:
            state.require_ready()
            cards = [_card()]
        else:  # every model the server may serve, loaded or not; listing loads nothing
            cards = [_card(st) for st in registry.states.values()]
        return Response(ModelList(data=cards).model_dump_json(), media_type="application/json")

    @v1.get("/models/{model_id:path}")
    async def model(model_id: str):
        if registry is None:
            state.require_ready()
            state.check_model(model_id)
            return Response(_card().model_dump_json(), media_type="application/json")
        return Response(_card(registry.get(model_id)).model_dump_json(), media_type="application/json")

    # vLLM's (and llama.cpp's) token routes, at the root as there; the same key as /v1
    tokens = APIRouter(dependencies=[Depends(check_key)])

    @tokens.post("/tokenize")
    async def tokenize_route(request: Request):
        return await tokenize(request, state)

    @tokens.post("/detokenize")
    async def detokenize_route(request: Request):
        return await detokenize(request, state)

    app.include_router(v1)
    app.include_router(anthropic)
    app.include_router(tokens)

    @app.get("/health")
    async def health():
        if registry is None:
            state.require_ready()
            snap = state.aengine.snapshot
            return JSONResponse({"status": "ok", "model": state.model_name,
                                 "running": snap.running, "waiting": snap.waiting})
        # Several models: up while the server admits requests; a model being (un)loaded is not down.
        if state.draining:
            state.require_ready()
        snaps = [st.aengine.snapshot for st in registry.states.values() if st.ready and st.aengine is not None]
        return JSONResponse({"status": "ok", "model": state.model_name,
                             "running": sum(s.running for s in snaps), "waiting": sum(s.waiting for s in snaps),
                             "models": {name: registry.status(name) for name in registry.states}})

    @app.get("/metrics")
    async def metrics():
        a = state.aengine
        text = state.metrics.render(a.snapshot if a else None, ready=state.ready,
                                    engine_alive=bool(a and a.alive), model=state.model_name)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
