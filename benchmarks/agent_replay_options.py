"""The --agent-replay options of `graphc bench` (benchmarks/agent_replay.py). Apart from it so that
building the CLI parser does not import httpx / tokenizers (the `bench` extra)."""

from __future__ import annotations


def add_arguments(p) -> None:
    g = p.add_argument_group("--agent-replay: a growing conversation, TTFT per turn (docs/agent-replay.md)")
    g.add_argument("--agent-replay", action="store_true",
                   help="replay a multi-turn conversation against graphc serve and mlx_lm.server: cached vs cold "
                        "TTFT per turn, graphc's disk tier, after a restart; uses --model (a folder), "
                        "--servers, --graphc-args, --mlx-args, --log-dir, --seed, --json")
    g.add_argument("--replay-context", type=int, default=4096, help="tokens of the last turn (32768 on the H200)")
    g.add_argument("--replay-turns", type=int, default=8, help="turns; turn k has context * k / turns tokens")
    g.add_argument("--replay-max-tokens", type=int, default=1,
                   help="new tokens per turn (1: the latency is the time to first token)")
    g.add_argument("--replay-gap", type=float, default=0.0,
                   help="seconds between a turn's answer and the next turn, untimed: an agent's tool call or a "
                        "user's reading (0: each turn as soon as the last one answered, the worst case)")
    g.add_argument("--replay-repeats", type=int, default=3, help="repeats on fresh server processes")
    g.add_argument("--replay-passes", default="cold,warm,disk,restart",
                   help="passes to run, comma-separated (cold always runs: the others are its ratios); "
                        "e.g. cold,warm,restart skips the disk tier's write-through pass, whose server "
                        "start and writes cost the most device time on large shapes")
