"""Decode ms/step of tensor-parallel graphc against mlx-lm's own tensor parallelism, one run.

    # TP=1 (one process), then TP=2 on a 2-GPU host (NCCL) or over loopback on a CPU (ring):
    python -m graphc.benchmarks.tp --shape llama-3.1-8b --batches 1,32,64
    mlx.launch -n 2 --backend nccl -- $(which python) -m graphc.benchmarks.tp \\
        --shape llama-3.1-8b --batches 1,32,64

Every rank builds the same random-weight model (benchmarks/shapes.py, seeded), shards it
(`model.shard`), and runs (1) graphc's engine: B token-id prompts, greedy, ignore_eos; once all
B rows decode, the wall time of `--steps` engine steps; then (2) mlx-lm's plain decode loop on the
same sharded model (B rows, its own KVCache, the next step queued before reading the last:
mlx-lm's generate_step pattern). Rank 0 prints one line per batch size and JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from graphc.benchmarks.shapes import load_shape
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.distributed.group import world
from graphc.runtime.distributed.load import engine_from_model


def graphc_ms_per_step(engine, batch: int, prompt_len: int, warm: int, steps: int) -> float:
    rng = random.Random(batch)
    vocab = engine.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(batch)]
    params = SamplingParams(max_tokens=warm + steps + 2, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    sched = engine.scheduler
    decoding, t0 = 0, None
    while engine.has_unfinished():
        engine.step()
        if len(sched.running) == batch and not sched.waiting:
            decoding += 1
            if decoding == warm:
                t0 = time.perf_counter()
            elif decoding == warm + steps:
                dt = time.perf_counter() - t0
                for rid in list(sched.by_id):
                    engine.abort(rid)
                return 1000 * dt / steps
    raise RuntimeError("the batch finished before the timed steps: raise max_tokens")


def mlx_lm_ms_per_step(model, batch: int, prompt_len: int, warm: int, steps: int) -> float:
    vocab = model.args.vocab_size
    cache = make_prompt_cache(model)
    prompt = mx.random.randint(3, vocab, (batch, prompt_len), key=mx.random.key(batch))
    y = mx.argmax(model(prompt, cache=cache)[:, -1], axis=-1)
    mx.eval(y)
    t0 = None
    for i in range(warm + steps):
        if i == warm:
            t0 = time.perf_counter()
        nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
        mx.async_eval(nxt)
        y.item() if batch == 1 else y.tolist()
        y = nxt
    y.tolist()
    return 1000 * (time.perf_counter() - t0) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m graphc.benchmarks.tp")
    ap.add_argument("--shape", default="tiny", help="a bench shape (tiny, llama-3.2-1b, llama-3.1-8b) or a model folder")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,8", help="comma-separated decode batch sizes")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--warm", type=int, default=8, help="decode steps before timing")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps")
    ap.add_argument("--json", help="rank 0 writes the results here")
    ap.add_argument("--compile", action="store_true", help="graphc's compiled decode (mx.compile through the sharded layers)")
    ap.add_argument("--skip-mlx-lm", action="store_true", help="time graphc only")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]

    group = world()
    model, tokenizer, config, label = load_shape(args.shape, args.dtype)
    rows = {b: {} for b in batches}
    try:  # rank 0 gets the engine; the others follow it inside and come out with SystemExit(0)
        engine = engine_from_model(model, tokenizer, config, engine_cls=Engine, max_batch=max(batches), model_path=label,
                                   compile=args.compile)
        for b in batches:
            rows[b]["graphc"] = graphc_ms_per_step(engine, b, args.prompt_len, args.warm, args.steps)
        getattr(engine, "close", lambda: None)()
    except SystemExit as e:
        if e.code:
            raise
    # The model is sharded in place by now (when launched): mlx-lm's loop runs on the same shard.
    for b in batches:
        rows[b]["mlx_lm"] = (float("nan") if args.skip_mlx_lm
                             else mlx_lm_ms_per_step(model, b, args.prompt_len, args.warm, args.steps))
    if group.rank() == 0:
        n = group.size()
        for b in batches:
            r = rows[b]
            print(f"{label} TP={n}{' compile' if args.compile else ''} graphs={os.environ.get('MLX_USE_CUDA_GRAPHS', 'default')} batch {b:3d}: graphc {r['graphc']:.2f} ms/step, mlx-lm loop {r['mlx_lm']:.2f} "
                  f"ms/step (mlx-lm / graphc {r['mlx_lm'] / r['graphc']:.2f}), device {mx.default_device()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"shape": label, "tp": n, "compile": args.compile,
                       "cuda_graphs": os.environ.get("MLX_USE_CUDA_GRAPHS", "default"), "rows": {str(b): rows[b] for b in batches}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
