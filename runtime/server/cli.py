"""`graphc serve`: parse flags into a ServerConfig and run uvicorn on the app."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from graphc.compiler.argtypes import add_cpu_weights_argument, add_kv_bits_arguments, positive_int
from graphc.compiler.chat_templates import read_chat_template
from graphc.compiler.decode_options import COMPILE_FLAG, COMPILE_FLAG_HELP

from graphc.contracts.providers import resolve

from .config import ServerConfig, parse_bytes
from .defaults import SAMPLING_FIELDS, check_sampling_value, read_template_args


def add_parser(subparsers) -> None:
    s = subparsers.add_parser("serve", help="serve an OpenAI-compatible API: /v1/chat/completions, /v1/completions, "
                                    "/v1/responses, /v1/embeddings, Anthropic's /v1/messages, and /tokenize, "
                                    "/detokenize")
    s.add_argument("--model", action="append",
                   help="model folder or .gguf file (default: the built-in demo model); give it again to serve "
                        "several models, each as PATH or NAME=PATH (clients pick one by `model`)")
    s.add_argument("--models-dir", help="serve every model folder (one with config.json) and .gguf file in this "
                                        "folder, named by folder/file name")
    s.add_argument("--max-loaded-models", type=int,
                   help="with several models: how many stay loaded at once (least recently used unload first)")
    s.add_argument("--max-loaded-bytes", type=parse_bytes,
                   help="with several models: weight bytes (on disk) loaded at once, e.g. 8G")
    s.add_argument("--graph", help="step graph file or built-in name (default: picked from the layer types)")
    s.add_argument("--adapter-path", help="a LoRA adapter folder (mlx_lm.lora's adapter_config.json and "
                                          "adapters.safetensors) applied over --model (one model only)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=os.environ.get("GRAPHC_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1/* (default: $GRAPHC_API_KEY)")
    s.add_argument("--served-model-name", help="the model name clients send (default: the model folder's name)")
    s.add_argument("--max-batch", type=positive_int, default=64, help="rows in the decode batch")
    s.add_argument("--prefill-chunk", type=positive_int, default=2048, help="prompt tokens per prefill chunk")
    s.add_argument("--step-tokens", type=positive_int,
                   help="prompt tokens a step may spend while requests are decoding: the longest a prompt "
                        "stalls running streams (default: the engine's, docs/scheduling.md)")
    s.add_argument("--pad-final-chunk", choices=["auto", "on", "off"], default="auto",
                   help="pad a prompt's last prefill chunk to a multiple of 128 tokens so attention shapes repeat "
                        "(full-attention graphs only; default auto: on with MLX's CUDA backend; docs/scheduling.md)")
    s.add_argument("--final-chunk", choices=["auto", "whole", "split"], default="auto",
                   help="a prompt's last chunk as one forward, or as L-1 positions then the last (default auto: "
                        "whole on CUDA, split on the CPU; `graphc inspect --kind prefill` says why)")
    s.add_argument("--linear-prefill", choices=["auto", "chunked", "mlx-lm"], default="auto",
                   help="gated-delta (hybrid) layers' prompt chunks: chunkwise-parallel, or mlx-lm's recurrence, a "
                        "per-position loop off Metal (default auto: chunked on CUDA where it passes the self-check "
                        "against the loop; 'chunked': checked against mlx-lm with the chunked recurrence where it "
                        "does not; docs/cpu-prefill.md#hybrid-models)")
    s.add_argument("--kv-budget-tokens", type=int,
                   help="KV tokens the scheduler may hold (admission control, preemption); default: unbounded")
    add_kv_bits_arguments(s)
    add_cpu_weights_argument(s)
    s.add_argument("--speculative", choices=["off", "prompt_lookup", "draft_model"],
                   help="speculative decoding for requests that do not set `speculative` (default: off, or "
                        "draft_model with --draft-model; docs/speculative.md)")
    s.add_argument("--draft-model", help="a small model folder or .gguf with the same tokenizer, drafting for "
                                         "speculative decoding")
    s.add_argument("--num-draft-tokens", type=int, help="draft tokens verified per step with --speculative (default on a GPU: 16 for prompt lookup, 8 for a draft model; 4 on the CPU)")
    s.add_argument("--compile", choices=list(COMPILE_FLAG), default="graph", help=COMPILE_FLAG_HELP)
    s.add_argument("--mixed-step", choices=["graph", "on", "off"], default="graph",
                   help="a prompt chunk rides the decode step's forward: one pass for the running rows and the "
                        "chunk (llama blocks; exact; off by default: it lost at the door on an H100 so far; "
                        "docs/scheduling.md#mixed-steps); default: what the graph's `decode:` section says")
    s.add_argument("--max-model-len", type=int, help="context length (default: the model's max_position_embeddings)")
    s.add_argument("--max-prompt-tokens", type=int, help="longest prompt accepted (default: context - 1)")
    s.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="largest request body")
    s.add_argument("--max-n", type=int, default=16, help="most choices (n) per prompt")
    s.add_argument("--max-prompts", type=int, default=64, help="most prompts in one /v1/completions call")
    s.add_argument("--max-queued", type=int, default=256,
                   help="sequences that may wait beyond the decode batch before requests get 503")
    s.add_argument("--allowed-hosts", type=_csv,
                   help="comma-separated Host names to answer besides loopback ones ('*': any); by default a "
                        "loopback-bound server refuses other Host headers (DNS rebinding) with 403")
    s.add_argument("--cors-origins", type=_csv,
                   help="comma-separated origins browsers may read responses from (default: CORS off)")
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests may finish after SIGTERM/SIGINT before they are aborted")
    s.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="before reporting ready, run a greedy and a sampled request so the first client does not "
                        "pay for kernel builds and compiled traces (default: on; a distributed server skips it)")
    s.add_argument("--warm-continuations", action="store_true",
                   help="on a GPU, when a request ends, build the attention shapes of its conversation's next "
                        "turn while the engine idles, so a long conversation's next turn meets no new cuDNN "
                        "plan (opt-in; docs/scheduling.md#a-conversations-next-turn)")
    s.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="once the model is loaded and warmed up, freeze its objects out of Python's full garbage "
                        "collections, which otherwise pause every stream for tens of ms (default: on; "
                        "docs/server.md)")
    s.add_argument("--kv-cache-dir", help="keep prefix-cache KV blocks in this folder too: they are read back "
                                          "when memory misses and survive restarts (docs/cache-policies.md)")
    s.add_argument("--kv-cache-disk-gb", type=float,
                   help="size cap of --kv-cache-dir in GB (least recently used files go first; default: no cap)")
    s.add_argument("--kv-cache-disk-read", choices=["auto", "always", "never"], default="auto",
                   help="on a --kv-cache-dir hit, read the blocks back or compute those tokens again: auto (default) "
                        "reads when the measured read rate beats the measured prefill rate, always reads, never "
                        "computes (docs/cache-policies.md#disk-tier---kv-cache-dir)")
    s.add_argument("--kv-cache-block-tokens", type=positive_int,
                   help="tokens per --kv-cache-dir block file (default 256): a restarted conversation recomputes up "
                        "to this many tokens less one besides its new turn; smaller blocks, more files")
    s.add_argument("--snapshot-interval", type=positive_int,
                   help="hybrid (SSM / linear-attention) models: keep a recurrent-state snapshot every this many prompt "
                        "tokens, besides chat message ends (docs/cache-policies.md#hybrid-models; default 4096)")
    d = s.add_argument_group("defaults for what a request leaves out (docs/server.md#server-wide-defaults)")
    d.add_argument("--temperature", "--temp", type=_sampling("temperature"),
                   help="default temperature (else the model's generation_config.json, else 1.0)")
    d.add_argument("--top-p", type=_sampling("top_p"), help="default top_p (else generation_config.json, else 1.0)")
    d.add_argument("--top-k", type=_sampling("top_k"), help="default top_k (else generation_config.json, else off)")
    d.add_argument("--min-p", type=_sampling("min_p"), help="default min_p (else generation_config.json, else off)")
    d.add_argument("--repetition-penalty", type=_sampling("repetition_penalty"),
                   help="default repetition_penalty (else generation_config.json, else off)")
    d.add_argument("--generation-config", choices=["auto", "none"], default="auto",
                   help="auto: sampling defaults from the model folder's generation_config.json; none: ignore it")
    d.add_argument("--max-tokens", type=positive_int,
                   help="max_tokens of a request without one, on every route (default: the rest of the context; "
                        "16 on /v1/completions, as OpenAI)")
    d.add_argument("--chat-template", help="a chat template that replaces the model's (one model only): chatml "
                                           "(built in), a file, or the jinja text itself")
    d.add_argument("--chat-template-args", help="template keywords as a JSON object, e.g. "
                                                "'{\"enable_thinking\": false}'; a request's chat_template_kwargs "
                                                "add to and override them")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    s.set_defaults(func=cmd_serve)


def _sampling(name: str):
    """An argparse type for a sampling default: a number in the field's range."""
    def parse(text: str):
        try:
            return check_sampling_value(name, float(text))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name  # argparse names the type in its error
    return parse


def config_from_args(args) -> ServerConfig:
    specs = args.model or []
    several = len(specs) > 1 or args.models_dir is not None
    if several:
        for flag, value in (("--served-model-name", args.served_model_name), ("--draft-model", args.draft_model),
                            ("--adapter-path", args.adapter_path)):
            if value:
                raise SystemExit(f"{flag} serves one model; with several, name each --model NAME=PATH")
    elif args.max_loaded_models is not None or args.max_loaded_bytes is not None:
        raise SystemExit("--max-loaded-models / --max-loaded-bytes need several models "
                         "(--model twice or --models-dir)")
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise SystemExit("--max-loaded-models must be at least 1")
    if several and args.chat_template:
        raise SystemExit("--chat-template replaces one model's template; with several models, "
                         "give each model folder its own")
    try:
        template = read_chat_template(args.chat_template) if args.chat_template else None
        template_args = read_template_args(args.chat_template_args) if args.chat_template_args else None
    except (OSError, ValueError) as e:
        raise SystemExit(str(e)) from None
    return ServerConfig(
        model=None if several else (specs[0] if specs else None), graph=args.graph, adapter_path=args.adapter_path,
        models=specs if several else None, models_dir=args.models_dir,
        max_loaded_models=args.max_loaded_models, max_loaded_bytes=args.max_loaded_bytes,
        served_model_name=args.served_model_name, host=args.host,
        port=args.port, api_key=args.api_key or None, max_batch=args.max_batch, prefill_chunk=args.prefill_chunk,
        step_tokens=args.step_tokens, pad_final_chunk={"on": True, "off": False}.get(args.pad_final_chunk, "auto"),
        final_chunk=args.final_chunk, linear_prefill=args.linear_prefill, cpu_weights=args.cpu_weights,
        kv_budget_tokens=args.kv_budget_tokens, kv_bits=args.kv_bits, kv_group_size=args.kv_group_size, speculative=args.speculative,
        num_draft_tokens=args.num_draft_tokens, draft_model=args.draft_model,
        max_model_len=args.max_model_len, max_prompt_tokens=args.max_prompt_tokens,
        max_body_bytes=args.max_body_bytes, max_n=args.max_n, max_prompts=args.max_prompts,
        max_queued=args.max_queued, allowed_hosts=args.allowed_hosts, cors_origins=args.cors_origins,
        shutdown_timeout=args.shutdown_timeout, compile=COMPILE_FLAG[args.compile],
        mixed_step={"on": True, "off": False}.get(args.mixed_step),
        warmup=args.warmup, warm_continuations=args.warm_continuations, gc_freeze=args.gc_freeze, kv_cache_dir=args.kv_cache_dir, kv_cache_disk_gb=args.kv_cache_disk_gb,
        snapshot_interval=args.snapshot_interval, kv_cache_block_tokens=args.kv_cache_block_tokens,
        kv_cache_disk_read=args.kv_cache_disk_read,
        sampling_flags={k: getattr(args, k) for k in SAMPLING_FIELDS if getattr(args, k) is not None},
        generation_config=args.generation_config == "auto", max_tokens=args.max_tokens,
        chat_template=template, chat_template_args=template_args)


def _exit_early(sig, frame) -> None:
    raise SystemExit(0)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# The server itself (FastAPI, uvicorn, the engine) is imported only when `graphc serve` runs,
# so that `graphc --help` needs neither the server extra nor the seconds MLX takes to load.
SERVE = "graphc.runtime.server.serve:serve"


def cmd_serve(args) -> int:
    # A signal before the server is up (while mlx / the model load) is a clean exit too;
    # GracefulServer takes the signals over once it runs.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_early)
    try:
        serve = resolve(SERVE, "graphc serve")
    except ImportError as e:
        print(f"graphc serve needs the server extra: pip install 'graphc[server]' ({e})", file=sys.stderr)
        return 2
    return serve(args, config_from_args(args))
