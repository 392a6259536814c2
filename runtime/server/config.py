"""Server settings: what to load, where to listen, and the limits that keep one client from
taking the server down (body size, prompt length, n, queue depth)."""

from __future__ import annotations

import attrs


@attrs.define
class ServerConfig:
    model: str | None = None  # model folder; None = the built-in demo model
    graph: str | None = None  # step graph file or built-in name; None = picked from the layers
    served_model_name: str | None = None  # the `model` clients send; default: the folder's name
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    # Host names the server answers (None: loopback names when bound to loopback, any otherwise;
    # "*" in the list: any). Guards a loopback server against DNS rebinding (server/guard.py).
    allowed_hosts: list[str] | None = None
    cors_origins: list[str] | None = None  # origins browsers may read responses from; None = CORS off
    shutdown_timeout: float = 30.0  # seconds running requests may finish after SIGTERM before they are aborted

    # engine
    max_batch: int = 64  # decode batch rows
    prefill_chunk: int = 2048
    kv_budget_tokens: int | None = None  # KV tokens the scheduler may hold; None = unbounded
    speculative: str | None = None  # default for requests that do not say: "prompt_lookup" | "off" (docs/speculative.md)
    num_draft_tokens: int | None = None  # k for that default (None: the method's default)
    draft_model: str | None = None  # a small model of the same tokenizer drafting for method "draft_model"
    distributed: bool = False  # tensor parallel over mlx.launch's world group (docs/distributed.md)
    compile: bool | str | None = None  # Engine(compile=): True / False / "auto" / "measured"; None = the graph's
    warmup: bool = True  # a greedy and a sampled request before ready (runtime/warmup.py); single-process only

    # limits
    max_model_len: int | None = None  # context; default: config.json's max_position_embeddings
    max_prompt_tokens: int | None = None  # default: max_model_len - 1
    max_body_bytes: int = 4 * 1024 * 1024
    max_n: int = 16  # choices per prompt
    max_prompts: int = 64  # prompts in one /v1/completions call
    max_queued: int = 256  # requests waiting beyond the decode batch before 503
    default_temperature: float = 1.0  # OpenAI's default when a request leaves it out
    default_completion_max_tokens: int = 16  # OpenAI's default for /v1/completions
