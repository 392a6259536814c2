"""`graphc bench` once its flags are parsed (benchmarks/cli.py): the workloads, --user-api,
--serving, --kv-capacity."""

from __future__ import annotations

import sys

import mlx.core as mx
from tqdm import tqdm

from graphc.runtime.kernels import skinny_matmul

from .agent_replay import cmd_agent_replay
from .env import environment
from .kv_capacity import cmd_kv_capacity
from .report import plot, tables, write_json
from .run import WORKLOADS, BenchConfig, run_bench
from .serving.run import cmd_serving
from .shapes import load_shape
from .user_api import USER_WORKLOADS, UserConfig, run_user_api, user_cases, user_tables


def _cases(s: str) -> tuple:
    try:
        return tuple(tuple(int(v) for v in c.lower().split("x")) for c in s.split(",") if c)
    except ValueError:
        raise SystemExit(f"graphc bench: --prefill-cases takes REQUESTSxTOKENS,... (e.g. 32x2048,1x8192), got {s!r}")


# `graphc bench --user-api` on a CPU (no GPU backend): sizes that finish in about a minute on a
# 2-core laptop-class CPU; a GPU gets the sizes the docs' tables were measured at.
CPU_USER_DEFAULTS = {"batches": (1, 8), "long_new": 48, "prefill_cases": "4x256"}
GPU_USER_DEFAULTS = {"batches": (1, 8, 32, 64), "long_new": 144, "prefill_cases": "32x2048,1x8192"}


def _on_gpu() -> bool:
    return mx.cuda.is_available() or mx.metal.is_available()


def cmd_user_api(args) -> int:
    defaults = GPU_USER_DEFAULTS if _on_gpu() else CPU_USER_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    wl = tuple(w for w in args.user_workloads.split(",") if w)
    bad = [w for w in wl if w not in USER_WORKLOADS]
    if bad:
        raise SystemExit(f"graphc bench: unknown --user-workloads {', '.join(bad)} (choose from {', '.join(USER_WORKLOADS)})")
    cfg = UserConfig(batches=args.batches, prompt_len=args.prompt_len, short_new=args.short_new,
                     long_new=args.long_new, repeats=args.user_repeats, prefill_cases=_cases(args.prefill_cases),
                     workloads=wl, compile=args.compile is not False, seed=args.seed,
                     num_draft_tokens=args.num_draft_tokens, measured=args.compile_measured,
                     skinny=args.user_skinny)
    env = environment()
    model, tokenizer, config, label = load_shape(args.model, args.dtype, args.seed, dequantize=args.dequantize)
    head = {"environment": env, "model": {"name": label, "dtype": args.dtype}}
    rows: list = []
    shown = 0
    bar = tqdm(total=user_cases(cfg), desc="graphc bench --user-api", unit="case", file=sys.stderr,
               disable=not args.progress)

    def log(line: str) -> None:
        # Each finished case: its line on stderr, its table row on stdout now (not only at the end).
        nonlocal shown
        tqdm.write(line, file=sys.stderr)
        if line.startswith("[user-api]") and len(rows) > shown:
            bar.update(1)
            print(user_tables({**head, "rows": rows[shown:]}).split("\n", 1)[-1], flush=True)
            shown = len(rows)

    try:
        result = run_user_api(model, tokenizer, config, cfg, log=log, rows=rows)
    except ValueError as e:
        raise SystemExit(f"graphc bench: {e}")
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: the {len(rows)} finished case(s) of {user_cases(cfg)}:", flush=True)
        print(user_tables({**head, "rows": rows, "notes": []}), flush=True)
        return 130
    bar.close()
    result.update(**head, command="graphc " + " ".join(sys.argv[1:]))
    print("\nsummary:\n" + user_tables(result))
    if args.json_out:
        write_json(result, args.json_out)
    return 0


def cmd_bench(args) -> int:
    if args.skinny_table:  # every skinny-matmul call in this process follows the measured table
        skinny_matmul.load_table(args.skinny_table)
    if args.serving:
        return cmd_serving(args)
    if args.agent_replay:
        return cmd_agent_replay(args)
    if args.kv_capacity:
        return cmd_kv_capacity(args)
    if args.user_api:
        return cmd_user_api(args)
    if args.dequantize:
        raise SystemExit("graphc bench: --dequantize applies to --user-api runs")
    if args.batches is None:
        args.batches = GPU_USER_DEFAULTS["batches"]
    wl = tuple(w for w in args.workloads.split(",") if w)
    bad = [w for w in wl if w not in WORKLOADS]
    if bad:
        raise SystemExit(f"graphc bench: unknown workload {', '.join(bad)} (choose from {', '.join(WORKLOADS)})")
    cfg = BenchConfig(
        model=args.model, dtype=args.dtype, workloads=wl, batches=args.batches,
        sampling_batches=args.sampling_batches, chain_batches=args.chain_batches,
        host_batches=args.host_batches, grammar_batches=args.grammar_batches,
        burst_requests=args.burst_requests, admission_batch=args.admission_batch, admission_len=args.admission_len,
        admission_chunk=args.admission_chunk, matmul_batches=args.matmul_batches, prompt_len=args.prompt_len,
        warmup=args.warmup, steps=args.steps, repeats=args.repeats, prefix_len=args.prefix_len,
        prefix_requests=args.prefix_requests, suffix_len=args.suffix_len,
        prefix_max_tokens=args.prefix_max_tokens, prefix_repeats=args.prefix_repeats,
        prefix_graph=args.prefix_graph, compile=args.compile, compile_ablation=args.compile_ablation,
        seed=args.seed, progress=args.progress,
    )
    result = run_bench(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
    result["command"] = "graphc " + " ".join(sys.argv[1:])
    print(tables(result))
    if args.json_out:
        write_json(result, args.json_out)
    if args.plot:
        plot(result, args.plot)
    return 0
