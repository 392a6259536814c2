"""Dropping rows from a batch's KV (runtime/cache/full.py FullKV.filter), on one layer-set of batch
KV of a serving shape. Ways:

- gather:   one gather by row index of the kept rows (the fresh array is the compacted batch);
- gather64: the same, each row as 8-byte words (the plane viewed as uint64): a quarter of the elements;
- runs:     a copy per run of consecutive kept rows;
- holes:    the kept rows stay where they are but for the last ones, which move into the vacant
            rows below the new batch size (a gather of those rows, then a scatter into the plane,
            which MLX does in place when nothing else holds the plane); the batch is the plane's
            first rows (a view). It moves only the rows past the new end, in a different row order.

Leaves 1, 3 and a quarter of the rows (every fourth: the most runs).

    python benchmarks/probes/row_filter.py --rows 64 --heads 8 --cols 4608 --dim 64 --layers 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from graphc.runtime.cache.full import row_runs


def hole_order(keep: list[int], rows: int) -> list[int]:
    """The source row of each of the len(keep) rows after a hole-filling compaction: a kept row
    below the new end stays, each vacant row below it takes the next kept row from past the end."""
    n, kept = len(keep), set(keep)
    tail = iter(r for r in keep if r >= n)
    return [r if r in kept else next(tail) for r in range(n)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--cols", type=int, default=4608)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()

    def fresh():
        planes = [mx.zeros((a.rows, a.heads, a.cols, a.dim), dtype=mx.bfloat16) + i for i in range(2 * a.layers)]
        mx.eval(planes)
        return planes

    planes = fresh()
    gib = sum(x.nbytes for x in planes) / 2**30
    for leave in ([a.rows // 2], [3, a.rows // 2, a.rows - 2], list(range(1, a.rows, 4))):
        keep = [r for r in range(a.rows) if r not in leave]
        runs, idx = row_runs(keep), mx.array(keep, dtype=mx.int32)
        order = hole_order(keep, a.rows)
        moves = [(i, s) for i, s in enumerate(order) if i != s]
        dst = mx.array([i for i, _ in moves], dtype=mx.int32)
        src = mx.array([s for _, s in moves], dtype=mx.int32)

        def holes(planes, i):
            x = planes[i]
            planes[i] = None  # the plane's last reference is the scatter's: MLX may write in place
            if moves:
                x[dst] = x[src]
            return x[: len(keep)]

        ways = {"gather": lambda planes, i: planes[i][idx],
                "gather64": lambda planes, i: mx.view(mx.view(planes[i], mx.uint64).reshape(a.rows, -1)[idx],
                                                      planes[i].dtype).reshape(len(keep), *planes[i].shape[1:]),
                "runs": lambda planes, i: mx.concatenate([planes[i][s:e] for s, e in runs], axis=0),
                "holes": holes}
        for name, f in ways.items():
            ts = []
            for _ in range(a.repeats):
                planes = fresh()
                mx.synchronize()
                t0 = time.perf_counter()
                out = [f(planes, i) for i in range(len(planes))]
                mx.eval(out)
                ts.append((time.perf_counter() - t0) * 1e3)
                if name == "holes":  # the same rows as a gather in the hole order
                    assert all(mx.array_equal(o[:, 0, 0, 0], mx.array(order, dtype=o.dtype) * 0 + i).item()
                               for i, o in enumerate(out))
                del out
            print(f"{len(leave)} rows leave, {len(runs)} runs, {len(moves)} moves, {gib:.2f} GiB: {name:8s} "
                  f"median {statistics.median(ts[1:]):.2f} ms (min {min(ts[1:]):.2f})", flush=True)


if __name__ == "__main__":
    main()
