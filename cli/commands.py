"""The `graphc` commands other than serve and bench: generate, inspect, validate, import-gguf,
make-model. cli/main.py parses the flags and names these by string (imported when one runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx_lm

from graphc.compiler.bind import bind
from graphc.compiler.compile import compile_graph, declares_quantized
from graphc.compiler.decode_options import COMPILE_FLAG
from graphc.compiler.errors import GraphError
from graphc.compiler.gguf import import_gguf, resolve_model_path, summary_lines
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.modelgen import demo_model_path, run_cli
from graphc.compiler.parse import parse_collect, resolve_graph_path
from graphc.compiler.target import Requested
from graphc.compiler.validate import validate
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cpu_weights import convert as convert_weights
from graphc.runtime.distributed import launched
from graphc.runtime.target import probe_target


def model_dir_of(args) -> Path:
    """The model a command's --model names, else the built-in demo model."""
    if args.model:
        return Path(args.model)
    return demo_model_path()


def _load_model(path: Path):
    path = resolve_model_path(path)
    if not (path / "config.json").exists():
        raise SystemExit(f"graphc: no model folder at '{path}' (expected config.json); "
                         "make one with `graphc make-model --arch llama --out DIR`")
    model, tokenizer = mlx_lm.load(str(path))
    return model, tokenizer, json.loads((path / "config.json").read_text())


def cmd_generate(args) -> int:
    # Under mlx.launch every rank runs this; ranks other than 0 follow rank 0 inside load and exit there.
    engine = Engine.load(model_dir_of(args), args.graph, adapter_path=args.adapter_path,
                         prefill_chunk=args.prefill_chunk, lowering=args.lowering,
                         distributed=launched(), compile=COMPILE_FLAG[args.compile], kv_bits=args.kv_bits,
                         kv_group_size=args.kv_group_size, cpu_weights=args.cpu_weights)
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


PAD_FLAG = {"auto": "auto", "on": True, "off": False}  # --pad-final-chunk -> Engine(pad_final_chunk=)


def cmd_inspect(args) -> int:
    model, tokenizer, config = _load_model(model_dir_of(args))
    for line in summary_lines(config):  # a converted GGUF: what was kept, what widened (stderr)
        print(line, file=sys.stderr)
    convert_weights(model, args.cpu_weights)  # as an engine here would run it; logs what it did (-q hides it)
    try:
        graph = None if args.graph == "auto" else args.graph
        # The choice passes get this machine's facts (runtime/target.py), so the plan shows what an
        # engine here would run; --compile asks what Engine(compile=True) asks.
        compiled = compile_graph(graph, model, config, lowering=args.lowering, kv_bits=args.kv_bits,
                                 kv_group_size=args.kv_group_size,
                                 target=probe_target(args.kv_bits is not None or declares_quantized(graph, config)),
                                 requested=Requested.of({"compile": True} if args.compile else None,
                                                        final_chunk=args.final_chunk,
                                                        pad_final_chunk=PAD_FLAG[args.pad_final_chunk],
                                                        linear_prefill=args.linear_prefill))
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
    out = import_gguf(args.file, args.out, progress=lambda m: print(m, file=sys.stderr),
                      widen_dtype=args.widen_dtype)
    print(out)
    return 0


def cmd_make_model(args) -> int:
    return run_cli(args)
