"""Server settings: what to load, where to listen, and the limits that keep one client from
taking the server down (body size, prompt length, n, queue depth)."""

from __future__ import annotations

import re

import attrs


@attrs.define
class ServerConfig:
    model: str | None = None  # model folder; None = the built-in demo model
    graph: str | None = None  # step graph file or built-in name; None = picked from the layers
    adapter_path: str | None = None  # a LoRA adapter folder applied over `model` (compiler/adapters.py)
    served_model_name: str | None = None  # the `model` clients send; default: the folder's name
    # several models (server/models.py): "PATH" or "NAME=PATH" each, and/or every model folder in
    # models_dir; the first loads at startup, the others on first use, LRU-unloaded under the budget
    models: list[str] | None = None
    models_dir: str | None = None
    max_loaded_models: int | None = None  # None: no limit on the count
    max_loaded_bytes: int | None = None  # weight bytes on disk of the loaded models; None: no limit
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
    step_tokens: int | None = None  # prompt tokens a step spends while rows decode; None = the engine's default
    kv_budget_tokens: int | None = None  # KV tokens the scheduler may hold; None = unbounded
    pad_final_chunk: bool | str = "auto"  # Engine(pad_final_chunk=): "auto" (on with CUDA), True, False
    final_chunk: str = "auto"  # Engine(final_chunk=): "auto" (the prefill pass decides), "whole", "split"
    linear_prefill: str = "auto"  # Engine(linear_prefill=): "auto" (chunked on CUDA), "chunked", "mlx-lm"
    cpu_weights: str | None = None  # Engine.load(cpu_weights=): "auto", "stored", "float32"; None: auto
    kv_bits: int | None = None  # full-attention KV quantized to 8 or 4 bits (not exact); None = the graph's
    kv_group_size: int | None = None  # with kv_bits: values per scale/bias (None: 64)
    speculative: str | None = None  # default for requests that do not say: "prompt_lookup" | "off" (docs/speculative.md)
    num_draft_tokens: int | None = None  # k for that default (None: the method's default)
    draft_model: str | None = None  # a small model of the same tokenizer drafting for method "draft_model"
    distributed: bool = False  # tensor parallel over mlx.launch's world group (docs/distributed.md)
    compile: bool | str | None = None  # Engine(compile=): True / False / "auto" / "measured"; None = the graph's
    mixed_step: bool | None = None  # decode: {mixed_step:}: a prompt chunk rides the decode forward; None = the graph's
    warmup: bool = True  # a greedy and a sampled request before ready (runtime/warmup.py); single-process only
    warm_continuations: bool = False  # Engine(warm_continuations=): a next turn's shapes built while idle
    # After load and warm-up, freeze the process's objects out of Python's full collections
    # (runtime/gc_pauses.py). Process-wide, so off for an app that embeds the server; `graphc
    # serve` owns its process and turns it on (--no-gc-freeze keeps Python's default).
    gc_freeze: bool = False
    kv_cache_dir: str | None = None  # the prefix cache's disk tier (docs/cache-policies.md#the-disk-tier)
    kv_cache_disk_gb: float | None = None  # its size cap, least recently used files first; None: no cap
    kv_cache_block_tokens: int | None = None  # tokens per disk block file; None: 256
    kv_cache_disk_read: str = "auto"  # a disk hit read back or recomputed: "auto" (measured), "always", "never"
    snapshot_interval: int | None = None  # recurrent-state snapshots every N prompt tokens; None: 4096

    # limits
    max_model_len: int | None = None  # context; default: config.json's max_position_embeddings
    max_prompt_tokens: int | None = None  # default: max_model_len - 1
    max_body_bytes: int = 4 * 1024 * 1024
    max_n: int = 16  # choices per prompt
    max_prompts: int = 64  # prompts in one /v1/completions call
    max_queued: int = 256  # requests waiting beyond the decode batch before 503
    default_temperature: float = 1.0  # OpenAI's default when a request leaves it out
    default_completion_max_tokens: int = 16  # OpenAI's default for /v1/completions

    # what a request leaves out (server/defaults.py): flags first, then the model's generation_config.json
    sampling_flags: dict = attrs.field(factory=dict)  # --temperature, --top-p, --top-k, --min-p, --repetition-penalty
    generation_config: bool = True  # read sampling defaults from the model's generation_config.json
    max_tokens: int | None = None  # the budget of a request without one (every route); None: OpenAI's
    chat_template: str | None = None  # a template's text that replaces the model's
    chat_template_args: dict | None = None  # template keywords a request's chat_template_kwargs add to / override

    @property
    def several_models(self) -> bool:
        return bool(self.models) or self.models_dir is not None


def parse_bytes(text: str) -> int:
    """`8G`, `512M`, `1500000` -> bytes (K/M/G/T are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 8G, 512M or a number of bytes)")
    scale = 1024 ** " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * scale)
