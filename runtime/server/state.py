"""What the routes share: the loaded engine behind its AsyncEngine, the server's tokenizer copy,
the limits, and the checks every request goes through (ready, model name, lengths, queue)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from graphc.runtime import gc_pauses
from graphc.runtime.async_engine import AsyncEngine, EngineClosed, StreamGroup
from graphc.runtime.engine import Engine

from .config import ServerConfig
from .defaults import describe, sampling_defaults
from .errors import APIError, bad_request
from .logprobs import TokenText
from .metrics import ServerMetrics
from .prefix_tokens import PrefixTokens
from .reasoning import ReasoningFormat, detect_reasoning
from .sampling import param_error

log = logging.getLogger("graphc.server")


def load_engine(c: ServerConfig, **kwargs) -> Engine:
    """The engine `c` asks for (every rank of a distributed server loads it the same way)."""
    extra = {"kv_budget_tokens": c.kv_budget_tokens} if c.kv_budget_tokens is not None else {}
    if c.compile is not None:
        extra["compile"] = c.compile
    if c.mixed_step is not None:  # runtime/mixed_step.py
        extra["decode_options"] = {"mixed_step": c.mixed_step}
    if c.kv_bits is not None:  # opt-in quantized KV (runtime/cache/quantized.py)
        extra.update(kv_bits=c.kv_bits, kv_group_size=c.kv_group_size)
    if c.kv_cache_dir is not None:
        extra.update(kv_cache_dir=c.kv_cache_dir, kv_cache_disk_gb=c.kv_cache_disk_gb,
                     kv_cache_disk_read=c.kv_cache_disk_read)
        if c.kv_cache_block_tokens is not None:
            extra["kv_cache_block_tokens"] = c.kv_cache_block_tokens
    if c.speculative is not None:  # the default for requests without a `speculative` field
        extra.update(speculative=c.speculative, num_draft_tokens=c.num_draft_tokens)
    if c.snapshot_interval is not None:
        extra["snapshot_interval"] = c.snapshot_interval
    if c.step_tokens is not None:
        extra["step_tokens"] = c.step_tokens
    if c.warm_continuations:  # runtime/warmup_plans.py ContinuationWarmUp
        extra["warm_continuations"] = True
    if c.pad_final_chunk != "auto":
        extra["pad_final_chunk"] = c.pad_final_chunk
    if c.final_chunk != "auto":
        extra["final_chunk"] = c.final_chunk
    if c.linear_prefill != "auto":
        extra["linear_prefill"] = c.linear_prefill
    if c.adapter_path is not None:  # a LoRA adapter over the model (compiler/adapters.py)
        extra["adapter_path"] = c.adapter_path
    if c.cpu_weights is not None:  # runtime/cpu_weights.py
        extra["cpu_weights"] = c.cpu_weights
    if c.draft_model is not None:  # its drafts become the default unless --speculative says otherwise
        extra.update(draft_model=c.draft_model, num_draft_tokens=c.num_draft_tokens)
    return Engine.load(c.model, c.graph, max_batch=c.max_batch, prefill_chunk=c.prefill_chunk,
                       distributed=c.distributed, **extra, **kwargs)



def served_name(model_path: str) -> str:
    """The model name clients send by default: the folder's name, or a .gguf file's without the extension."""
    p = Path(model_path)
    return p.stem if p.suffix.lower() == ".gguf" else p.name

class ServerState:
    def __init__(self, config: ServerConfig, engine: Engine | None = None,
                 loader: Callable[[], Engine] | None = None):
        self.config = config
        self._engine = engine
        self._loader = loader
        self.engine: Engine | None = None
        self.aengine: AsyncEngine | None = None
        self.tokenizer = None  # the server's own copy: tokenization on the event loop never races the engine thread
        self.prompt_tokens = None  # PrefixTokens over that copy (prefix_tokens.py), set with it
        self.texts: TokenText | None = None
        self.ready = False
        self.load_error: str | None = None
        self.warmup_s: float | None = None  # seconds the warm-up took (None: none ran)
        self.metrics = ServerMetrics()
        self.model_name = config.served_model_name or (served_name(config.model) if config.model else "graphc")
        self.created = int(time.time())
        self.max_model_len = 0
        self.max_prompt_tokens = 0
        self.max_prompt_chars = 0  # longer prompt text cannot fit max_prompt_tokens: refused before tokenizing
        self.vocab_size = 0
        self.reasoning: ReasoningFormat | None = None  # the model's <think> tags (server/reasoning.py)
        # sampling values for the fields a request leaves out (server/defaults.py), set with the engine
        self.sampling_defaults: dict = {"temperature": config.default_temperature}
        self.draining = False  # set on SIGTERM/SIGINT: new requests get 503 while running ones finish
        self.loading = False  # a loader thread runs
        self.registry = None  # the ModelRegistry (models.py) of a server with several models
        # Tokenization and chat templating run here, one at a time (the server's tokenizer copy is
        # not shared across threads), so a huge prompt never blocks the event loop.
        self._cpu = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="graphc-tokenize")

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Attach a given engine now, or load one on a background thread (requests get 503 until then)."""
        if self._engine is not None:
            self._attach(self._engine)
            return
        self.loading, self.load_error = True, None
        threading.Thread(target=self._load, name="graphc-loader", daemon=True).start()

    def _load(self) -> None:
        t0, aengine = time.perf_counter(), None
        try:
            # Built on its engine thread, where it will be stepped (AsyncEngine.load): MLX's streams
            # and CUDA plans are per thread, and a load on this thread could leave arrays only
            # this thread can evaluate.
            build = self._loader if self._loader is not None else (lambda: load_engine(self.config))
            aengine = AsyncEngine.load(build)
            self._attach(aengine.engine, ready=not self.config.warmup, aengine=aengine)
            if self.config.warmup:  # the first client request no longer pays for kernel builds and traces
                log.info("warming up (a greedy and a sampled request; --no-warmup skips it)")
                # on the engine thread, which keeps what MLX's CUDA backend builds per thread
                self.warmup_s = self.aengine.warm_up()
                log.info("warm-up done in %.1f s", self.warmup_s)
                self._ready()
            if self.config.gc_freeze:  # startup's objects out of the collector's full walks (runtime/gc_pauses.py)
                log.info("froze %d startup objects out of Python's garbage collection", gc_pauses.freeze_startup())
            log.info("%s loaded in %.1f s", self.model_name, time.perf_counter() - t0)
        except BaseException as e:  # reported through /health and 503s, not a dead server
            log.exception("loading the model failed")
            self.load_error = f"{type(e).__name__}: {e}"
            started = self.aengine or aengine
            if started is not None and not self.ready:  # the warm-up (or the attach) failed after the build
                started.shutdown()
        finally:
            self.loading = False

    @property
    def wants_boundaries(self) -> bool:
        """Whether the engine's prefix cache keeps state at message ends (sliding windows,
        recurrent snapshots): only then is finding them worth the extra template renders."""
        prefix = self.engine.prefix if self.engine is not None else None
        return prefix is not None and prefix.needs_boundaries

    def _attach(self, engine: Engine, ready: bool = True, aengine: AsyncEngine | None = None) -> None:
        """Take `engine` and its AsyncEngine (started here unless given); requests are served once
        `_ready()` ran (now, unless `ready` is False: the loader warms it up on its engine thread first)."""
        c = self.config
        self.engine = engine
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.texts = TokenText(self.tokenizer)
        # prompts extending a recent prompt's text tokenize their new part only (prefix_tokens.py)
        self.prompt_tokens = PrefixTokens(self.tokenizer)
        self.vocab_size = engine.vocab_size
        if c.chat_template is not None:  # --chat-template: the server's copy renders every chat prompt
            self.tokenizer.chat_template = c.chat_template
        self.reasoning = detect_reasoning(getattr(self.tokenizer, "chat_template", None), _vocab(self.tokenizer))
        if not c.served_model_name:
            self.model_name = served_name(engine.model_path) if engine.model_path else "graphc"
        self.sampling_defaults, sources = sampling_defaults(c.sampling_flags, engine.model_path, c.generation_config,
                                                            c.default_temperature)
        if set(sources.values()) != {"OpenAI's default"}:
            log.info("%s: sampling defaults for requests that leave them out: %s", self.model_name,
                     describe(self.sampling_defaults, sources))
        cfg = engine.config or {}
        self.max_model_len = int(c.max_model_len or cfg.get("max_position_embeddings")
                                 or cfg.get("max_seq_len") or 4096)
        self.max_prompt_tokens = min(c.max_prompt_tokens or self.max_model_len - 1, self.max_model_len - 1)
        budget = getattr(engine.scheduler, "kv_budget", None)
        if budget is not None:  # the engine refuses prompts that cannot fit its KV budget with room to decode
            self.max_prompt_tokens = min(self.max_prompt_tokens, budget - getattr(engine.scheduler, "HEADROOM", 0))
            # The budget is a hard cap: no one request can hold more (Scheduler.at_kv_limit), so
            # prompt + max_tokens beyond it is refused up front rather than cut short.
            self.max_model_len = min(self.max_model_len, budget - 1)
        self.max_prompt_chars = self.max_prompt_tokens * max_chars_per_token(self.tokenizer)
        self.aengine = aengine if aengine is not None else AsyncEngine(engine)
        if ready:
            self._ready()

    def _ready(self) -> None:
        self.ready = True
        log.info("serving %s (context %d tokens)", self.model_name, self.max_model_len)

    def stop(self) -> None:
        if self.registry is not None:
            self.registry.stop()
        else:
            self.stop_own()

    def stop_own(self) -> None:
        if self.aengine is not None:
            self.aengine.shutdown()
        self._cpu.shutdown(wait=False, cancel_futures=True)

    def unload(self) -> None:
        """Drop the engine (the registry unloads idle models to make room); the next route() reloads."""
        a, self.aengine, self.engine = self.aengine, None, None
        self.ready = False
        if a is not None:
            a.shutdown()
        log.info("unloaded %s", self.model_name)

    def begin_drain(self) -> None:
        """Stop admitting: from now on requests get 503 with Retry-After (see cli.GracefulServer)."""
        self.draining = True
        if self.registry is not None:
            self.registry.begin_drain()

    def route(self, model: str | None) -> "ServerState":
        """The state serving a request for `model`: this one (after the name check) on a
        single-model server, else the registry's pick (404 unknown, 503 while it loads)."""
        if self.registry is not None:
            return self.registry.route(model)
        self.require_ready()  # while it loads a single server answers 503, whatever the name
        self.check_model(model)
        return self

    async def run_cpu(self, fn, *args):
        """fn(*args) on the tokenization thread (tokenizing, chat templates)."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    # -- checks ----------------------------------------------------------------------------
    def require_ready(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down; retry on another instance or after restart",
                           code="shutting_down", headers={"Retry-After": "5"})
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", code="model_load_failed")
        if not self.ready:
            raise APIError(503, "the model is still loading; retry shortly", code="model_loading",
                           headers={"Retry-After": "2"})
        if not self.aengine.alive:
            err = self.aengine.error
            raise APIError(503, "the engine is not running" + (f": {err}" if err else ""), code="engine_unavailable")

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            shown = model if len(model) <= 100 else model[:100] + "…"  # never echo a whole hostile value
            raise APIError(404, f"the model '{shown}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    def check_n(self, n: int) -> None:
        if not 1 <= n <= self.config.max_n:
            raise bad_request(f"n must be in 1..{self.config.max_n}, got {n}", "n", code="invalid_value")

    def max_tokens_for(self, prompt_len: int, requested: int | None, default: int | None,
                       param: str = "max_tokens", clamp: bool = False) -> int:
        """The completion budget of one prompt; 400 context_length_exceeded when it does not fit
        (`clamp`: a request past the context gets what fits instead)."""
        ctx = self.max_model_len
        if prompt_len > self.max_prompt_tokens:
            raise bad_request(
                f"the prompt has {prompt_len} tokens; this server accepts at most {self.max_prompt_tokens} "
                f"(the model's context is {ctx} tokens)", "messages" if param == "max_completion_tokens" else "prompt",
                code="context_length_exceeded")
        room = ctx - prompt_len
        if requested is None and self.config.max_tokens is not None:  # --max-tokens: every route's default
            default = self.config.max_tokens
        if requested is None:
            return min(default, room) if default else room
        if requested < 0:  # 0: the prompt only, no tokens (the Engine's rule; docs/server.md)
            raise bad_request(f"{param} must be at least 0, got {requested}", param, code="invalid_value")
        if requested > room and clamp:
            return room
        if requested > room:
            raise bad_request(
                f"this model's maximum context length is {ctx} tokens; you requested {prompt_len + requested} "
                f"({prompt_len} in the prompt, {requested} for the completion); reduce the prompt or {param}",
                param, code="context_length_exceeded")
        return requested

    # -- submission -------------------------------------------------------------------------
    async def submit(self, items: list[tuple], req=None) -> StreamGroup:
        """Admission control, then hand the sequences to the engine thread."""
        if not self.ready:  # unloaded (models.py) while this request was being tokenized
            self.require_ready()
        limit = self.engine.scheduler.max_batch + self.config.max_queued
        if len(items) > limit:
            raise bad_request(f"this request asks for {len(items)} sequences; the server runs at most {limit} "
                              "at once (lower n or send fewer prompts)", "n", code="invalid_value")
        if self.aengine.num_inflight + len(items) > limit:
            self.metrics.rejected["overloaded"] += 1
            raise APIError(503, f"the server is overloaded ({self.aengine.num_inflight} sequences in flight, "
                                f"limit {limit}); retry later", code="overloaded", headers={"Retry-After": "1"})
        if self.draining:
            self.require_ready()
        try:
            return await self.aengine.add_group(items)
        except EngineClosed:
            raise APIError(503, "the server is shutting down", code="engine_unavailable") from None
        except ValueError as e:  # the engine's own checks (prompt ids, grammar compile, ...)
            raise param_error(e, req) from None


def _vocab(tokenizer) -> dict:
    try:
        return tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: the chat template decides alone
        return {}


def max_chars_per_token(tokenizer) -> int:
    """An upper bound on the characters one token stands for, from the vocabulary (byte-level
    BPE spells a token with one character per byte, so its length bounds the text it covers),
    doubled for normalizers that expand text; at least 16."""
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: a generous fixed bound
        longest = 64
    return max(16, 2 * longest)
