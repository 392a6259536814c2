"""The `graphc` command line: generate, inspect, validate, import-gguf, make-model, serve, bench.

The composition root (cli/__init__.py): it wires the compiler's commands and the runtime's."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from graphc.compiler.argtypes import DefaultsHelpFormatter, non_negative_int, positive_int
from graphc.compiler.decode_options import COMPILE_FLAG, COMPILE_FLAG_HELP
from graphc.compiler.target import Requested


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


def _model_dir(args) -> Path:
    if args.model:
        return Path(args.model)
    from graphc.compiler.modelgen import demo_model_path

    return demo_model_path()


def _load_model(path: Path):
    import mlx_lm

    from graphc.compiler.gguf import resolve_model_path

    path = resolve_model_path(path)
    if not (path / "config.json").exists():
        raise SystemExit(f"graphc: no model folder at '{path}' (expected config.json); "
                         "make one with `graphc make-model --arch llama --out DIR`")
    model, tokenizer = mlx_lm.load(str(path))
    return model, tokenizer, json.loads((path / "config.json").read_text())


_LOWERING_HELP = ("auto: the fast path where the model type has one and it passes the load-time self-check, else "
                  "the model's own forward; generic: always the model's own forward")


def cmd_generate(args) -> int:
    from graphc.runtime import Engine, SamplingParams

    from graphc.runtime.distributed import launched

    # Under mlx.launch every rank runs this; ranks other than 0 follow rank 0 inside load and exit there.
    engine = Engine.load(_model_dir(args), args.graph, prefill_chunk=args.prefill_chunk, lowering=args.lowering,
                         distributed=launched(), compile=COMPILE_FLAG[args.compile])
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True, tokenize=True)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    rid = engine.add_request(prompt, params)
    if isinstance(args.prompt, str) and not args.chat:
        sys.stdout.write(args.prompt)
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                sys.stdout.write(out.new_text)
                sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_inspect(args) -> int:
    from graphc.compiler.compile import compile_graph
    from graphc.compiler.errors import GraphError
    from graphc.compiler.inspect import inspect_plan

    from graphc.compiler.gguf import summary_lines

    model, tokenizer, config = _load_model(_model_dir(args))
    for line in summary_lines(config):  # a converted GGUF: what was kept, what widened (stderr)
        print(line, file=sys.stderr)
    try:
        graph = None if args.graph == "auto" else args.graph
        # The choice passes get this machine's facts (runtime/target.py), so the plan shows what an
        # engine here would run; --compile asks what Engine(compile=True) asks. (Imported here:
        # `import graphc.cli` loads no runtime module, tests/test_imports.py.)
        from graphc.runtime.target import probe_target

        compiled = compile_graph(graph, model, config, lowering=args.lowering, target=probe_target(),
                                 requested=Requested.of({"compile": True} if args.compile else None))
    except GraphError as e:
        print(e, file=sys.stderr)
        return 1
    text = inspect_plan(compiled, args.kind, args.format, trace=not args.no_trace)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_validate(args) -> int:
    from graphc.compiler.bind import bind
    from graphc.compiler.errors import GraphError
    from graphc.compiler.parse import parse_collect, resolve_graph_path
    from graphc.compiler.validate import validate

    try:
        path = resolve_graph_path(args.graph)
    except FileNotFoundError as e:
        print(f"graphc: {e}", file=sys.stderr)
        return 2
    config, model = {}, None
    if args.model:
        model, _, config = _load_model(Path(args.model))
    spec, diags = parse_collect(path.read_text(), str(path), config)
    if spec is not None:
        diags += validate(spec)
        if model is not None and not any(d.severity == "error" for d in diags):
            try:
                bind(spec, model, config)
            except GraphError as e:
                diags += e.diagnostics
    errors = [d for d in diags if d.severity == "error"]
    for d in diags:
        print(d)
    if errors:
        print(f"{path}: {len(errors)} error(s), {len(diags) - len(errors)} warning(s)")
        return 1
    bound = f" and binds to {config.get('model_type')} model {args.model}" if model is not None else ""
    print(f"{path}: ok{bound} ({len(diags)} warning(s))")
    return 0


def cmd_import_gguf(args) -> int:
    from graphc.compiler.gguf import import_gguf

    out = import_gguf(args.file, args.out, progress=lambda m: print(m, file=sys.stderr),
                      widen_dtype=args.widen_dtype)
    print(out)
    return 0


def cmd_make_model(args) -> int:
    from graphc.compiler.modelgen import run_cli

    return run_cli(args)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="graphc", description="LLM serving on MLX with declared step graphs.")
    p.add_argument("--version", action="version", version=f"graphc {_version()}")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr (loading, self-check, warm-up timings); warnings still print")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate a continuation of PROMPT (streams to the terminal)")
    g.add_argument("prompt")
    g.add_argument("--model", help="model folder or .gguf file (default: the built-in demo model)")
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
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("inspect", help="print the lowered plan of GRAPH bound to a model")
    i.add_argument("graph", help="graph file or built-in name (dense, sliding, hybrid), or 'auto' (picked from the layer kinds)")
    i.add_argument("--lowering", choices=["auto", "fast", "generic"], default="auto", help=_LOWERING_HELP)
    i.add_argument("--model", help="model folder or .gguf file (default: the built-in demo model)")
    i.add_argument("--kind", choices=["prefill", "decode"], default="decode")
    i.add_argument("--format", choices=["text", "json", "dot"], default="text")
    i.add_argument("--no-trace", action="store_true", help="skip tracing the lowered step for its op counts")
    i.add_argument("--compile", action="store_true",
                   help="as an Engine with compile on runs it (same as the graph declaring `decode: {compile: true}`)")
    i.add_argument("-o", "--output", help="write to this file instead of stdout")
    i.set_defaults(func=cmd_inspect)

    v = sub.add_parser("validate", help="check GRAPH and report every problem found")
    v.add_argument("graph")
    v.add_argument("--model", help="also render with this model's config and bind to it")
    v.set_defaults(func=cmd_validate)

    gg = sub.add_parser("import-gguf", help="convert a llama.cpp GGUF file into an mlx-lm model folder")
    gg.add_argument("file", help="the .gguf file (architectures and types: docs/gguf.md)")
    gg.add_argument("--out", required=True, help="new folder to write (config.json, weights, tokenizer)")
    gg.add_argument("--widen-dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                    help="dtype for types with no exact MLX form (Q2_K, Q3_K, Q6_K, IQ4_*); float32 is exact "
                         "(default: float16)")
    gg.set_defaults(func=cmd_import_gguf)

    m = sub.add_parser("make-model", help="write a tiny random-weight model folder of a real mlx-lm architecture")
    from graphc.compiler.modelgen import add_cli_arguments

    add_cli_arguments(m)
    m.set_defaults(func=cmd_make_model)

    for name, module in (("serve", "graphc.runtime.server.cli"), ("bench", "graphc.benchmarks.cli")):
        try:
            mod = __import__(module, fromlist=["add_parser"])
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
    import os

    from graphc.compiler.errors import GraphError

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
        group = sys.modules.get("graphc.runtime.distributed.group")
        if group is None or not isinstance(e, group.GroupFailed) or os.environ.get("GRAPHC_DEBUG"):
            raise
        print(f"graphc: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
