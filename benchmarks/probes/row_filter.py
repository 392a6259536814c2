"""Dropping rows from a batch's KV: a gather by row index against a copy per run of kept rows
(runtime/cache/full.py FullKV.filter), on one layer-set of batch KV of a serving shape. "gather64"
gathers each row as 8-byte words (the plane viewed as uint64 rows): the same bytes in a quarter of
the gather's elements. Leaves 1, 3 and a quarter of the rows (every fourth: the most runs).

    python benchmarks/probes/row_filter.py --rows 64 --heads 8 --cols 4608 --dim 64 --layers 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from graphc.runtime.cache.full import row_runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--cols", type=int, default=4608)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    planes = [mx.zeros((a.rows, a.heads, a.cols, a.dim), dtype=mx.bfloat16) + i for i in range(2 * a.layers)]
    mx.eval(planes)
    gib = sum(x.nbytes for x in planes) / 2**30
    for leave in ([a.rows // 2], [3, a.rows // 2, a.rows - 2], list(range(1, a.rows, 4))):
        keep = [r for r in range(a.rows) if r not in leave]
        runs, idx = row_runs(keep), mx.array(keep, dtype=mx.int32)
        ways = {"gather": lambda x: x[idx],
                "gather64": lambda x: mx.view(mx.view(x, mx.uint64).reshape(a.rows, -1)[idx], x.dtype).reshape(
                    len(keep), *x.shape[1:]),
                "runs": lambda x: mx.concatenate([x[s:e] for s, e in runs], axis=0)}
        for name, f in ways.items():
            ts = []
            for _ in range(a.repeats):
                mx.synchronize()
                t0 = time.perf_counter()
                out = [f(x) for x in planes]
                mx.eval(out)
                ts.append((time.perf_counter() - t0) * 1e3)
                del out
            print(f"{len(leave)} rows leave, {len(runs)} runs, {gib:.2f} GiB: {name:6s} median {statistics.median(ts[1:]):.2f} ms "
                  f"(min {min(ts[1:]):.2f})", flush=True)


if __name__ == "__main__":
    main()
