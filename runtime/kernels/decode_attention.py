"""Ragged attention for decode and verify steps: L new queries per row over KV columns
[start[b], end - L + 1 + l) for query l — a CUDA kernel.

Why: on MLX's CUDA backend `mx.fast.scaled_dot_product_attention` takes its fused
one-query kernel only without an array mask and for a single query (a few, in some
versions); a batch whose rows are left-padded (rows join a running batch at different
lengths), a fixed-capacity buffer (the compiled decode path) or a speculative verify
(L = k + 1 causal queries) falls back to a path of several kernels, two of them cuBLAS
calls that each query cuBLAS's heuristics on the host: on the H200 an L = 9 attention cost
~175 us of host encode per layer against ~24 us for one query,
and a verify step is host-bound. This kernel takes each row's first valid column and the
end column instead of a mask — query l of a row sees the columns before it and itself,
causal inside the L new ones — so it is one launch per layer and reads only the columns
that hold the row's context.

Three kernels share those semantics: one block per query head (any head layout), one block
per KV group serving its query heads (grouped-query attention), and the vec kernel, the grouped
one with each key row loaded as 16-byte pieces by a few lanes (from VEC_MIN_BLOCKS blocks up,
where it was faster on the H200). It is used only on CUDA (the compiled decode path; eager
verify forwards and eager decode steps over left-padded rows through runtime/kernel_views.py),
and only after `check()` has compared each kernel with MLX's masked attention on random inputs
in this process (bf16 tolerance; the vec kernel in every configuration VEC_CONFIG can pick);
otherwise the masked MLX attention runs. It does not reproduce MLX's summation order, so its outputs
match to rounding, not bit for bit.
"""

from __future__ import annotations

import mlx.core as mx

from . import Kernel, KernelOp, cuda_source, in_process_check

# Both kernels read the same shapes ...
_SHAPES = cuda_source("decode_attention/shapes.cu")

# ... and their key loop opens the same way: WARPS warps take KPI consecutive keys per
# iteration over [s, e), all KPI keys' K and V loaded into kk / vv before any is used.
_KEY_LOOP = cuda_source("decode_attention/key_loop.cu")

_SOURCE = cuda_source("decode_attention/source.cu")

# Each kernel comes in two variants. The plain one reads every column from the cache (k, v).
# The writing one (inputs nk, nv: this step's Lq new keys / values, [B, Hkv, Lq, D]) is for the
# compiled decode step (runtime/compiled_decode.py, `attend_new`): it reads the Lq new columns
# from nk / nv and writes them into the cache buffers in place, one block per (row, KV head,
# query position) — so the step has no separate K/V write launch. Why: MLX writes a column
# functionally, a scatter per layer and plane into an array that takes over the old buffer; at
# Llama-3.1-8B batch 64 those 64 scatters were 0.94 of 8.4 ms of device time a step (ncu), and
# 32 layers' writes + attention took 1.75 ms a step against 1.00 with the write in the kernel
# (H200, benchmarks/probes/kv_write_kernel.py). No block of a
# launch reads a cache column it writes, and the next step's reads depend on this step's
# tokens, so the write needs no ordering beyond the stream's.
_ROWS_PLAIN = r"""        const T* ks = kp + (size_t)jc * D;
        const T* vs = vp + (size_t)jc * D;
"""
_ROWS_NEW = r"""        const T* ks = jc < e0 ? kp + (size_t)jc * D : nkp + (jc - e0) * nkj;  // a new column: from nk / nv (strided views)
        const T* vs = jc < e0 ? vp + (size_t)jc * D : nvp + (jc - e0) * nvj;
"""
_NEW = cuda_source("decode_attention/new.cu")

# How the variants take their inputs. The plain ones get row-contiguous inputs: MLX copies any
# other layout before the launch. The writing ones take them as they are
# (`ensure_row_contiguous=False`). In a compiled step the new keys come out of RoPE and the new
# values out of the fused q/k/v matmul, as views that keep the matmul row's stride (MLX's rope
# keeps its input's strides, mlx/backend/cuda/rope.cu). MLX's copies of those two views were two
# more launches a layer: 64 a step at Llama-3.1-8B, 32 at 1B, where the step is host-bound.
# The new keys and values are now read through their strides. Two things are not:
# - the queries, which `ragged_attention` makes row-contiguous: read through strides, they cost
#   the vec kernel 24 registers (152 instead of 128), so a quarter fewer blocks fit on an SM;
# - the cache buffers, which are written in place, so they must be the row-contiguous arrays
#   the caller keeps (a copy would take the write).
# Each launch checks those layouts, and the contiguous last dim of the views, and stops with
# an error where they do not hold. It never misreads silently.
_AT_PLAIN = r"""#define GRAPHC_START(b) start[b]
"""
_AT_STRIDED = cuda_source("decode_attention/at_strided.cu")
_INPUTS = ["q", "k", "v", "start", "end", "scale"]
_INPUTS_NEW = ["q", "k", "v", "nk", "nv", "start", "end", "scale"]


def _variants(source: str, off: str, ql: str, writes: str) -> tuple[str, str]:
    """(plain, writing) sources of a kernel: `off` is the lane's first dim in kp, `ql` the block's
    query position, `writes` whether this block writes its query position's column."""
    plain = _AT_PLAIN + (source.replace("@NEW@", "").replace("@ROWS@", _ROWS_PLAIN).replace("@NEWPTRS@", "")
                         .replace("@NEWALIGN@", ""))
    new = _NEW.replace("@OFF@", off).replace("@QL@", ql).replace("@WRITES@", writes)
    writing = _AT_STRIDED + (source.replace("@NEW@", new).replace("@ROWS@", _ROWS_NEW)
                             .replace("@NEWPTRS@", " | reinterpret_cast<unsigned long long>(nkp) | reinterpret_cast<unsigned long long>(nvp)")
                             .replace("@NEWALIGN@", "&& ((nkj | nvj) * sizeof(T)) % 16 == 0"))
    return plain, writing


_SOURCE, _SOURCE_NEW = _variants(_SOURCE.replace("@SHAPES@", _SHAPES).replace("@KEYS@", _KEY_LOOP),
                                 "lane * PER", "(bhl % Lq)", "h % (Hq / Hkv) == 0")
_kernel = Kernel("graphc_ragged_decode_attention", _INPUTS, ["out"], _SOURCE)
_kernel_new = Kernel("graphc_ragged_decode_attention_write", _INPUTS_NEW, ["out"], _SOURCE_NEW, ensure_row_contiguous=False)

# The grouped and vec kernels open the same way: one block per (row, KV head, query position)
# serving the G query heads of that KV group; @LANES@ sets `off`, the first of the @N@ dims of a
# key (and of each query) that this lane holds ...
_GROUP_OPEN = _SHAPES + cuda_source("decode_attention/group_open.cu")

# ... and close the same way: each warp's (max, sum, weighted values) per query head go to shared
# memory (from the lanes where @WRITER@), and warp w combines query heads w, w + WARPS, ...
_GROUP_CLOSE = cuda_source("decode_attention/group_close.cu")

# The same attention with one block per (row, KV head, query position) serving all G query heads
# of that KV group: each K and V column is read once per group instead of once per query head
# (the per-head kernel took 2.3 of the compiled Llama-3.1-8B batch-64 step's 9.4 ms of device
# time under ncu). Each lane holds D/32 dims of G queries; WARPS
# warps split the keys, KPI keys per warp per iteration. Measured on the H200
# (benchmarks/probes/gqa_attention.py): 1.1-1.8x the per-head kernel at 8B batch 16-64 for
# one query (1.2-1.35x at 272 columns), 1.4-2.4x for 9 (verify), 1.2-1.5x for 9 at batch 1. Splitting the keys over more blocks
# (flash-decoding, a second combine launch) was slower at every shape tried, so it is not here.
_GROUPED_SOURCE = cuda_source("decode_attention/grouped_source.cu")

_GROUPED_SOURCE = (_GROUPED_SOURCE.replace("@OPEN@", _GROUP_OPEN).replace("@KEYS@", _KEY_LOOP)
                   .replace("@CLOSE@", _GROUP_CLOSE).replace("@N@", "PER").replace("@WRITER@", "true")
                   .replace("@LANES@", "    const int off = lane * PER;  // this lane's PER dims of every key"))
_GROUPED_SOURCE, _GROUPED_SOURCE_NEW = _variants(_GROUPED_SOURCE, "off", "ql", "true")
_grouped = Kernel("graphc_grouped_decode_attention", _INPUTS, ["out"], _GROUPED_SOURCE)
_grouped_new = Kernel("graphc_grouped_decode_attention_write", _INPUTS_NEW, ["out"], _GROUPED_SOURCE_NEW, ensure_row_contiguous=False)

# The grouped kernel again, laid out for memory-level parallelism (the "vec" kernel). The grouped
# kernel's lanes each hold D/32 dims of a key and load them as D/32 two-byte loads, four keys per
# warp per trip to memory; at Llama-3.1-8B batch 64 and 272 columns it read its 36 MB per layer
# at ~0.6 TB/s (57 µs) — latency-bound, not bandwidth-bound. Here a
# key is held by LPK = D / VEC lanes, each loading VEC = 16 / sizeof(T) consecutive elements as
# one 16-byte load, so a warp loads 32 / LPK whole keys per instruction (consecutive keys:
# 512 contiguous bytes), KPL of them per lane per trip; the dot products reduce over the LPK
# lanes of a key only. Each lane group keeps its own online softmax; the groups of a warp are
# merged with shuffles, the warps through shared memory as in the grouped kernel. WARPS and KPL
# (keys per lane per trip) are template arguments (`vec_config` picks them from the number of
# blocks).
_VEC_SOURCE = cuda_source("decode_attention/vec_source.cu")

_VEC_SOURCE = (_VEC_SOURCE.replace("@OPEN@", _GROUP_OPEN).replace("@CLOSE@", _GROUP_CLOSE).replace("@N@", "VEC")
               .replace("@WRITER@", "grp == 0").replace("@LANES@", """    const int sub = lane % LPK;  // this lane's VEC dims of a key: sub * VEC ..
    const int grp = lane / LPK;  // which of the warp's GPW keys
    const int off = sub * VEC;"""))
_VEC_SOURCE, _VEC_SOURCE_NEW = _variants(_VEC_SOURCE, "off", "ql", "true")
_vec = Kernel("graphc_vec_decode_attention", _INPUTS, ["out"], _VEC_SOURCE)
_vec_new = Kernel("graphc_vec_decode_attention_write", _INPUTS_NEW, ["out"], _VEC_SOURCE_NEW, ensure_row_contiguous=False)

# Shared memory the grouped kernel's final combine may use (static, well under 48 KB).
_GROUPED_SMEM = 32 * 1024


# The grouped and vec kernels' verdicts, set by `check()` (which runs before any trace uses the kernels).
_grouped_ok = {"ok": False, "why": "not checked"}
_vec_ok = {"ok": False, "why": "not checked"}

# (fewest blocks, warps per block, keys per lane per trip) for the vec kernel, first match wins,
# from an H200 sweep of warps x keys per lane at the Llama shapes: 4 x 4 was the fastest at every
# batch of 16 rows and more (128+ blocks at 8 KV heads), 8 x 4 at batch 1 for 9 queries.
VEC_CONFIG = ((128, 4, 4), (0, 8, 4))
# Fewer blocks than this (one query at batches under 8, at 8 KV heads) take the grouped kernel:
# through the public API the vec kernel was 1-2 % slower there (Llama-3.2-1B batch 1, slower in
# 5 of 5 paired repeats).
VEC_MIN_BLOCKS = 64


def vec_fits(Hq: int, Hkv: int, D: int, itemsize: int) -> bool:
    """Whether the vec kernel takes these heads: whole query groups of at most 8 heads, a key
    row split into 16-byte pieces over a power-of-two number of lanes (D = 32, 64, 128 or 256
    in bf16), and per lane a query group's dims in registers (G x 16 / itemsize <= 32)."""
    vec = 16 // itemsize if itemsize in (2, 4) else 0
    if not vec or not Hkv or Hq % Hkv or not 1 <= Hq // Hkv <= 8 or D % vec:
        return False
    lpk = D // vec
    return lpk <= 32 and 32 % lpk == 0 and (Hq // Hkv) * vec <= 32


# Static shared memory the vec kernel's combine may use (the limit is 48 KB): 16 warps at G = 4, D = 128.
_VEC_SMEM = 40 * 1024


def vec_config(blocks: int, G: int, D: int) -> tuple[int, int]:
    """(warps, keys per lane per trip) for `blocks` blocks; warps shrink until the combine's
    shared memory fits."""
    warps, kpl = next((w, k) for least, w, k in VEC_CONFIG if blocks >= least)
    while warps > 1 and warps * G * (D + 2) * 4 > _VEC_SMEM:
        warps //= 2
    return warps, kpl


def grouped_warps(Hq: int, Hkv: int, D: int) -> int:
    """Warps per block for the grouped kernel at these heads, or 0 where it does not apply:
    a group of one query head (nothing to share), more than 8 query heads per KV head (its
    registers), or a combine that would not fit in _GROUPED_SMEM."""
    G = Hq // Hkv if Hkv else 0
    if G < 2 or G > 8 or Hq % Hkv:
        return 0
    for warps in (8, 4, 2):
        if warps * G * (D + 2) * 4 <= _GROUPED_SMEM:
            return warps
    return 0


def takes(Hq: int, Hkv: int, D: int) -> bool:
    """Heads the kernels take: head dim a multiple of 32, query heads a multiple of KV heads."""
    return bool(D) and D % 32 == 0 and bool(Hkv) and Hq % Hkv == 0


def ragged_attention(q, k, v, start, end, scale: float | mx.array, kind: str | None = None,
                     config: tuple[int, int] | None = None, new: tuple | None = None):
    """q [B, Hq, L, D]; k, v [B, Hkv, C, D]; start [B] int32; end [1] int32 -> [B, Hq, L, D].

    `end`: one past the last written column; the L queries are the last L columns written
    (query l sees columns start[b] .. end - L + l). `kind`: "vec" (one block per KV group,
    16-byte loads), "grouped" (one block per KV group), "per_head" (one block per query head),
    or None: the first of those that applies and passed `check()` here. `config`: the vec
    kernel's (warps, keys per lane per trip), else `vec_config`'s choice.

    `new`: (nk, nv), this step's L new keys / values [B, Hkv, L, D]: the kernel reads columns
    end - L .. end - 1 from them and writes them into k and v **in place** (k, v: evaluated or
    lazy buffers the caller keeps using; MLX does not see the write, so nothing else may read
    those columns of k, v before this launch). Only after `write_check()` passed. This variant
    takes q, k, v, nk, nv and start in any layout whose last dim is contiguous (views of the
    fused q/k/v matmul's rows, as a compiled step makes them) without a copy."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    if D % 32 or Hkv == 0 or Hq % Hkv:
        raise ValueError(f"ragged attention needs D % 32 == 0 and query heads a multiple of KV heads, got "
                         f"q {q.shape}, k {k.shape}")
    if not isinstance(scale, mx.array):
        scale = mx.array([scale], dtype=mx.float32)
    if new:  # row-contiguous queries (a no-op where they are); the new keys / values are read as they are
        q = mx.contiguous(q)
    ins = [q, k, v, *new, start, end, scale] if new else [q, k, v, start, end, scale]
    if new and not (new[0].shape == new[1].shape == (B, Hkv, L, D)):
        raise ValueError(f"new keys / values must be [B, Hkv, L, D] = {(B, Hkv, L, D)}, got "
                         f"{new[0].shape}, {new[1].shape}")
    warps = grouped_warps(Hq, Hkv, D)
    if kind is None:
        if _vec_ok["ok"] and vec_fits(Hq, Hkv, D, q.dtype.size) and B * Hkv * L >= VEC_MIN_BLOCKS:
            kind = "vec"
        else:
            kind = "grouped" if warps and _grouped_ok["ok"] else "per_head"
    if kind == "vec":
        if not vec_fits(Hq, Hkv, D, q.dtype.size):
            raise ValueError(f"the vec kernel does not take q {q.shape} {q.dtype}, k {k.shape}")
        G = Hq // Hkv
        w, kpl = config or vec_config(B * Hkv * L, G, D)
        (out,) = (_vec_new if new else _vec)(
            inputs=ins,
            template=[("T", q.dtype), ("D", D), ("G", G), ("WARPS", w), ("KPL", kpl)],
            grid=(B * Hkv * L * w * 32, 1, 1),
            threadgroup=(w * 32, 1, 1),
            output_shapes=[q.shape],
            output_dtypes=[q.dtype],
        )
        return out
    if kind == "grouped":
        if not warps:
            raise ValueError(f"the grouped kernel does not take q {q.shape}, k {k.shape}")
        (out,) = (_grouped_new if new else _grouped)(
            inputs=ins,
            template=[("T", q.dtype), ("D", D), ("G", Hq // Hkv), ("WARPS", warps)],
            grid=(B * Hkv * L * warps * 32, 1, 1),
            threadgroup=(warps * 32, 1, 1),
            output_shapes=[q.shape],
            output_dtypes=[q.dtype],
        )
        return out
    (out,) = (_kernel_new if new else _kernel)(
        inputs=ins,
        template=[("T", q.dtype), ("D", D)],
        grid=(B * Hq * L * 128, 1, 1),
        threadgroup=(128, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    return out


def reference(q, k, v, start, end: int, scale: float):
    """MLX's masked attention with the kernel's semantics."""
    L, C = q.shape[2], k.shape[2]
    cols = mx.arange(C)[None, None]
    last = (end - L + mx.arange(L))[None, :, None]  # each query's own column
    mask = ((cols <= last) & (cols >= start[:, None, None]))[:, None]  # [B, 1, L, C]
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


# (B, query heads, KV heads, capacity, head dim, end column, query length) that check() runs each
# kernel kind at; benchmarks/kernel_builds.py builds every one of them for the H200 too.
CHECK_CASES = ((3, 8, 2, 64, 64, 50, 1), (5, 32, 8, 256, 128, 200, 1), (2, 4, 4, 512, 128, 511, 1),
               (1, 9, 3, 128, 64, 80, 9), (3, 8, 2, 64, 64, 50, 5), (2, 32, 8, 256, 128, 256, 17),
               (2, 16, 2, 96, 128, 90, 3))


def _check_cases(seed: int, kind: str, arrays: int):
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


def _compare_kind(seed: int, kind: str) -> str | None:
    for (B, Hq, Hkv, C, D, end, L), ks, start, configs in _check_cases(seed, kind, 3):
        q = mx.random.normal((B, Hq, L, D), key=ks[0]).astype(mx.bfloat16)
        k = mx.random.normal((B, Hkv, C, D), key=ks[1]).astype(mx.bfloat16)
        v = mx.random.normal((B, Hkv, C, D), key=ks[2]).astype(mx.bfloat16)
        want = reference(q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32), start, end, D ** -0.5)
        for config in configs:
            got = ragged_attention(q, k, v, start, mx.array([end], dtype=mx.int32), D ** -0.5, kind=kind, config=config)
            err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
            if not err < 2e-2:
                at = f" (warps, keys per lane {config})" if config else ""
                return (f"{kind} kernel{at} differs from masked attention by {err:.3g} at B={B} Hq={Hq} L={L} C={C} "
                        f"D={D}")
    return None


def _compare(seed: int) -> str | None:
    """The per-head kernel must match (else no kernel is used); the grouped one is used where
    it also matches, and its verdict is kept for `ragged_attention` (`grouped_note()`)."""
    why = _compare_kind(seed, "per_head")
    if why is None:
        for kind, verdict in (("grouped", _grouped_ok), ("vec", _vec_ok)):
            try:
                g = _compare_kind(seed, kind)
            except Exception as e:  # noqa: BLE001 - a build failure leaves the per-head kernel in use
                g = f"{kind} kernel failed: {type(e).__name__}: {e}"
            verdict.update(ok=g is None, why=g or "")
    return why


def grouped_note() -> str:
    """Which kernel serves grouped heads, or why the per-head kernel serves every shape (after
    `check()`)."""
    if _vec_ok["ok"]:
        return f"vec from {VEC_MIN_BLOCKS} blocks (rows x KV heads x queries), grouped below"
    note = "grouped by KV head" if _grouped_ok["ok"] else f"per query head ({_grouped_ok['why']})"
    return note + (f"; vec kernel off ({_vec_ok['why']})" if _vec_ok["why"] and _vec_ok["why"] != "not checked" else "")


# None when the kernel matches MLX's masked attention on random inputs here; else why not.
check = in_process_check(_compare)


def _compare_write_kind(seed: int, kind: str) -> str | None:
    """The writing variant of `kind` on CHECK_CASES: its output must match MLX's masked attention
    over the cache with the new columns in place (to bf16 rounding), and afterwards the cache
    buffers must hold exactly the new columns there and be unchanged everywhere else."""
    for i, ((B, Hq, Hkv, C, D, end, L), ks, start, configs) in enumerate(_check_cases(seed + 1, kind, 5)):
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
            got = ragged_attention(q, k, v, start, mx.array([end], dtype=mx.int32), D ** -0.5, kind=kind,
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


def _compare_write(seed: int) -> str | None:
    why = check(seed)
    if why is not None:
        return f"the attention kernel is off ({why})"
    for kind, verdict in (("per_head", {"ok": True}), ("grouped", _grouped_ok), ("vec", _vec_ok)):
        if verdict["ok"]:  # every kind ragged_attention may pick must also write correctly
            why = _compare_write_kind(seed, kind)
            if why is not None:
                return why
    return None


# None when every kernel kind that serves also matched in its writing variant here (after
# `check()`); then compiled decode steps write their keys / values through it (`attend_new`).
write_check = in_process_check(_compare_write)


def kernel_blocks(adapter) -> dict:
    """{id(layer): block} for the layers this kernel can serve: the architecture runs them as its
    own block (`ArchAdapter.own_block`, attention through `cache.attend`) and their heads fit
    the kernel (head dim a multiple of 32, query heads a multiple of KV heads)."""
    out = {}
    for layer in adapter.layers if adapter is not None else ():
        block = adapter.own_block(layer)
        a = getattr(layer, "self_attn", None)
        hd, hq, hkv = (getattr(a, n, 0) for n in ("head_dim", "n_heads", "n_kv_heads"))
        if block is not None and takes(hq, hkv, hd):
            out[id(layer)] = block
    return out


class DecodeAttention(KernelOp):
    """Decode attention over ragged rows of a cache, optionally writing the new K/V (`ragged_attention`)."""

    name = "decode_attention"

    def applies(self, Hq: int, Hkv: int, D: int) -> bool:
        return takes(Hq, Hkv, D)

    def check(self, seed: int = 0) -> str | None:
        return check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return ragged_attention(*args, **kwargs)


KERNEL = DecodeAttention()
