"""Micro-benchmark: token selection alone on logits [B, V].

    python -m graphc.benchmarks.sampling_select [--vocab 32000] [--iters 50] [--dtype bfloat16]

Times, per batch size, the median of ``iters`` evaluated steps (one mx.eval
each) of ``select_tokens`` for several row configurations, and prints each as
a ratio to greedy argmax. ``run_bench`` returns the rows (tests/test_sampling_fused.py runs it
small); benchmarks/probes/top_ranks.py reuses its timers.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time

import mlx.core as mx

from graphc.runtime.params import SamplingParams
from graphc.runtime.sampling import select as _select
from graphc.runtime.sampling.penalties import build_token_counts
from graphc.runtime.sampling.select import select_tokens
from graphc.runtime.sampling.step import sample_step
from graphc.runtime.sampling.tensors import SamplingTensors

CONFIGS = {
    "greedy": dict(),
    "T=0.8,top_p=0.9,top_k=50": dict(temperature=0.8, top_p=0.9, top_k=50),
    # every other row greedy: the grouped path gathered rows per group; the fused one does not
    "half greedy, half T=0.8,top_p=0.9,top_k=50": lambda i: dict(temperature=0.8, top_p=0.9, top_k=50) if i % 2 else {},
    "T=0.8 (plain)": dict(temperature=0.8),
    "T=0.8,top_p=0.9 (full sort)": dict(temperature=0.8, top_p=0.9),
}


def median_eval_s(fn, iters: int, warmup: int = 3) -> float:
    """Median seconds to build and evaluate ``fn()``, after ``warmup`` untimed calls (traces, caches)."""
    for _ in range(warmup):
        mx.eval(fn())
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def median_build_us(fn, iters: int) -> float:
    """Median µs to build the lazy graph alone (no evaluation): the host's share of a step."""
    fn()
    ts = []
    for _ in range(max(iters, 20)):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(ts)


def graph_nodes(outs) -> int:
    """Primitives in the lazy graph of ``outs`` (views included), read from mx.export_to_dot."""
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *(outs if isinstance(outs, (list, tuple)) else [outs]))
        with open(path) as f:
            return len(re.findall(r'label ="[A-Za-z]', f.read()))
    finally:
        os.remove(path)


STEP_CONFIGS = {
    "greedy": dict(),
    "greedy+edits+penalties+logprobs=5": dict(
        logit_bias={5: 1.0}, banned_token_ids=(7,), min_tokens=2, repetition_penalty=1.1,
        frequency_penalty=0.2, presence_penalty=0.1, logprobs=5,
    ),
    "sampled(T=0.8,top_p=0.9,top_k=50)+edits+penalties+logprobs=5": dict(
        temperature=0.8, top_p=0.9, top_k=50, logit_bias={5: 1.0}, banned_token_ids=(7,),
        min_tokens=2, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1, logprobs=5,
    ),
}


def run_bench(
    batch_sizes=(1, 16, 64),
    vocab: int = 32000,
    iters: int = 50,
    configs=None,
    seeded: bool = True,
    step: bool = False,
    dtype=mx.float32,
) -> list[dict]:
    """[{batch, config, ms, ratio_to_greedy, host_us, nodes}] — medians of ``iters`` evaluated steps,
    the host time to build one (unevaluated) and its graph's node count.
    ``step=True`` times the whole ``sample_step`` (edits, penalties, logprobs)."""
    configs = configs or (STEP_CONFIGS if step else CONFIGS)
    rows = []
    for B in batch_sizes:
        logits = mx.random.normal((B, vocab), key=mx.random.key(B)).astype(dtype)
        positions = mx.arange(B, dtype=mx.int32) + 100
        key = mx.random.key(0)
        mx.eval(logits)
        base = None
        for name, kw in configs.items():
            row_kw = [kw(i) if callable(kw) else kw for i in range(B)]  # a callable gives each row's params
            params = [SamplingParams(seed=(i if seeded and k else None), **k) for i, k in enumerate(row_kw)]
            st = SamplingTensors.build(params, vocab, eos_token_ids=[2])
            if step:
                counts = build_token_counts([[1, 2, 3, 3]] * B, vocab)
                n_gen = mx.zeros((B,), mx.int32)

                def fn():
                    out = sample_step(logits, st, positions=positions, n_generated=n_gen, counts=counts, key=key)
                    return [out.tokens] + ([out.logprobs.chosen, out.logprobs.top_ids] if out.logprobs else [])
            else:

                def fn():
                    return select_tokens(logits, st, positions, key)

            ms = 1e3 * median_eval_s(fn, iters)
            base = ms if base is None else base
            rows.append(dict(batch=B, config=name, ms=ms, ratio_to_greedy=ms / base,
                             host_us=median_build_us(fn, iters), nodes=graph_nodes(fn())))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--step", action="store_true", help="time sample_step with edits/penalties/logprobs")
    ap.add_argument("--eager", action="store_true", help="do not mx.compile the selectors")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="logits dtype")
    a = ap.parse_args(argv)
    _select.COMPILE = not a.eager
    print(
        f"device={mx.default_device()} mlx={mx.__version__} vocab={a.vocab} iters={a.iters} "
        f"compiled={not a.eager} dtype={a.dtype} (median ms per evaluated step; host µs to build it; graph nodes)"
    )
    rows = run_bench(a.batch, a.vocab, a.iters, step=a.step, dtype=getattr(mx, a.dtype))
    w = max(len(r["config"]) for r in rows)
    print(f"{'B':>4}  {'config':<{w}} {'ms':>9} {'x greedy':>9} {'host us':>8} {'nodes':>6}")
    for r in rows:
        print(f"{r['batch']:>4}  {r['config']:<{w}} {r['ms']:>9.3f} {r['ratio_to_greedy']:>9.2f} "
              f"{r['host_us']:>8.1f} {r['nodes']:>6}")


if __name__ == "__main__":
    main()
