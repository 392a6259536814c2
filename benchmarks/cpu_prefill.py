"""Cold prefill, paired: graphc's `Engine.generate` against mlx-lm's BatchGenerator, alternating.

A machine shared with other jobs swings by tens of percent between minutes, so the two sides
are timed back to back in one process, graphc then mlx-lm, `pairs` times, each on fresh random
prompts (no prefix-cache hits), one new token each. Each pair gives two ratios, BatchGenerator's
over graphc's (above 1 graphc is faster): of the wall time until every prompt has its first
token, and of the median time to first token over the prompts (graphc hands out first tokens
per prefill step; BatchGenerator all at once). The report is their median, min and max. This is the `--user-api` prefill workload (benchmarks/user_api.py) at one case, made
robust to a noisy machine.

    python -m graphc.benchmarks.cpu_prefill --model small-32k --dtype float32 --n 8 --len 384 --pairs 7
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from statistics import median

from . import contestants as C
from .shapes import load_shape
from .user_api import GraphcUser, batchgen_first_tokens

now = time.perf_counter


def _fresh(rng: random.Random, n: int, length: int, vocab: int) -> list:
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def paired_prefill(model, tokenizer, config, *, n: int, length: int, pairs: int, seed: int = 0,
                   log=None, **engine_kw) -> dict:
    """Wall time of n fresh length-token prompts to their first token, both sides, `pairs` pairs."""
    rng = random.Random(seed)
    vocab = config["vocab_size"]
    graphc = GraphcUser(model, tokenizer, config, **engine_kw)
    graphc.generate(_fresh(rng, n, length, vocab), 1)  # warm-up at this shape, both sides
    batchgen_first_tokens(model, _fresh(rng, n, length, vocab))
    walls = {"graphc": [], "batchgen": []}
    ttft = {"graphc": [], "batchgen": []}
    ratios, ttft_ratios = [], []
    for i in range(pairs):
        t0 = now()
        g_first, _ = graphc.generate(_fresh(rng, n, length, vocab), 1)
        g = now() - t0
        t0 = now()
        b_first, _ = batchgen_first_tokens(model, _fresh(rng, n, length, vocab))
        b = now() - t0
        walls["graphc"].append(g * 1e3)
        walls["batchgen"].append(b * 1e3)
        ttft["graphc"].append(median(g_first) * 1e3)
        ttft["batchgen"].append(median(b_first) * 1e3)
        ratios.append(b / g)
        ttft_ratios.append(median(b_first) / median(g_first))
        if log:
            log(f"pair {i}: wall graphc {g * 1e3:.1f} ms, BatchGenerator {b * 1e3:.1f} ms, ratio {b / g:.3f}; "
                f"TTFT median {ttft['graphc'][-1]:.1f} / {ttft['batchgen'][-1]:.1f} ms, ratio {ttft_ratios[-1]:.3f}")
    del graphc
    C.free()
    return {"n": n, "len": length, "pairs": pairs, "wall_ms": walls, "ttft_median_ms": ttft,
            "ratio": _spread(ratios), "ttft_ratio": _spread(ttft_ratios)}


def _spread(v: list) -> dict:
    return {"min": min(v), "median": median(v), "max": max(v), "runs": v}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small-32k")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--len", type=int, default=384)
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--compile", default="false", help="Engine compile= (false, true, auto)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    model, tok, cfg, _ = load_shape(a.model, a.dtype)
    comp = {"false": False, "true": True}.get(a.compile, a.compile)
    out = paired_prefill(model, tok, cfg, n=a.n, length=a.len, pairs=a.pairs, compile=comp,
                         log=lambda s: print(s, file=sys.stderr, flush=True))
    for key, what in (("ratio", "wall to the last first token"), ("ttft_ratio", "median TTFT")):
        r = out[key]
        print(f"{a.model} {a.n}x{a.len}: BatchGenerator / graphc, {what}, {a.pairs} pairs: "
              f"{r['min']:.3f} / median {r['median']:.3f} / {r['max']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
