"""The `graphc` command line: generate, chat, inspect, validate, import-gguf, make-model, serve, bench.

The composition root (cli/__init__.py): it wires the compiler's commands and the runtime's."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from graphc.compiler.argtypes import (DefaultsHelpFormatter, add_cpu_weights_argument, add_kv_bits_arguments,
                                      non_negative_int, positive_int)
from graphc.compiler.decode_options import COMPILE_FLAG, COMPILE_FLAG_HELP
from graphc.compiler.errors import GraphError
from graphc.contracts.providers import Lazy, resolve


class _Parser(argparse.ArgumentParser):
    """Every `graphc` parser and subparser (add_subparsers makes its parsers of this class) shows defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        # argparse prints no help line (so no default) for a flag without help text
        if kwargs.get("help") is None and kwargs.get("default") not in (None, False):
            kwargs["help"] = "default: %(default)s"
        return super().add_argument(*args, **kwargs)


def _version() -> str:
    try:
        return version("graphc")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


_LOWERING_HELP = ("auto: the fast path where the model type has one and it passes the load-time self-check, else "
                  "the model's own forward; generic: always the model's own forward")


# The commands themselves (cli/commands.py, the serve and bench packages) import the compiler,
# the runtime and MLX at their top; they are named here by string and imported only when one
# runs, so that `import graphc.cli` and the parser stay light.
GENERATE = "graphc.cli.commands:cmd_generate"
CHAT = "graphc.cli.chat:cmd_chat"
INSPECT = "graphc.cli.commands:cmd_inspect"
VALIDATE = "graphc.cli.commands:cmd_validate"
IMPORT_GGUF = "graphc.cli.commands:cmd_import_gguf"
MAKE_MODEL = "graphc.cli.commands:cmd_make_model"
MAKE_MODEL_ARGUMENTS = "graphc.compiler.modelgen:add_cli_arguments"
# (command, module whose add_parser adds it): parts that need an optional extra, skipped when absent
PARSERS = (("serve", "graphc.runtime.server.cli"), ("bench", "graphc.benchmarks.cli"))
# A failed distributed group (runtime/distributed/) is reported without a traceback.
DISTRIBUTED_GROUP = "graphc.runtime.distributed.group"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="graphc", description="LLM serving on MLX with declared step graphs.")
    p.add_argument("--version", action="version", version=f"graphc {_version()}")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr (loading, self-check, warm-up timings); warnings still print")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate a continuation of PROMPT (streams to the terminal)")
    g.add_argument("prompt")
    g.add_argument("--model", help="model folder or .gguf file (default: the built-in demo model)")
    g.add_argument("--adapter-path", help="a LoRA adapter folder (mlx_lm.lora's output) applied over --model")
    g.add_argument("--graph", help="step graph file or built-in name (default: picked from the layer types)")
    g.add_argument("--max-tokens", type=non_negative_int, default=64,
                   help="tokens to generate at most; 0: the prompt only (nothing is generated)")
    g.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: 1.0 keeps every token")
    g.add_argument("--top-k", type=non_negative_int, default=0, help="0: no top-k filter")
    g.add_argument("--seed", type=int, help="sampling seed (default: a fresh one each run)")
    g.add_argument("--prefill-chunk", type=positive_int, default=2048, help="prompt tokens per prefill chunk")
    g.add_argument("--chat", action="store_true", help="wrap PROMPT in the model's chat template")
    g.add_argument("--lowering", choices=["auto", "fast", "generic"], default="auto", help=_LOWERING_HELP)
    g.add_argument("--compile", choices=list(COMPILE_FLAG), default="graph", help=COMPILE_FLAG_HELP)
    add_kv_bits_arguments(g)
    add_cpu_weights_argument(g)
    g.set_defaults(func=Lazy(GENERATE, "graphc generate"))

    c = sub.add_parser("chat", help="chat with a model in the terminal (streams replies; /reset, /help, /quit)")
    c.add_argument("--model", help="model folder or .gguf file (default: the built-in demo model)")
    c.add_argument("--adapter-path", help="a LoRA adapter folder (mlx_lm.lora's output) applied over --model")
    c.add_argument("--graph", help="step graph file or built-in name (default: picked from the layer types)")
    c.add_argument("--system-prompt", help="a system message that opens every conversation")
    c.add_argument("--chat-template", help="a chat template that replaces the model's: chatml (built in), a file, "
                                           "or the jinja text itself")
    c.add_argument("--max-tokens", type=positive_int, default=512, help="most tokens in one reply")
    c.add_argument("--temperature", "--temp", type=float, default=0.0, help="0: greedy")
    c.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: 1.0 keeps every token")
    c.add_argument("--top-k", type=non_negative_int, default=0, help="0: no top-k filter")
    c.add_argument("--seed", type=int, help="sampling seed (default: a fresh one each run)")
    add_cpu_weights_argument(c)
    c.set_defaults(func=Lazy(CHAT, "graphc chat"))

    i = sub.add_parser("inspect", help="print the lowered plan of GRAPH bound to a model")
    i.add_argument("graph", help="graph file or built-in name (dense, sliding, hybrid), or 'auto' (picked from the layer kinds)")
    i.add_argument("--lowering", choices=["auto", "fast", "generic"], default="auto", help=_LOWERING_HELP)
    i.add_argument("--model", help="model folder or .gguf file (default: the built-in demo model)")
    i.add_argument("--kind", choices=["prefill", "decode"], default="decode")
    i.add_argument("--format", choices=["text", "json", "dot"], default="text")
    i.add_argument("--no-trace", action="store_true", help="skip tracing the lowered step for its op counts")
    i.add_argument("--compile", action="store_true",
                   help="as an Engine with compile on runs it (same as the graph declaring `decode: {compile: true}`)")
    i.add_argument("--final-chunk", choices=["auto", "whole", "split"], default="auto",
                   help="as Engine(final_chunk=) asks: a prompt's last chunk as one forward or as L-1 positions then "
                        "the last (default auto: the pass decides from the device; --kind prefill shows it)")
    i.add_argument("--pad-final-chunk", choices=["auto", "on", "off"], default="auto",
                   help="as Engine(pad_final_chunk=) asks (default auto: on with MLX's CUDA backend, where exact)")
    i.add_argument("--linear-prefill", choices=["auto", "chunked", "mlx-lm"], default="auto",
                   help="as Engine(linear_prefill=) asks: gated-delta layers' prompt chunks chunkwise or as mlx-lm's "
                        "recurrence (default auto: chunked on CUDA where it passes the self-check against the "
                        "loop, else the loop; --kind prefill shows which and why)")
    i.add_argument("-o", "--output", help="write to this file instead of stdout")
    add_kv_bits_arguments(i)
    add_cpu_weights_argument(i)
    i.set_defaults(func=Lazy(INSPECT, "graphc inspect"))

    v = sub.add_parser("validate", help="check GRAPH and report every problem found")
    v.add_argument("graph")
    v.add_argument("--model", help="also render with this model's config and bind to it")
    v.set_defaults(func=Lazy(VALIDATE, "graphc validate"))

    gg = sub.add_parser("import-gguf", help="convert a llama.cpp GGUF file into an mlx-lm model folder")
    gg.add_argument("file", help="the .gguf file (architectures and types: docs/gguf.md)")
    gg.add_argument("--out", required=True, help="new folder to write (config.json, weights, tokenizer)")
    gg.add_argument("--widen-dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                    help="dtype for types with no exact MLX form (Q2_K, Q3_K, Q6_K, IQ4_*); float32 is exact "
                         "(default: float16)")
    gg.set_defaults(func=Lazy(IMPORT_GGUF, "graphc import-gguf"))

    m = sub.add_parser("make-model", help="write a tiny random-weight model folder of a real mlx-lm architecture")
    resolve(MAKE_MODEL_ARGUMENTS, "graphc make-model")(m)
    m.set_defaults(func=Lazy(MAKE_MODEL, "graphc make-model"))

    for name, module in PARSERS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue  # optional parts not installed
        mod.add_parser(sub)
    return p


def _setup_logging(args) -> None:
    """graphc's progress lines (loading, self-check, warm-up, with timings) go to stderr through
    logging; --quiet keeps only warnings. `graphc serve` sets up its own (--log-level)."""
    if args.command == "serve":
        if args.quiet:
            args.log_level = "warning"
        return
    root = logging.getLogger("graphc")
    root.setLevel(logging.WARNING if args.quiet else logging.INFO)
    if not any(getattr(h, "graphc_cli", False) for h in root.handlers):
        handler = logging.StreamHandler()  # sys.stderr at the time of each write (tests capture it)
        handler.graphc_cli = True
        handler.setFormatter(logging.Formatter("graphc: %(message)s"))
        root.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args)
    try:
        return args.func(args) or 0
    except (FileNotFoundError, GraphError, ValueError) as e:
        # A user's mistake (a missing folder, a bad graph, a bad flag value): say what, no traceback.
        if os.environ.get("GRAPHC_DEBUG"):
            raise
        print(f"graphc: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        # A distributed group that failed (runtime/distributed/): its message says which rank and why.
        group = sys.modules.get(DISTRIBUTED_GROUP)
        if group is None or not isinstance(e, group.GroupFailed) or os.environ.get("GRAPHC_DEBUG"):
            raise
        print(f"graphc: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
