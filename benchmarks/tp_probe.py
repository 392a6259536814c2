"""Where tensor-parallel decode time goes: the cost of one collective, alone and inside a step.

    mlx.launch -n 2 --backend nccl -- $(which python) -m graphc.benchmarks.tp_probe
    MLX_USE_CUDA_GRAPHS=0 mlx.launch -n 2 --backend nccl -- $(which python) -m graphc.benchmarks.tp_probe

Two measurements, printed by rank 0 (and written as JSON with --json):

- `alone`: `all_sum` of one array followed by `mx.eval`, per size: the round-trip latency a
  plan broadcast or a synchronous loop pays.
- `in_step`: a decode-shaped chain of `layers` x (matmul, all_sum, matmul, all_sum) on `rows`
  rows, evaluated once, against the same chain with the all_sums left out. The difference per
  collective is what each of a TP step's 2 x layers collectives adds to the step; a tensor-
  parallel model can beat one device only when it is well under (single-device step time / 2)
  / (2 x layers).

Run it under different MLX / NCCL settings (CUDA graphs on or off, graph size) to see which
one a TP step should use; docs/distributed.md has the numbers from the H200 pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import mlx.core as mx
import mlx.nn.layers.distributed as dist_layers
from mlx_lm.models.cache import make_prompt_cache

from graphc.benchmarks.shapes import load_shape


def _time(fn, warm: int, reps: int) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def alone(group, nbytes: int, warm: int, reps: int) -> float:
    """Median µs of one all_sum of `nbytes` bf16 bytes plus eval."""
    x = mx.ones((nbytes // 2,), mx.bfloat16)
    mx.eval(x)

    def once():
        mx.eval(mx.distributed.all_sum(x, group=group))

    return 1e6 * statistics.median(_time(once, warm, reps))


def in_step(group, rows: int, hidden: int, inner: int, layers: int, warm: int, reps: int) -> dict:
    """Median ms of a decode-shaped chain with and without its collectives."""
    n = group.size()
    keys = mx.random.split(mx.random.key(0), 2 * layers)
    # Column- then row-sharded pairs like a TP MLP: [hidden -> inner/n] then [inner/n -> hidden].
    up = [mx.random.normal((inner // n, hidden), key=keys[2 * i]).astype(mx.bfloat16) * 0.01 for i in range(layers)]
    down = [mx.random.normal((hidden, inner // n), key=keys[2 * i + 1]).astype(mx.bfloat16) * 0.01
            for i in range(layers)]
    x0 = mx.random.normal((rows, hidden)).astype(mx.bfloat16)
    mx.eval(up, down, x0)

    def chain(collect: bool):
        x = x0
        for u, d in zip(up, down):
            h = x @ u.T
            h = h @ d.T
            if collect:
                h = mx.distributed.all_sum(h, group=group)
            x = x + h
            h = x @ u.T  # the "attention" half: a second pair per layer
            h = h @ d.T
            if collect:
                h = mx.distributed.all_sum(h, group=group)
            x = x + h
        mx.eval(x)

    with_c = statistics.median(_time(lambda: chain(True), warm, reps))
    without = statistics.median(_time(lambda: chain(False), warm, reps))
    per = (with_c - without) / (2 * layers)
    return {"rows": rows, "with_collectives_ms": 1e3 * with_c, "without_ms": 1e3 * without,
            "per_collective_us": 1e6 * per, "collectives": 2 * layers}


def model_step(group, shape: str, rows: int, warm: int, reps: int, variant: str) -> dict:
    """ms per decode step of mlx-lm's own loop on the sharded `shape`, and how much of it is host
    encode (the time until `mx.async_eval` returns). Variants that change the numbers, for timing
    only: `no-collectives` (all_sum is the identity), `plain-linear` (the sharded input
    projections skip the per-call custom_function that mlx's AllToShardedLinear wraps x in)."""
    model = _MODELS.get(shape)
    if model is None:
        model = _MODELS[shape] = load_shape(shape, "bfloat16")[0]
        if group.size() > 1:
            model.shard(group)  # the model's own tensor-parallel split, as runtime/distributed/load.py does
        mx.eval(model.parameters())
    saved = (mx.distributed.all_sum, dist_layers.sum_gradients)
    if variant == "no-collectives":
        dist_layers.mx.distributed.all_sum = lambda x, *a, **k: x
    if variant == "plain-linear":
        dist_layers.sum_gradients = lambda group: (lambda x: x)
    try:
        cache = make_prompt_cache(model)
        y = mx.argmax(model(mx.ones((rows, 8), mx.int32), cache=cache)[:, -1], axis=-1)
        mx.eval(y)
        enc, t0 = 0.0, None
        for i in range(warm + reps):
            if i == warm:
                t0, enc = time.perf_counter(), 0.0
            e0 = time.perf_counter()
            nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
            mx.async_eval(nxt)
            enc += time.perf_counter() - e0
            y.tolist()
            y = nxt
        y.tolist()
        total = time.perf_counter() - t0
    finally:
        mx.distributed.all_sum, dist_layers.sum_gradients = saved
    return {"shape": shape, "rows": rows, "variant": variant, "ms_per_step": 1e3 * total / reps,
            "encode_ms_per_step": 1e3 * enc / reps}


_MODELS: dict = {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m graphc.benchmarks.tp_probe")
    ap.add_argument("--sizes", default="16384,524288,8388608", help="bytes per all_sum for the `alone` rows")
    ap.add_argument("--rows", default="1,32,64", help="decode rows for the `in_step` chain")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inner", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--label", default="", help="a name for this run's settings (printed and stored)")
    ap.add_argument("--json", help="rank 0 appends one JSON line here")
    ap.add_argument("--model", help="also time mlx-lm's decode loop on this sharded bench shape (e.g. llama-3.1-8b)")
    ap.add_argument("--variants", default="as-is,no-collectives,plain-linear",
                    help="for --model: as-is, no-collectives, plain-linear (see model_step)")
    ap.add_argument("--skip-micro", action="store_true", help="only the --model rows")
    args = ap.parse_args(argv)
    group = mx.distributed.init()
    env = {k: v for k, v in os.environ.items() if k.startswith(("MLX_USE", "MLX_MAX", "NCCL_"))}
    result = {"label": args.label, "world": group.size(), "device": str(mx.default_device()), "env": env,
              "alone_us": {}, "in_step": [], "model": []}
    if not args.skip_micro:
        for size in (int(s) for s in args.sizes.split(",")):
            result["alone_us"][size] = alone(group, size, args.warm, args.reps)
        for rows in (int(r) for r in args.rows.split(",")):
            result["in_step"].append(in_step(group, rows, args.hidden, args.inner, args.layers, args.warm, args.reps))
    if args.model:
        for rows in (int(r) for r in args.rows.split(",")):
            for v in args.variants.split(","):
                result["model"].append(model_step(group, args.model, rows, args.warm, args.reps, v))
    if group.rank() == 0:
        print(f"[{args.label}] world {group.size()}  all_sum+eval: "
              + ", ".join(f"{s // 1024} KiB {u:.0f} us" for s, u in result["alone_us"].items()))
        for r in result["in_step"]:
            print(f"[{args.label}]   rows {r['rows']:3d}: step {r['with_collectives_ms']:.2f} ms with "
                  f"{r['collectives']} collectives, {r['without_ms']:.2f} ms without -> "
                  f"{r['per_collective_us']:.0f} us each")
        for r in result["model"]:
            print(f"[{args.label}]   {r['shape']} rows {r['rows']:3d} {r['variant']:>15}: {r['ms_per_step']:.2f} ms/step, "
                  f"host encode {r['encode_ms_per_step']:.2f} ms")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
