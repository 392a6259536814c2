"""The --serving options of `graphc bench`. Kept apart from run.py so that building the CLI parser
does not import httpx (an optional dependency, the `bench` extra)."""

from __future__ import annotations

# A GPU sizes the mix the issue asks for; on a CPU the same mix takes hours, so the default
# shrinks it to something a tiny model finishes in about a minute (the output says so).
GPU_DEFAULTS = dict(rates="1,4,16,inf", min_input=64, max_input=4096, min_output=32, max_output=512)
CPU_DEFAULTS = dict(rates="8,inf", min_input=16, max_input=128, min_output=8, max_output=32)


def add_arguments(p) -> None:
    """The --serving options of `graphc bench` (benchmarks/cli.py adds the flag itself)."""
    g = p.add_argument_group("--serving: a load generator against graphc serve and mlx_lm.server "
                             "(docs/serving-bench.md)")
    g.add_argument("--rates", default=None, help="Poisson arrival rates in req/s, inf = all at once "
                   f"(default: {GPU_DEFAULTS['rates']} on a GPU, {CPU_DEFAULTS['rates']} on the CPU)")
    g.add_argument("--requests", type=int, default=32, help="requests per rate")
    g.add_argument("--serving-repeats", type=int, default=3, help="repeats (servers alternate who goes first)")
    g.add_argument("--keep-servers", action="store_true",
                   help="run each server's repeats on one start, one server after the other, instead of a fresh "
                        "start per repeat with the order alternating: repeats then cost no startups")
    g.add_argument("--max-batch", type=int, default=64,
                   help="graphc --max-batch, and mlx_lm.server's --decode/--prompt-concurrency")
    g.add_argument("--min-input", type=int, default=0, help="shortest prompt in tokens (default: by device)")
    g.add_argument("--max-input", type=int, default=0, help="longest prompt in tokens (default: by device)")
    g.add_argument("--min-output", type=int, default=0, help="shortest answer in tokens (default: by device)")
    g.add_argument("--max-output", type=int, default=0, help="longest answer in tokens (default: by device)")
    g.add_argument("--concurrency", type=int, default=None, help="at most this many requests in flight")
    g.add_argument("--port", type=int, default=0, help="graphc's port, mlx_lm's is the next (default: free ports)")
    g.add_argument("--servers", default="graphc,mlx_lm", help="which servers to measure")
    g.add_argument("--graphc-args", default="", help="extra `graphc serve` flags, e.g. '--compile auto'")
    g.add_argument("--mlx-args", default="", help="extra mlx_lm.server flags")
    g.add_argument("--mlx-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for mlx_lm.server only, e.g. MLX_USE_CUDA_GRAPHS=0 (again for more)")
    g.add_argument("--log-dir", default="serving-logs", help="server logs go here")
    g.add_argument("--settle", type=float, default=0.0,
                   help="seconds each started server idles after it reports ready, before its warm-up requests "
                        "(a graphc server builds the warm-up shapes its time caps left while idle)")
    g.add_argument("--trace-steps", action="store_true",
                   help="record every graphc engine step into LOG_DIR/graphc-steps-R.jsonl "
                        "(benchmarks/serving/traced_serve.py; read with its --summarize)")
