"""Measure the radix prefix cache on a shared-prefix workload: prefill tokens saved, wall time,
decode speed, and what a hit's gather / an insert's scatter cost next to computing the prefix.

    python examples/prefix_cache_workload.py                 # builds a small llama + gpt-oss + qwen3-next
    python examples/prefix_cache_workload.py --model DIR     # any model folder

Each model runs the same requests twice: on its prefix-less graph (cold) and on its default
graph (pool_backed full layers). Prints one table; CPU numbers are only meaningful as ratios.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from graphc.compiler.lower import StepInputs
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache import PrefixKind, PrefixState
from graphc.runtime.request import Request

NOPREFIX = {"dense": "dense_noprefix"}


def workload(vocab: int, groups: int, per_group: int, shared: int, unique: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = []
    for _ in range(groups):
        head = [rng.randrange(3, vocab) for _ in range(shared)]
        prompts += [head + [rng.randrange(3, vocab) for _ in range(unique)] for _ in range(per_group)]
    rng.shuffle(prompts)
    return prompts


def run(engine: Engine, prompts, max_tokens: int, batch: int):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    results = []
    for i in range(0, len(prompts), batch):  # arrivals in waves, so later waves can hit earlier ones
        results += engine.generate(prompts[i:i + batch], params)
    return results, time.perf_counter() - t0


def decode_rate(engine: Engine, n_rows: int, ctx: int, steps: int) -> float:
    """Decode tokens/s of a batch already past its prompt: rows / median step time (no joins,
    no finishes inside the timed steps; the rows are aborted afterwards)."""
    prompts = workload(engine.vocab_size, 1, n_rows, ctx - 8, 8, seed=99)
    ids = [engine.add_request(p, SamplingParams(max_tokens=10 * steps, ignore_eos=True)) for p in prompts]
    while any(engine.scheduler.by_id[i].status.value != "running" for i in ids):
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    for i in ids:
        engine.abort(i)
    return n_rows / sorted(times)[len(times) // 2]


def hit_costs(engine: Engine, lengths=(256, 1024, 2048)):
    """(m, gather ms, scatter ms, prefill ms) for a prefix of m tokens."""
    out = []
    io = engine.runner.prefix_io
    for m in lengths:
        toks = workload(engine.vocab_size, 1, 1, m, 1, seed=m)[0]
        req = Request(toks, SamplingParams())
        req.caches = engine.runner.new_caches()
        t0 = time.perf_counter()
        ctx = engine.compiled.prefill.forward(StepInputs(mx.array(toks[:m])[None], req.caches, final=False))
        mx.eval(ctx.values[engine.compiled.prefill.hidden_node])
        prefill_ms = (time.perf_counter() - t0) * 1e3
        slots = engine.prefix.slots.alloc(m)
        t0 = time.perf_counter()
        for i in io.token_layers:
            io.pool.write(i, slots, io.policies[i].prefix_capture(req.caches[i], 0, 0, m).arrays)
        mx.eval(io.pool.arrays())
        scatter_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        got = [io.policies[i].prefix_restore(PrefixState(PrefixKind.TOKENS, 0, m, io.pool.gather(i, slots)))
               for i in io.token_layers]
        mx.eval([c.keys for c in got] + [c.values for c in got])
        gather_ms = (time.perf_counter() - t0) * 1e3
        engine.prefix.slots.release(slots)
        out.append((m, gather_ms, scatter_ms, prefill_ms))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="model folder (repeatable); default: three built here")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--shared", type=int, default=256)
    ap.add_argument("--unique", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256, help="size of the models built here")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--archs", default="llama,gpt_oss,qwen3_next")
    ap.add_argument("--decode-batch", type=int, default=16)
    ap.add_argument("--hit-lengths", default="256,1024,2048")
    args = ap.parse_args(argv)
    models = [Path(m) for m in args.model or []]
    if not models:
        from graphc.compiler.modelgen import make_model

        tmp = Path(tempfile.mkdtemp(prefix="graphc-prefix-"))
        heads = max(4, args.hidden // 64)
        dims = dict(hidden_size=args.hidden, num_layers=args.layers, num_heads=heads, num_kv_heads=heads // 2,
                    head_dim=args.hidden // heads, intermediate_size=2 * args.hidden, dtype=args.dtype)
        extra = {"gpt_oss": {"sliding_window": 64}}
        models = [make_model(a, tmp / a, **dims, **extra.get(a, {})) for a in args.archs.split(",")]
    rows = []
    for d in models:
        warm = Engine.load(d, prefill_chunk=128, max_total_tokens=1 << 15)
        graph = warm.compiled.spec.name
        cold = Engine.load(d, NOPREFIX.get(graph), prefill_chunk=128, prefix_cache=False)
        prompts = workload(warm.vocab_size, args.groups, args.per_group, args.shared, args.unique)
        run(cold, prompts[:2], 2, 2)  # warm up both (first-call costs out of the numbers)
        run(warm, [[5] * 40], 2, 1)
        res_c, t_c = run(cold, prompts, args.max_tokens, args.batch)
        res_w, t_w = run(warm, prompts, args.max_tokens, args.batch)
        same = all(a.token_ids == b.token_ids for a, b in zip(res_c, res_w))
        total = sum(len(p) for p in prompts)
        cached = sum(r.cached_tokens for r in res_w)
        B = args.decode_batch
        rates = [(decode_rate(cold, B, 256, 32), decode_rate(warm, B, 256, 32)) for _ in range(3)]
        rate_c, rate_w = (sorted(r)[1] for r in zip(*rates))  # median of 3, interleaved
        lengths = [int(x) for x in args.hit_lengths.split(",")]
        rows.append((d.name, graph, total, cached, t_c, t_w, rate_c, rate_w, same, hit_costs(warm, lengths)))
    print(f"\ndevice: {mx.default_device()}; decode batch {args.decode_batch}")
    print(f"workload: {args.groups} groups x {args.per_group} requests, shared prefix {args.shared}, "
          f"unique {args.unique}, {args.max_tokens} new tokens, waves of {args.batch}")
    print(f"{'model':12} {'graph':8} {'prompt tok':>10} {'cached':>8} {'saved':>6} {'cold s':>7} {'warm s':>7} "
          f"{'speedup':>7} {'decode tok/s cold/warm':>23} same")
    for name, graph, total, cached, t_c, t_w, r_c, r_w, same, _ in rows:
        print(f"{name:12} {graph:8} {total:>10} {cached:>8} {cached / total:>6.1%} {t_c:>7.2f} {t_w:>7.2f} "
              f"{t_c / t_w:>6.2f}x {r_c:>11.0f} / {r_w:<9.0f} {same}")
    print("\nhit cost (pool-backed layers): gather into a working cache / scatter into the pool vs computing the prefix")
    print(f"{'model':12} {'m':>6} {'gather ms':>10} {'scatter ms':>11} {'prefill ms':>11} {'gather/prefill':>15}")
    for name, *_, costs in rows:
        for m, g, s, p in costs:
            print(f"{name:12} {m:>6} {g:>10.2f} {s:>11.2f} {p:>11.2f} {g / p:>15.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
