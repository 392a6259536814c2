"""Latency against throughput: one line per server through its rates (medians over repeats)."""

from __future__ import annotations

import sys
import textwrap


def plot_serving(result: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the `bench` extra is optional
        print(f"graphc bench --serving: matplotlib is not installed (pip install 'graphc[bench]'): no plot {path}",
              file=sys.stderr)
        return False
    servers = [s for s in ("graphc", "mlx_lm") if s in result["config"]["servers"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "ttft_p99", "TTFT p99"), (axes[1], "itl_p99", "inter-token latency p99")):
        for s in servers:
            pts = [(rk, per[s]["output_tok_per_s"], per[s][key]) for rk, per in result["summary"].items()
                   if per[s]["output_tok_per_s"] and per[s][key]]
            if not pts:
                continue
            xs = [p[1]["median"] for p in pts]
            ys = [p[2]["median"] * 1e3 for p in pts]
            err = [[y - p[2]["min"] * 1e3 for y, p in zip(ys, pts)], [p[2]["max"] * 1e3 - y for y, p in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=s)
            for x, y, p in zip(xs, ys, pts):
                ax.annotate(p[0], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title} vs throughput (labels: req/s)")
        ax.grid(alpha=0.3)
        ax.legend()
    # the whole command, wrapped: a long one ran past the figure's edges
    fig.suptitle(textwrap.fill(result.get("command", "graphc bench --serving"), 160), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
