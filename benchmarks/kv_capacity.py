"""`graphc bench --kv-capacity`: KV bytes allocated per live token under a mixed-length mix.

graphc's default graph and mlx-lm keep decode rows as contiguous left-padded `[B, H, T, D]`
arrays: every row is as long as the longest (graphc's runtime/cache/full.py grows T in 256-column
steps past 256, mlx-lm's BatchKVCache in 256-column steps). One long request among short ones
makes every row pay for its length. graphc's `dense_paged` graph keeps rows in 16-token pages
(runtime/cache/paged.py). This runs the same mix (one long prompt and n short ones) through
graphc's Engine on both graphs and mlx-lm's BatchGenerator, on the model given, until every row
decodes, and reads the allocated bytes from each engine's own caches; live bytes are the tokens
the rows hold times the model's KV bytes per token. graphc's rows also time a few decode steps
of the whole batch (what the paged layout's gather costs).

From the measured layout it then reports the most concurrent requests of the same mix (one
long + n short) that fit a KV budget, for each engine and for an ideal layout holding only live
tokens.

    graphc bench --kv-capacity --model tiny --dtype float32
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from . import contestants as C
from .report import write_json
from .shapes import SHAPES, load_shape


def _layers_bytes(caches) -> int:
    return sum(int(c.keys.nbytes + c.values.nbytes) for c in caches if getattr(c, "keys", None) is not None)


def _columns(caches) -> int:
    """Allocated columns T of the first layer with arrays (every layer has the same)."""
    c = next(c for c in caches if getattr(c, "keys", None) is not None)
    return int(c.keys.shape[2])


def _per_token_bytes(caches) -> float:
    """KV bytes one token of one row needs over all layers (keys + values)."""
    out = 0.0
    for c in caches:
        if getattr(c, "keys", None) is not None:
            B, _, T, _ = c.keys.shape
            out += (c.keys.nbytes + c.values.nbytes) / (B * T)
    return out


def graphc_mix(model, tokenizer, config, prompts, new_tokens: int, graph=None, steps: int = 8) -> dict:
    eng = C.make_engine(model, tokenizer, config, graph=graph, max_batch=len(prompts), prefix_cache=False)
    # every prompt admitted before any row decodes (a burst as long as all of them), or the first
    # rows could finish before the last joined and the loop below would wait for a full batch forever
    eng.scheduler.BURST_TOKENS = max(eng.scheduler.BURST_TOKENS, sum(len(p) for p in prompts))
    ids = [eng.add_request(p, C.graphc_params(new_tokens)) for p in prompts]
    while eng.has_unfinished() and (eng.scheduler.waiting or len(eng.runner.rows) < len(prompts)):
        eng.step()
    eng.step()
    caches = eng.runner.caches
    paged = hasattr(caches[0], "pages")
    out = {"allocated": eng.runner.kv_bytes, "live_gauge": eng.runner.kv_live_bytes,
           "rows": len(eng.runner.rows), "columns": None if paged else _columns(caches),
           "per_token": _per_token_bytes(caches) if not paged else sum(c.pool.bytes_per_slot for c in caches),
           "tokens": sum(r.num_tokens for r in eng.runner.rows),
           "page_tokens": caches[0].pool.page_tokens if paged else None,
           # the pools' arrays: they grow to the peak in quarter steps and keep it (free pages reused)
           "pool_bytes": sum(c.pool.nbytes for c in caches) if paged else None}
    times = []
    for _ in range(min(steps, new_tokens - 3)):  # whole-batch decode steps (every row still running)
        t0 = time.perf_counter()
        eng.step()
        times.append((time.perf_counter() - t0) * 1e3)
    out["step_ms"] = statistics.median(times) if times else None
    for i in ids:
        eng.abort(i)
    del eng
    C.free()
    return out


def batchgen_mix(model, prompts, new_tokens: int) -> dict:
    gen = BatchGenerator(model, max_tokens=new_tokens, completion_batch_size=len(prompts),
                         prefill_batch_size=len(prompts))
    uids = gen.insert(prompts)
    seen: dict = {}
    while len(seen) < len(uids):
        for r in gen.next_generated():
            seen[r.uid] = seen.get(r.uid, 0) + 1
    gen.next_generated()
    caches = gen._generation_batch.prompt_cache  # the decode batch's per-layer BatchKVCache
    mx.eval([c.keys for c in caches])
    out = {"allocated": _layers_bytes(caches), "rows": len(uids), "columns": _columns(caches),
           "per_token": _per_token_bytes(caches)}
    gen.close()
    del gen
    C.free()
    return out


def most_requests(budget: float, per_token: float, long: int, short: int, columns: int | None,
                  page: int = 1) -> int:
    """Most requests (one long + n short) whose KV fits `budget` bytes: with a contiguous layout
    every row is `columns` wide (as measured for this mix); columns=None: each row its own tokens,
    rounded up to a multiple of `page` (1: only live tokens)."""
    if columns is not None:
        return int(budget // (columns * per_token))
    long, short = -(-long // page) * page, -(-short // page) * page
    if long * per_token > budget:
        return 0
    return 1 + int((budget - long * per_token) // (short * per_token))


def shape_bytes_per_token(config: dict, itemsize: int = 2) -> int:
    """Keys + values of one token over all layers, for a model config (bf16 by default)."""
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * heads * dim * itemsize


def run_kv_capacity(model, tokenizer, config, *, long: int, short: int, n_short: int, new_tokens: int,
                    budget_gib: float, budget_config: dict | None = None, seed: int = 0, log=None) -> dict:
    """The mix through both engines; capacity in `budget_gib` for the KV bytes per token of
    `budget_config` (a model shape's config, bf16) or, without one, of the measured model."""
    rng = random.Random(seed)
    vocab = config["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(long)]] + \
              [[rng.randrange(3, vocab) for _ in range(short)] for _ in range(n_short)]
    g = graphc_mix(model, tokenizer, config, prompts, new_tokens)
    pg = graphc_mix(model, tokenizer, config, prompts, new_tokens, graph="dense_paged")
    b = batchgen_mix(model, prompts, new_tokens)
    live = g["tokens"] * g["per_token"]
    budget = budget_gib * 2 ** 30
    per = shape_bytes_per_token(budget_config) if budget_config else g["per_token"]
    L, S = long + new_tokens, short + new_tokens
    res = {"mix": {"long": long, "short": short, "n_short": n_short, "new_tokens": new_tokens},
           "kv_bytes_per_token": g["per_token"], "live_bytes": live,
           "graphc": {**g, "ratio": g["allocated"] / live}, "graphc_paged": {**pg, "ratio": pg["allocated"] / live},
           "batchgen": {**b, "ratio": b["allocated"] / live},
           "budget_gib": budget_gib, "budget_bytes_per_token": per,
           "fit": {"graphc": most_requests(budget, per, L, S, g["columns"]),
                   "graphc_paged": most_requests(budget, per, L, S, None, pg["page_tokens"]),
                   "batchgen": most_requests(budget, per, L, S, b["columns"]),
                   "live_only": most_requests(budget, per, L, S, None)}}
    if log:
        log(kv_table(res))
    return res


def kv_table(r: dict) -> str:
    m = r["mix"]
    out = [f"KV under a mix of 1 x {m['long']} + {m['n_short']} x {m['short']} prompt tokens "
           f"(+{m['new_tokens']} new): {r['kv_bytes_per_token']:.0f} B/token, live {r['live_bytes'] / 2**20:.2f} MiB",
           "| engine | allocated MiB | columns T | allocated / live | requests of this mix in "
           f"{r['budget_gib']:g} GiB at {r['budget_bytes_per_token'] / 1024:g} KiB/token | decode step ms |",
           "|---|---|---|---|---|---|"]
    for k, name in (("graphc", "graphc (dense: contiguous rows)"),
                    ("graphc_paged", "graphc (dense_paged: 16-token pages)"), ("batchgen", "mlx-lm BatchGenerator")):
        e = r[k]
        ms = f"{e['step_ms']:.1f}" if e.get("step_ms") is not None else "-"
        out.append(f"| {name} | {e['allocated'] / 2**20:.2f} | {e['columns'] or '-'} | {e['ratio']:.2f}x | "
                   f"{r['fit'][k]} | {ms} |")
    out.append(f"| live tokens only | {r['live_bytes'] / 2**20:.2f} | - | 1.00x | {r['fit']['live_only']} | - |")
    return "\n".join(out)


def parse_mix(s: str) -> tuple[int, int, int]:
    """'1x4096+15x256' -> (long 4096, short 256, 15 short)."""
    try:
        a, b = s.split("+")
        one, long = a.split("x")
        n, short = b.split("x")
        if int(one) != 1:
            raise ValueError
        return int(long), int(short), int(n)
    except ValueError:
        raise SystemExit(f"graphc bench: --kv-capacity takes 1xLONG+NxSHORT (e.g. 1x4096+15x256), got {s!r}")


DEFAULT_MIX = "1x4096+15x256"


def cmd_kv_capacity(args) -> int:
    """The `graphc bench --kv-capacity [MIX]` entry: the mix on --model, capacity for a 16 GiB
    budget at llama-3.1-8b's bf16 KV bytes per token; JSON to --json when given."""
    long, short, n = parse_mix(args.kv_capacity)
    model, tokenizer, config, label = load_shape(args.model, args.dtype, args.seed)
    res = run_kv_capacity(model, tokenizer, config, long=long, short=short, n_short=n, new_tokens=32,
                          budget_gib=16.0, budget_config=SHAPES["llama-3.1-8b"])
    res.update(model={"name": label, "dtype": args.dtype}, command="graphc " + " ".join(sys.argv[1:]))
    print(kv_table(res))
    if args.json_out:
        write_json(res, args.json_out)
    return 0
