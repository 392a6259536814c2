"""What the kernel probes share: a graph timer and the decode-attention cases.

`timed`: µs per op of a graph of `per` ops (the protos build 32, as a 32-layer step has), median
over `reps` evaluated graphs after one warm-up, synchronized on both sides so each sample is the
device time of one graph plus its launch.

`attention_case`: 8 distinct random q / K / V sets at one shape (a 32-layer step's KV does not
fit in L2), the ragged kernels' start / end, and MLX's attention over them as a contestant."""
import statistics
import time
from types import SimpleNamespace

import mlx.core as mx


def timed(fn, reps: int = 15, per: int = 32) -> float:
    mx.eval(fn())
    ts = []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6 / per


def attention_case(Hq: int, Hkv: int, D: int, L: int, B: int, ctx: int) -> SimpleNamespace:
    """q [B, Hq, L, D] and K / V [B, Hkv, C, D] (C: ctx rounded up to 256) in bf16, rows starting
    at 0..16, `ctx` columns written. `mlx_fast()`: 32 MLX attention calls — for L = 1 on K / V
    sliced to the valid columns with no mask (its fused one-query kernel, what an eager step of
    rows that started together gets), for L > 1 with the causal array mask."""
    C = -(-ctx // 256) * 256
    c = SimpleNamespace(L=L, ctx=ctx, scale=D ** -0.5)
    c.qs = [mx.random.normal((B, Hq, L, D), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(8)]
    c.kb = [mx.random.normal((B, Hkv, C, D), key=mx.random.key(100 + i)).astype(mx.bfloat16) for i in range(8)]
    c.vb = [mx.random.normal((B, Hkv, C, D), key=mx.random.key(200 + i)).astype(mx.bfloat16) for i in range(8)]
    c.start = mx.array([(5 * i) % 17 for i in range(B)], dtype=mx.int32)
    c.end = mx.array([ctx], dtype=mx.int32)
    cols = mx.arange(C)[None, None]
    c.mask = ((cols <= (ctx - L + mx.arange(L))[None, :, None]) & (cols >= c.start[:, None, None]))[:, None]
    c.ks, c.vs = [x[:, :, :ctx] for x in c.kb], [x[:, :, :ctx] for x in c.vb]
    mx.eval(c.qs, c.kb, c.vb, c.start, c.ks, c.vs)

    def mlx_fast():
        if L == 1:
            return [mx.fast.scaled_dot_product_attention(c.qs[i % 8], c.ks[i % 8], c.vs[i % 8], scale=c.scale)
                    for i in range(32)]
        return [mx.fast.scaled_dot_product_attention(c.qs[i % 8], c.kb[i % 8], c.vb[i % 8], scale=c.scale, mask=c.mask)
                for i in range(32)]

    c.mlx_fast = mlx_fast
    return c
