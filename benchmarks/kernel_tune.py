"""Measure the skinny matmul's launch configurations at decode shapes on this device.

    python -m graphc.benchmarks.kernel_tune [--rows 8,16,32,64] [--table T.json]
    graphc bench --skinny-table T.json ...   # the kernel then runs the measured best
                                             # (a graph: `decode: {skinny_matmul: true, skinny_table: T.json}`)

CUDA only. For each Llama-3.2-1B / Llama-3.1-8B projection shape (or `--shapes K:N,...`)
and row count it times MLX's `x @ W.T`, the kernel with `heuristic()`'s configuration and
every configuration of the sweep, with weights rotated through >= 2 GiB so L2 holds none
(the bench's matmul method), and prints one line per shape. `--table` writes, per
(x tiles, K, N), the fastest configuration, or null where MLX's matmul was faster: what
`skinny_matmul.plan()` follows once `skinny_matmul.load_table(T.json)` read it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from statistics import median

import mlx.core as mx

from graphc.runtime.kernels import skinny_matmul as sk

SHAPES = {  # (K, N): what
    (2048, 3072): "1B fused q+k+v", (2048, 2048): "1B o", (2048, 16384): "1B fused gate+up",
    (8192, 2048): "1B down", (2048, 128256): "1B head",
    (4096, 6144): "8B fused q+k+v", (4096, 4096): "8B o", (4096, 28672): "8B fused gate+up",
    (14336, 4096): "8B down", (4096, 128256): "8B head",
}
WARP_GRIDS = ((4, 1), (8, 1), (2, 2), (1, 4), (2, 4), (1, 8))  # (WN, WK)


def rotating_weights(K: int, N: int, dtype=mx.bfloat16) -> list:
    """Copies of a random [N, K] weight, >= 2 GiB in all (at most 16): timing a matmul over
    them in turn reads every weight from HBM, as decode does — L2 holds none of them."""
    copies = max(2, min(16, int(2 * 2**30 // (K * N * 2))))
    Ws = [mx.random.normal((N, K), dtype=dtype) for _ in range(copies)]
    mx.eval(Ws)
    return Ws


def time_matmul(f, x, Ws, reps: int = 10) -> float:
    """Median seconds of one `f(x, w)`, each timing running it once per weight of `Ws`."""
    for w in Ws:
        mx.eval(f(x, w))
    ts = []
    for _ in range(reps):
        outs = [f(x, w) for w in Ws]
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(outs)
        ts.append((time.perf_counter() - t0) / len(Ws))
    return median(ts)


def sweep(MT: int, K: int):
    for RT, U, (WN, WK) in itertools.product((1, 2, 4), (2, 4, 8), WARP_GRIDS):
        if (K // 32) // WK < U or not sk.fits(MT, RT, WN, WK) or (MT == 8 and RT == 4 and U == 8):
            continue
        yield (MT, RT, U, WN, WK)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="8,16,32,64")
    p.add_argument("--shapes", default=None, help="K:N,... instead of the Llama shapes")
    p.add_argument("--table", default=None, help="write the fastest configuration per shape here")
    p.add_argument("--json", default=None, help="every measurement")
    p.add_argument("--quick", action="store_true", help="heuristic() only, no sweep")
    a = p.parse_args(argv)
    note = sk.check()
    print(f"check: {note or 'ok'}", flush=True)
    if note:
        return 1
    shapes = SHAPES if not a.shapes else {tuple(int(v) for v in s.split(":")): s for s in a.shapes.split(",")}
    rows = [int(r) for r in a.rows.split(",")]
    out, table = [], []
    t_start = time.time()
    for (K, N), what in shapes.items():
        Ws = rotating_weights(K, N)
        for M in rows:
            x = mx.random.normal((M, K), dtype=mx.bfloat16)
            mx.eval(x)
            xs = (x.astype(mx.float32) * K ** -0.5).astype(mx.bfloat16)  # the accuracy probe's input
            t_mlx = time_matmul(lambda x, w: x @ w.T, x, Ws)
            h = sk.heuristic(M, K, N)
            t_h = time_matmul(lambda x, w: sk.skinny_matmul(x, w, config=h), x, Ws)
            best, tried = (t_h, h), []
            for cfg in ([] if a.quick else sweep(sk.row_tiles(M), K)):
                try:  # only configurations whose result matches MLX's may enter the table
                    why = sk.close(sk.skinny_matmul(xs, Ws[0], config=cfg), xs, Ws[0])
                    if why:
                        raise ValueError(why)
                    t = time_matmul(lambda x, w, cfg=cfg: sk.skinny_matmul(x, w, config=cfg), x, Ws, reps=5)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"  {cfg} failed: {e}", flush=True)
                    continue
                tried.append((cfg, t * 1e6))
                if t < best[0]:
                    best = (t, cfg)
            gb = K * N * 2 / 1e9
            print(f"{what:17s} {K:>5}->{N:<6} M={M:<2} mlx {t_mlx*1e6:6.1f} us {gb/t_mlx/1e3:4.2f} TB/s | "
                  f"heuristic {h} {t_h*1e6:6.1f} us {gb/t_h/1e3:4.2f} | best {best[1]} {best[0]*1e6:6.1f} us "
                  f"{gb/best[0]/1e3:4.2f} TB/s  [{time.time() - t_start:.0f}s]", flush=True)
            out.append({"what": what, "K": K, "N": N, "M": M, "mlx_us": t_mlx * 1e6, "heuristic": h,
                        "heuristic_us": t_h * 1e6, "best": best[1], "best_us": best[0] * 1e6, "tried": tried})
            # Where MLX is within 3 % the kernel buys nothing: leave the shape to MLX.
            table.append({"MT": sk.row_tiles(M), "K": K, "N": N, "M": M, "what": what,
                          "config": list(best[1]) if best[0] < 0.97 * t_mlx else None,
                          "us": best[0] * 1e6, "mlx_us": t_mlx * 1e6})
        del Ws
        mx.clear_cache()
    meta = {"device": str(mx.default_device()), "mlx": mx.__version__}
    if a.table:
        with open(a.table, "w") as f:
            json.dump(meta | {"table": table}, f, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(meta | {"results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
