"""Micro-benchmark: token selection alone on logits [B, V].

    python -m graphc.runtime.sampling.bench_sampling [--vocab 32000] [--iters 50]

Times, per batch size, the median of ``iters`` evaluated steps (one mx.eval
each) of ``select_tokens`` for several row configurations, and prints each as
a ratio to greedy argmax. ``run_bench`` returns the rows for ``graphc bench``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from .params import SamplingParams
from .select import select_tokens
from .tensors import SamplingTensors

CONFIGS = {
    "greedy": dict(),
    "T=0.8,top_p=0.9,top_k=50": dict(temperature=0.8, top_p=0.9, top_k=50),
    "T=0.8 (plain)": dict(temperature=0.8),
    "T=0.8,top_p=0.9 (full sort)": dict(temperature=0.8, top_p=0.9),
}


def _time(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        mx.eval(fn())
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run_bench(batch_sizes=(1, 16, 64), vocab: int = 32000, iters: int = 50, configs=None, seeded: bool = True) -> list[dict]:
    """[{batch, config, ms, ratio_to_greedy}] — medians of ``iters`` evaluated steps."""
    configs = configs or CONFIGS
    rows = []
    for B in batch_sizes:
        logits = mx.random.normal((B, vocab), key=mx.random.key(B)).astype(mx.float32)
        positions = mx.arange(B, dtype=mx.int32) + 100
        key = mx.random.key(0)
        mx.eval(logits)
        base = None
        for name, kw in configs.items():
            params = [SamplingParams(seed=(i if seeded and kw else None), **kw) for i in range(B)]
            st = SamplingTensors.build(params, vocab)
            ms = 1e3 * _time(lambda: select_tokens(logits, st, positions, key), iters)
            base = ms if base is None else base
            rows.append(dict(batch=B, config=name, ms=ms, ratio_to_greedy=ms / base))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    a = ap.parse_args(argv)
    print(f"device={mx.default_device()} mlx={mx.__version__} vocab={a.vocab} iters={a.iters} (median ms per evaluated step)")
    print(f"{'B':>4}  {'config':<30} {'ms':>9} {'x greedy':>9}")
    for r in run_bench(a.batch, a.vocab, a.iters):
        print(f"{r['batch']:>4}  {r['config']:<30} {r['ms']:>9.3f} {r['ratio_to_greedy']:>9.2f}")


if __name__ == "__main__":
    main()
