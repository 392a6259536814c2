"""`graphc bench`: graphc against mlx-lm on one model, in one process. See docs/performance.md."""

from __future__ import annotations

import argparse
import sys

from graphc.contracts.providers import Lazy

from .run import WORKLOADS
from .agent_replay_options import add_arguments as agent_replay_arguments
from .serving.options import add_arguments as serving_arguments

# What the command runs (benchmarks/commands.py: graphc, mlx-lm, the workloads) is imported only
# when `graphc bench` runs, not when `graphc` builds its parser.
BENCH = "graphc.benchmarks.commands:cmd_bench"


def _ints(s: str) -> tuple:
    return tuple(int(x) for x in s.split(",") if x)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark graphc against mlx-lm in the same run: the step workloads, "
                              "--user-api, --serving (against mlx_lm.server), --agent-replay, --kv-capacity",
                              description=__doc__)
    p.add_argument("--model", default="tiny",
                   help="a shape (tiny, llama-3.2-1b, llama-3.1-8b: random weights in memory) or a model folder")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="weights dtype for random shapes (and for --dequantize)")
    p.add_argument("--compile-measured", action="store_true",
                   help="--user-api: also measure graphc with compile='measured' (contestant graphc_measured)")
    p.add_argument("--user-skinny", action="store_true",
                   help="--user-api: also measure graphc with compile='auto' and the skinny matmul kernel "
                        "(Engine(skinny_gemm=True), contestant graphc_skinny; CUDA only: elsewhere a note says why not)")
    p.add_argument("--dequantize", action="store_true",
                   help="--user-api with a quantized model folder or .gguf: measure it with its weights "
                        "dequantized to --dtype (the same weights unquantized, e.g. a bf16 stand-in for a "
                        "model at hand only quantized)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--batches", type=_ints, default=None,
                   help="decode batch sizes (default: 1,8,32,64; --user-api on a CPU: 1,8)")
    p.add_argument("--sampling-batches", type=_ints, default=(1, 16, 64))
    p.add_argument("--chain-batches", type=_ints, default=(1, 32))
    p.add_argument("--host-batches", type=_ints, default=(1, 64))
    p.add_argument("--grammar-batches", type=_ints, default=(16,), help="grammar-constrained vs greedy decode")
    p.add_argument("--burst-requests", type=int, default=32, help="short distinct prompts submitted at once")
    p.add_argument("--admission-batch", type=int, default=16, help="rows decoding while a long prompt is admitted")
    p.add_argument("--admission-len", type=int, default=2048, help="tokens of the admitted prompt")
    p.add_argument("--admission-chunk", type=int, default=256, help="prefill chunk while admitting it")
    p.add_argument("--matmul-batches", type=_ints, default=(1, 2, 4, 8, 16, 32, 64))
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--warmup", type=int, default=8, help="decode steps before timing")
    p.add_argument("--steps", type=int, default=32, help="decode steps per timed window")
    p.add_argument("--repeats", type=int, default=5, help="timed windows (the median is reported)")
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--prefix-requests", type=int, default=32)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--prefix-max-tokens", type=int, default=8)
    p.add_argument("--prefix-repeats", type=int, default=2)
    p.add_argument("--prefix-graph", default=None, help="graph with a prefix cache (default: detect)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="measure graphc+compile (default: when the Engine offers it)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--compile-ablation", action="store_true",
                   help="also measure compiled decode without fused projections, without the attention kernel, "
                   "with scatters instead of the attention kernel's K/V write, and with separate residual adds "
                   "(residual_matmul off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-capacity", nargs="?", const="1x4096+15x256", default=None, metavar="1xLONG+NxSHORT",
                   help="KV bytes per live token under a mixed-length mix, graphc vs mlx-lm (benchmarks/kv_capacity.py)")
    p.add_argument("--skinny-table", default=None, metavar="FILE",
                   help="launch table for the skinny matmul (`python -m graphc.benchmarks.kernel_tune --table FILE`)")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--plot", default=None, help="draw the ratios to this PNG (needs matplotlib)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    u = p.add_argument_group("--user-api: whole public calls (Engine.generate, mlx_lm.batch_generate), GC on")
    u.add_argument("--user-api", action="store_true",
                   help="measure through the public API instead (benchmarks/user_api.py); uses --model, "
                        "--dtype, --batches, --prompt-len, --seed, --json")
    u.add_argument("--user-workloads", default="decode,sampled,prefill",
                   help="subset of decode,sampled,prefill,grounded (grounded: speculative decoding on a "
                        "repeat-the-text task, docs/speculative.md)")
    u.add_argument("--num-draft-tokens", type=int, default=None, help="grounded: draft tokens per verify step")
    u.add_argument("--short-new", type=int, default=16, help="new tokens of the short call")
    u.add_argument("--long-new", type=int, default=None,
                   help="new tokens of the long call (steady = difference; default: 144, on a CPU 48)")
    u.add_argument("--user-repeats", type=int, default=3, help="repeats of every measurement (>= 3)")
    u.add_argument("--prefill-cases", default=None,
                   help="cold prefill cases, REQUESTSxTOKENS (default: 32x2048,1x8192; on a CPU 4x256)")
    p.add_argument("--serving", action="store_true",
                   help="load-test graphc serve against mlx_lm.server over HTTP (docs/serving-bench.md)")
    serving_arguments(p)
    agent_replay_arguments(p)
    p.set_defaults(func=Lazy(BENCH, "graphc bench"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="graphc")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = ap.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
