"""Where a restarted engine's first cached turn spends its time: an engine with a disk tier runs a
growing prompt turn by turn, a second engine on the same folder (the restart) runs the next turn
under cProfile. Shows the disk read (DiskTier.promote: blocks, then the tail past them) against the
prefill of what the disk lacks, and, with --cold, a cold prompt of the same length on that engine.

    python -m graphc.benchmarks.disk_restart_profile --model DIR [--context 2048] [--turns 16] [--cold]
        [--linear-prefill chunked]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

import numpy as np

from graphc.runtime import Engine, SamplingParams


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model folder (dense or hybrid: not sliding-window)")
    ap.add_argument("--block-tokens", type=int, default=None, help="kv_cache_block_tokens (default: the engine's)")
    ap.add_argument("--cold", action="store_true", help="also time a cold prompt of the same length")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--linear-prefill", default=None,
                    help="Engine(linear_prefill=...) for hybrid models (auto, mlx-lm, chunked)")
    args = ap.parse_args(argv)
    ids = np.random.default_rng(0).integers(3, 1000, args.context).tolist()
    step = args.context // args.turns
    one = SamplingParams(max_tokens=1)
    kw = {} if args.block_tokens is None else {"kv_cache_block_tokens": args.block_tokens}
    if args.linear_prefill is not None:
        kw["linear_prefill"] = args.linear_prefill
    with tempfile.TemporaryDirectory(prefix="graphc-kv-") as folder:
        first = Engine.load(args.model, kv_cache_dir=folder, **kw)
        for k in range(1, args.turns):
            first.generate([ids[:step * k]], one)
        first.disk_tier.flush()
        del first
        second = Engine.load(args.model, kv_cache_dir=folder, **kw)
        second.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=2))  # warm-up
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        [res] = second.generate([ids], one)
        prof.disable()
        print(f"restarted turn of {len(ids)} tokens: {time.perf_counter() - t0:.3f} s, "
              f"{res.cached_tokens} from the disk, {len(ids) - res.cached_tokens} computed")
        restarted = time.perf_counter() - t0
        pstats.Stats(prof).sort_stats("cumulative").print_stats(12)
        if args.cold:
            other = np.random.default_rng(1).integers(3, 1000, args.context).tolist()
            t0 = time.perf_counter()
            second.generate([other], one)
            cold = time.perf_counter() - t0
            print(f"cold turn of {len(other)} tokens: {cold:.3f} s; restarted / cold = {restarted / cold:.3f}")
        second.disk_tier.flush()  # before the folder goes


if __name__ == "__main__":
    main()
