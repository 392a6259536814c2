"""Which quantized-KV attention matmuls MLX's CUDA backend runs, and what they cost against bf16.

Attention on 8-bit KV codes is two `mx.quantized_matmul` calls per layer (mlx-lm's
`quantized_scaled_dot_product_attention`): scores = q @ K^T (transpose=True) and
out = p @ V (transpose=False). This tries both at decode (one query per row) and prompt
(several queries) shapes, batched as the engine calls them, and times the decode pair
against bf16 `mx.fast.scaled_dot_product_attention` on the same rows.

    python benchmarks/probes/cuda_quantized_attention.py --rows 64 --kv-heads 8 --q-heads 32 --dim 128 --cols 1024
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from kernel_bench import timed  # benchmarks/probes/kernel_bench.py (run from this folder's path)


def try_op(label, fn):
    try:
        out = fn()
        mx.eval(out)
        print(f"ok    {label}", flush=True)
        return True
    except Exception as e:  # the backend's "No implementation for problem shape" is a RuntimeError/ValueError
        print(f"FAIL  {label}: {str(e).splitlines()[0][:200]}", flush=True)
        return False


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--bits", type=int, default=8)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    B, Hk, Hq, D, T = a.rows, a.kv_heads, a.q_heads, a.dim, a.cols
    rep = Hq // Hk
    k = mx.random.normal((B, Hk, T, D)).astype(mx.bfloat16)
    v = mx.random.normal((B, Hk, T, D)).astype(mx.bfloat16)
    kq = mx.quantize(k, group_size=a.group_size, bits=a.bits)
    vq = mx.quantize(v, group_size=a.group_size, bits=a.bits)
    mx.eval(k, v, kq, vq)
    scale = D ** -0.5
    print(f"device {mx.default_device()}, rows {B}, kv heads {Hk}, q heads {Hq}, dim {D}, cols {T}, "
          f"{a.bits} bits, group {a.group_size}", flush=True)
    for m in (1, 7, 128):
        # mlx-lm's layout: queries grouped per kv head, [B, Hk, rep, m, D]
        q = (mx.random.normal((B, Hk, rep, m, D)) * scale).astype(mx.bfloat16)
        kw, ks, kb = (x[:, :, None] for x in kq)
        vw, vs, vb = (x[:, :, None] for x in vq)
        ok_s = try_op(f"scores  q@K^T  m={m} (transpose=True)",
                      lambda: mx.quantized_matmul(q, kw, ks, kb, transpose=True, group_size=a.group_size, bits=a.bits))
        pr = mx.softmax(mx.random.normal((B, Hk, rep, m, T)), axis=-1).astype(mx.bfloat16)
        ok_o = try_op(f"output  p@V    m={m} (transpose=False)",
                      lambda: mx.quantized_matmul(pr, vw, vs, vb, transpose=False, group_size=a.group_size, bits=a.bits))
        if m == 1 and ok_s and ok_o:
            def quant():
                s = mx.quantized_matmul(q, kw, ks, kb, transpose=True, group_size=a.group_size, bits=a.bits)
                w = mx.softmax(s.astype(mx.float32), axis=-1).astype(mx.bfloat16)
                return mx.quantized_matmul(w, vw, vs, vb, transpose=False, group_size=a.group_size, bits=a.bits)
            qf = q.reshape(B, Hq, 1, D)
            us_q = timed(quant, a.repeats, per=1)
            us_b = timed(lambda: mx.fast.scaled_dot_product_attention(qf, k, v, scale=1.0), a.repeats, per=1)
            print(f"decode attention, one layer: {a.bits}-bit codes {us_q / 1e3:.3f} ms, bf16 sdpa {us_b / 1e3:.3f} ms "
                  f"(medians), ratio {us_q / us_b:.2f}", flush=True)


if __name__ == "__main__":
    main()
