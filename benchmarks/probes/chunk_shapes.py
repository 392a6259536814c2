"""Is padding long-context prompt chunks to a coarser grid cheaper than meeting new attention shapes?

MLX's CUDA attention builds a cuDNN plan per exact (query length, key length) it meets, and a warm
turn of a growing conversation is a new one past the warm-up's 4,096 tokens of context
(docs/agent-replay.md#32k-tokens). Padding a chunk's end with P tokens (after the real ones, so
their attention is unchanged) to a grid of G tokens would make shapes recur, at the price of
computing the pads. This measures both sides on one model shape's layer (random weights, bf16):

1. the plan: the first call of a new (q, k) shape against the same shape again, at each context;
2. the pads' attention: (q + P, k + P) against (q, k), both plans built;
3. the pads' projections and MLP: one layer's matmuls over P tokens (times the layer count).
4. pads inside the attention call only: the layer's real queries get S zero rows before them
   and E after (keys read E further into the cache buffer), so the call's query count lands on
   a grid Gq and its key count on G. With the causal mask aligned bottom-right, a real query
   still sees exactly the keys it saw; the pad rows' outputs are dropped, and no pad token
   runs through a projection or the MLP. Priced at the grids' average S = Gq / 2, E = G / 2.
5. no pad rows, a mask instead: the real queries over keys read to the grid's end (k + E), the
   causal limit and the E unwritten keys hidden by an additive mask array, which MLX's CUDA
   attention hands to cuDNN as a bias (one plan per (q, k + E) and mask layout). Priced as (4),
   the mask built once a forward and shared by the layers.

The pads' total cost at the grid's average P (G / 2) is then set against one plan build.

    python benchmarks/probes/chunk_shapes.py [--shape llama-3.1-8b] [--q 1024] [--contexts 8192,16384,32768]
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import argparse
import statistics
import time

import mlx.core as mx

from graphc.benchmarks.shapes import SHAPES
from graphc.runtime.cache.full import capacity_for


def _timed(fn, repeats: int) -> tuple[float, float]:
    """(first call ms, median ms of the next `repeats` calls); each call ends in mx.eval."""
    t = time.perf_counter()
    mx.eval(fn())
    first = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - t) * 1e3)
    return first, statistics.median(times)


def _attention(heads: int, kv_heads: int, dim: int, q: int, k: int):
    """A chunk of q queries over k keys, the keys a slice of a cache buffer as graphc's rows are."""
    cap = capacity_for(k)
    queries = mx.random.normal((1, heads, q, dim)).astype(mx.bfloat16)
    keys = mx.random.normal((1, kv_heads, cap, dim)).astype(mx.bfloat16)
    values = mx.random.normal((1, kv_heads, cap, dim)).astype(mx.bfloat16)
    mx.eval(queries, keys, values)
    scale = dim ** -0.5
    return lambda: mx.fast.scaled_dot_product_attention(queries, keys[..., :k, :], values[..., :k, :],
                                                         scale=scale, mask="causal")


def _masked_attention(heads: int, kv_heads: int, dim: int, q: int, k: int, k_pad: int):
    """(5): q queries whose causal limit ends at k, over k_pad keys, the rest masked by a bias."""
    cap = capacity_for(k_pad)
    queries = mx.random.normal((1, heads, q, dim)).astype(mx.bfloat16)
    keys = mx.random.normal((1, kv_heads, cap, dim)).astype(mx.bfloat16)
    values = mx.random.normal((1, kv_heads, cap, dim)).astype(mx.bfloat16)
    rows = mx.arange(k - q, k)[:, None]
    bias = mx.where(mx.arange(k_pad)[None] <= rows, 0.0, -float("inf")).astype(mx.bfloat16)[None, None]
    mx.eval(queries, keys, values, bias)
    scale = dim ** -0.5
    return lambda: mx.fast.scaled_dot_product_attention(queries, keys[..., :k_pad, :], values[..., :k_pad, :],
                                                         scale=scale, mask=bias)


def _layer_matmuls(hidden: int, heads: int, kv_heads: int, dim: int, inter: int, tokens: int):
    """One decoder layer's projections and MLP over `tokens` positions (no attention)."""
    w = {name: (mx.random.normal(shape) * 0.02).astype(mx.bfloat16) for name, shape in {
        "qkv": (hidden, (heads + 2 * kv_heads) * dim), "o": (heads * dim, hidden),
        "gate_up": (hidden, 2 * inter), "down": (inter, hidden)}.items()}
    x = mx.random.normal((tokens, hidden)).astype(mx.bfloat16)
    mx.eval(x, *w.values())

    def run():
        h = (x @ w["qkv"])[:, : heads * dim] @ w["o"]
        g, u = mx.split(h @ w["gate_up"], 2, axis=-1)
        return (mx.sigmoid(g) * g * u) @ w["down"]
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--q", type=int, default=1024, help="the chunk's real tokens (a turn's new text)")
    ap.add_argument("--contexts", default="8192,16384,32768", help="key lengths, comma-separated")
    ap.add_argument("--grids", default="512,1024,2048", help="padding grids G to price, comma-separated")
    ap.add_argument("--q-grid", type=int, default=256, help="the query grid Gq of (4), attention-only pads")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    cfg = SHAPES[args.shape]
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    dim = cfg.get("head_dim") or hidden // heads
    inter = cfg["intermediate_size"]
    grids = [int(g) for g in args.grids.split(",")]
    print(f"chunk shapes: {mx.default_device()}, {args.shape}: {layers} layers, {heads}/{kv_heads} heads of {dim}, "
          f"hidden {hidden}, MLP {inter}; chunk of {args.q} tokens; {args.repeats} repeats")

    _timed(_attention(heads, kv_heads, dim, 128, 256), 1)  # the backend's first use, not a plan of its own
    plan_ms = []
    for k in (int(c) for c in args.contexts.split(",")):
        first, steady = _timed(_attention(heads, kv_heads, dim, args.q, k), args.repeats)
        plan_ms.append(first - steady)
        print(f"context {k}: attention ({args.q}, {k}) first call {first:.1f} ms, then {steady:.2f} ms: "
              f"the plan ~{first - steady:.1f} ms")
        for g in grids:
            p = g // 2
            _, padded = _timed(_attention(heads, kv_heads, dim, args.q + p, k + p), args.repeats)
            print(f"  grid {g}: ({args.q + p}, {k + p}) {padded:.2f} ms, the pads' attention "
                  f"{padded - steady:+.2f} ms a layer, {layers * (padded - steady):+.1f} ms a forward")
            s_rows = args.q_grid // 2
            _, inside = _timed(_attention(heads, kv_heads, dim, s_rows + args.q + p, k + p), args.repeats)
            print(f"    attention-only, Gq {args.q_grid}: ({s_rows + args.q + p}, {k + p}) {inside:.2f} ms, "
                  f"{layers * (inside - steady):+.1f} ms a forward; shapes up to {k}: "
                  f"{-(-k // g)} key grids x {-(-(args.q + g) // args.q_grid)} query grids")
            first_m, masked = _timed(_masked_attention(heads, kv_heads, dim, args.q, k, k + p), args.repeats)
            print(f"    mask, no pad rows: ({args.q}, {k + p}) {masked:.2f} ms (first call {first_m:.1f}), "
                  f"{layers * (masked - steady):+.1f} ms a forward")
    print("the pads' projections and MLP (one layer's matmuls over P tokens, times the layers):")
    for g in grids:
        p = g // 2
        _, ms = _timed(_layer_matmuls(hidden, heads, kv_heads, dim, inter, p), args.repeats)
        print(f"  grid {g} (P = {p} on average): {ms:.2f} ms a layer, {layers * ms:.1f} ms a forward")
    print(f"one plan build, median over the contexts: {statistics.median(plan_ms):.1f} ms")


if __name__ == "__main__":
    main()
