"""`graphc make-model` argument parsing and entry point (wired by cli/main.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
import sys

from .archs import ARCHS
from .make import make_model


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arch", required=True, choices=ARCHS, help="mlx-lm architecture to build"
    )
    parser.add_argument("--out", required=True, help="folder to write the model into (new or empty)")
    parser.add_argument("--force", action="store_true",
                        help="write into a non-empty --out folder, overwriting its config.json, weights, tokenizer")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    size = parser.add_argument_group("sizes (default: the arch's tiny preset)")
    size.add_argument("--hidden-size", type=int)
    size.add_argument("--num-layers", type=int)
    size.add_argument("--num-heads", type=int)
    size.add_argument("--num-kv-heads", type=int)
    size.add_argument("--head-dim", type=int)
    size.add_argument("--intermediate-size", type=int)
    size.add_argument("--vocab-size", type=int, help="BPE vocab (default 1024)")
    size.add_argument(
        "--sliding-window",
        type=int,
        help="window of sliding layers (llama, gpt_oss, gemma3_text)",
    )
    parser.add_argument(
        "--chat-template", default="chatml", choices=("chatml", "tools"),
        help="chatml (default) or tools: ChatML that renders tools and tool calls (Hermes/Qwen style)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "float16", "bfloat16")
    )


def run_cli(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not getattr(args, "force", False):
        what = "is not a folder" if not out.is_dir() else "is not empty"
        print(f"graphc make-model: error: --out '{out}' {what}; pass --force to overwrite it", file=sys.stderr)
        return 2
    try:
        path = make_model(
            args.arch,
            args.out,
            seed=args.seed,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            intermediate_size=args.intermediate_size,
            vocab_size=args.vocab_size,
            sliding_window=args.sliding_window,
            dtype=args.dtype,
            chat_template=args.chat_template,
        )
    except ValueError as e:
        print(f"graphc make-model: error: {e}", file=sys.stderr)
        return 2
    files = sorted(p.name for p in path.iterdir())
    print(f"wrote {args.arch} model (seed {args.seed}, {args.dtype}) to {path}")
    for name in files:
        print(f"  {name} ({(path / name).stat().st_size:,} bytes)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="graphc make-model")
    add_cli_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
