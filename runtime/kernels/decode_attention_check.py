"""What the ragged-attention kernels are compared on before they are used: random inputs at
CHECK_CASES, each kernel kind (and every vec configuration) against MLX's masked attention, and
the writing variants' output and in-place writes. Plain functions of the kernel's call
(`attend`), so each DecodeAttention checks its own kernels."""

from __future__ import annotations

import mlx.core as mx

from .decode_attention_shapes import VEC_CONFIG, grouped_warps, reference, vec_config, vec_fits

# (B, query heads, KV heads, capacity, head dim, end column, query length) that check() runs each
# kernel kind at; benchmarks/kernel_builds.py builds every one of them for the H200 too.
CHECK_CASES = ((3, 8, 2, 64, 64, 50, 1), (5, 32, 8, 256, 128, 200, 1), (2, 4, 4, 512, 128, 511, 1),
               (1, 9, 3, 128, 64, 80, 9), (3, 8, 2, 64, 64, 50, 5), (2, 32, 8, 256, 128, 256, 17),
               (2, 16, 2, 96, 128, 90, 3))


def check_cases(seed: int, kind: str, arrays: int):
    """The CHECK_CASES `kind` takes, each as (case, `arrays` random keys, each row's first column,
    the configurations to compare: for the vec kernel every one VEC_CONFIG can pick)."""
    key = mx.random.key(seed)
    for case in CHECK_CASES:
        B, Hq, Hkv, C, D, end, L = case
        ks = mx.random.split(key, arrays + 1)
        key = ks[arrays]
        if kind == "grouped" and not grouped_warps(Hq, Hkv, D):
            continue
        if kind == "vec" and not vec_fits(Hq, Hkv, D, 2):
            continue
        start = mx.array([(7 * i) % (end - L) for i in range(B)], dtype=mx.int32)  # every query sees a column
        configs = sorted({vec_config(n, Hq // Hkv, D) for n, _, _ in VEC_CONFIG}) if kind == "vec" else [None]
        yield case, ks, start, configs


def compare_kind(attend, seed: int, kind: str) -> str | None:
    """None when `attend` (the kernel's call) with `kind` matches `reference` on CHECK_CASES, else why not."""
    for (B, Hq, Hkv, C, D, end, L), ks, start, configs in check_cases(seed, kind, 3):
        q = mx.random.normal((B, Hq, L, D), key=ks[0]).astype(mx.bfloat16)
        k = mx.random.normal((B, Hkv, C, D), key=ks[1]).astype(mx.bfloat16)
        v = mx.random.normal((B, Hkv, C, D), key=ks[2]).astype(mx.bfloat16)
        want = reference(q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32), start, end, D ** -0.5)
        for config in configs:
            got = attend(q, k, v, start, mx.array([end], dtype=mx.int32), D ** -0.5, kind=kind, config=config)
            err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
            if not err < 2e-2:
                at = f" (warps, keys per lane {config})" if config else ""
                return (f"{kind} kernel{at} differs from masked attention by {err:.3g} at B={B} Hq={Hq} L={L} C={C} "
                        f"D={D}")
    return None



def compare_write_kind(attend, seed: int, kind: str) -> str | None:
    """The writing variant of `kind` on CHECK_CASES: its output must match MLX's masked attention
    over the cache with the new columns in place (to bf16 rounding), and afterwards the cache
    buffers must hold exactly the new columns there and be unchanged everywhere else."""
    for i, ((B, Hq, Hkv, C, D, end, L), ks, start, configs) in enumerate(check_cases(seed + 1, kind, 5)):
        q = mx.random.normal((B, Hq, L, D), key=ks[0]).astype(mx.bfloat16)
        k0 = mx.random.normal((B, Hkv, C, D), key=ks[1]).astype(mx.bfloat16)
        v0 = mx.random.normal((B, Hkv, C, D), key=ks[2]).astype(mx.bfloat16)
        nk = mx.random.normal((B, Hkv, L, D), key=ks[3]).astype(mx.bfloat16)
        nv = mx.random.normal((B, Hkv, L, D), key=ks[4]).astype(mx.bfloat16)
        if i % 2 == 0:  # as a compiled step passes them: views of one fused q/k/v row per token
            q, nk, nv = fused_rows_views(q, nk, nv)
        k_after = mx.slice_update(k0, nk, mx.array([end - L]), axes=(2,))
        v_after = mx.slice_update(v0, nv, mx.array([end - L]), axes=(2,))
        want = reference(q.astype(mx.float32), k_after.astype(mx.float32), v_after.astype(mx.float32),
                         start, end, D ** -0.5)
        mx.eval(want, k_after, v_after)
        for config in configs:
            k, v = k0 * 1, v0 * 1  # fresh buffers holding the old columns (the kernel writes into them)
            mx.eval(k, v)
            got = attend(q, k, v, start, mx.array([end], dtype=mx.int32), D ** -0.5, kind=kind,
                                   config=config, new=(nk, nv))
            mx.eval(got)
            at = f" (warps, keys per lane {config})" if config else ""
            err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
            if not err < 2e-2:
                return (f"writing {kind} kernel{at} differs from masked attention by {err:.3g} at B={B} Hq={Hq} "
                        f"L={L} C={C} D={D}")
            if not (mx.array_equal(k, k_after).item() and mx.array_equal(v, v_after).item()):
                return f"writing {kind} kernel{at} left the cache buffers wrong at B={B} Hq={Hq} L={L} C={C} D={D}"
    return None



def fused_rows_views(q, nk, nv):
    """The same q [B, Hq, L, D], nk, nv [B, Hkv, L, D] as strided views of one [B, L, (Hq + 2 Hkv) D]
    array: the layout of a fused q/k/v matmul's output split into heads (compiler/fused_block.py),
    which the writing kernels read without a copy."""
    B, Hq, L, D = q.shape
    rows = mx.concatenate([x.transpose(0, 2, 1, 3).reshape(B, L, -1) for x in (q, nk, nv)], axis=-1)
    mx.eval(rows)
    parts = mx.split(rows, [Hq * D, (Hq + nk.shape[1]) * D], axis=-1)
    return [p.reshape(B, L, -1, D).transpose(0, 2, 1, 3) for p in parts]
