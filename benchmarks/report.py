"""The bench's output: a markdown table per workload, JSON, and an optional plot."""

from __future__ import annotations

import json
import math

from .env import describe

LABELS = {"graphc": "graphc", "graphc_compiled": "graphc+compile", "compiled_nofuse": "compile w/o fusion",
          "compiled_nokernel": "compile w/o kernel", "compiled_nokvwrite": "compile, K/V scatters",
          "compiled_noaddmm": "compile, residual adds",
          "batchgen": "mlx-lm BatchGen",
          "plain": "plain mlx-lm loop", "graphc_on": "graphc cache on", "graphc_off": "graphc cache off"}


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)


def tables(result: dict) -> str:
    m = result["model"]
    # The HBM roofline is the H200's (4.8 TB/s): printed, and compared against, only on a GPU.
    gpu = result["environment"].get("backend") == "cuda"
    roof = f"; HBM roofline {m['hbm_roofline_ms']:.3f} ms/step at 4.8 TB/s" if gpu else ""
    lines = [f"model {m['name']} ({m['dtype']}, {m['weight_bytes'] / 1e9:.2f} GB weights{roof})",
             describe(result["environment"]), ""]
    order = []
    for r in result["rows"]:
        if r["workload"] not in order:
            order.append(r["workload"])
    for w in order:
        rows = [r for r in result["rows"] if r["workload"] == w]
        vkeys = list(dict.fromkeys(k for r in rows for k in r["values"]))
        rkeys = list(dict.fromkeys(k for r in rows for k in r["ratios"]))
        extra = []
        if w == "decode":
            extra = ["ms/step (best graphc)"] + (["× roofline"] if gpu else [])
        head = ["case", "unit"] + [LABELS.get(k, k) for k in vkeys] + rkeys + extra
        lines.append(f"### {w}")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in rows:
            cells = [r["case"], r["unit"]] + [_fmt(r["values"].get(k)) for k in vkeys]
            cells += [(_fmt(r["ratios"][k]) + "×") if k in r["ratios"] else "—" for k in rkeys]
            if w == "decode":
                ms = r["ms_per_step"]
                best = min((ms[k] for k in ("graphc", "graphc_compiled") if k in ms), default=None)
                cells += [_fmt(best)] + ([_fmt(r.get("roofline_gap"))] if gpu else [])
            lines.append("| " + " | ".join(cells) + " |")
        if w == "host":
            lines.append("")
            lines.append("host detail (ms): " + "; ".join(
                f"{r['case']} {LABELS.get(n, n)}: build {d['build_ms']:.2f}, submit {d['submit_ms']:.2f}, "
                f"device {d['device_ms']:.2f}" for r in rows for n, d in r["detail"].items()))
        lines.append("")
    lines.append("ratios: graphc over the baseline in throughput (for latencies: baseline time / graphc time); "
                 ">1 means graphc is ahead.")
    for n in result["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("graphc bench: --plot needs matplotlib (pip install 'graphc[bench]')") from e
    rows = [r for r in result["rows"] if r["ratios"] and r["workload"] != "matmul"]
    labels, series = [], {}
    for r in rows:
        labels.append(f"{r['workload']} {r['case']}")
        for k, v in r["ratios"].items():
            series.setdefault(k, {})[len(labels) - 1] = v
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 0.8), 5))
    width = 0.8 / max(1, len(series))
    for j, (k, pts) in enumerate(series.items()):
        xs = [i + j * width for i in pts]
        ax.bar(xs, list(pts.values()), width, label=k)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("ratio (>1: graphc ahead)")
    m, e = result["model"], result["environment"]
    ax.set_title(f"graphc bench — {m['name']} on {e['backend']} (mlx {e['mlx']}, mlx-lm {e['mlx_lm']})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
