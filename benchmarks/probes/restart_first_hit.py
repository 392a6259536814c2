"""What a fresh `graphc serve` process pays on its first long disk hit that a later one does not.

One server writes two conversations (the agent replay's, seeds 0 and 1) up to their last turn to
a disk folder; then, per restart, a fresh server on a copy of that folder gets the bench's
4-token warm-up request, A's last turn (the first long hit of the process), B's last turn (a
second disk hit of the same shape) and A's again (a memory hit). First minus second is the
first-time cost of the process; docs/agent-replay.md has the numbers.

    python -m graphc.benchmarks.probes.restart_first_hit --model DIR [--restarts 5] [-- serve args]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from graphc.benchmarks.agent_replay import conversation, replay
from graphc.benchmarks.serving.servers import SERVERS, Server, free_port
from graphc.benchmarks.serving.workload import Request


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--log-dir", help="keep the servers' logs here (default: a temporary folder, removed)")
    ap.add_argument("serve_args", nargs="*", help="more `graphc serve` flags (after --)")
    args = ap.parse_args(argv)
    spec, body = SERVERS[0], {"ignore_eos": True}
    a, _ = conversation(args.model, args.context, args.turns, 0)
    b, _ = conversation(args.model, args.context, args.turns, 1)
    warm = [Request("warm up the kernels", 4, 0)]
    with tempfile.TemporaryDirectory(prefix="graphc-restart-") as root:
        logs, fill = Path(args.log_dir or Path(root) / "logs"), Path(root) / "fill"
        with Server(spec, args.model, free_port(), 1, logs / "fill.log",
                    ["--kv-cache-dir", str(fill), *args.serve_args]) as url:
            replay(url, a[:-1], 1, body)
            replay(url, b[:-1], 1, body)
        for i in range(args.restarts):
            copy = Path(root) / f"copy{i}"
            shutil.copytree(fill, copy)
            with Server(spec, args.model, free_port(), 1, logs / f"restart{i}.log",
                        ["--kv-cache-dir", str(copy), *args.serve_args]) as url:
                replay(url, warm, 1, body)
                first = replay(url, a[-1:], 1, body)[0]
                second = replay(url, b[-1:], 1, body)[0]
                memory = replay(url, a[-1:], 1, body)[0]
            print(f"restart {i + 1}: first long disk hit {first * 1e3:.0f} ms, second {second * 1e3:.0f} ms, "
                  f"first again (memory) {memory * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
