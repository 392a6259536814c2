"""`graphc serve`: parse flags into a ServerConfig and run uvicorn on the app."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys

from .config import ServerConfig


def add_parser(subparsers) -> None:
    s = subparsers.add_parser("serve", help="serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions)")
    s.add_argument("--model", help="model folder (default: the built-in demo model)")
    s.add_argument("--graph", help="step graph file or built-in name (default: picked from the layer types)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=os.environ.get("GRAPHC_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1/* (default: $GRAPHC_API_KEY)")
    s.add_argument("--served-model-name", help="the model name clients send (default: the model folder's name)")
    s.add_argument("--max-batch", type=int, default=64, help="rows in the decode batch")
    s.add_argument("--prefill-chunk", type=int, default=2048, help="prompt tokens per prefill chunk")
    s.add_argument("--kv-budget-tokens", type=int,
                   help="KV tokens the scheduler may hold (admission control, preemption); default: unbounded")
    s.add_argument("--max-model-len", type=int, help="context length (default: the model's max_position_embeddings)")
    s.add_argument("--max-prompt-tokens", type=int, help="longest prompt accepted (default: context - 1)")
    s.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="largest request body")
    s.add_argument("--max-n", type=int, default=16, help="most choices (n) per prompt")
    s.add_argument("--max-prompts", type=int, default=64, help="most prompts in one /v1/completions call")
    s.add_argument("--max-queued", type=int, default=256,
                   help="sequences that may wait beyond the decode batch before requests get 503")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    s.set_defaults(func=cmd_serve)


def config_from_args(args) -> ServerConfig:
    return ServerConfig(
        model=args.model, graph=args.graph, served_model_name=args.served_model_name, host=args.host,
        port=args.port, api_key=args.api_key or None, max_batch=args.max_batch, prefill_chunk=args.prefill_chunk,
        kv_budget_tokens=args.kv_budget_tokens,
        max_model_len=args.max_model_len, max_prompt_tokens=args.max_prompt_tokens,
        max_body_bytes=args.max_body_bytes, max_n=args.max_n, max_prompts=args.max_prompts,
        max_queued=args.max_queued)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args) -> int:
    try:
        import uvicorn

        from .app import create_app
    except ImportError as e:
        print(f"graphc serve needs the server extra: pip install 'graphc[server]' ({e})", file=sys.stderr)
        return 2
    config = config_from_args(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if not _is_loopback(config.host) and not config.api_key:
        logging.getLogger("graphc.server").warning(
            "binding %s without --api-key: anyone who can reach this address can use the model", config.host)
    app = create_app(config)
    # A bounded graceful shutdown: open streams are aborted by the lifespan, not waited on forever.
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
