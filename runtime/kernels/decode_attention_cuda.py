"""The CUDA of the ragged decode attention (runtime/kernels/decode_attention.py), assembled from
its fragments in cuda/decode_attention/*.cu: three kernels (per query head, grouped by KV head,
vec), each in a plain and a writing variant. Everything here is text, computed once at import
and never changed; `new_kernels()` makes the kernel objects, so each DecodeAttention holds (and
builds) its own."""

from __future__ import annotations

from . import Kernel, cuda_source

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

# The grouped and vec kernels open the same way: one block per (row, KV head, query position)
# serving the G query heads of that KV group; @LANES@ sets `off`, the first of the @N@ dims of a
# key (and of each query) that this lane holds ...
_GROUP_OPEN = _SHAPES + cuda_source("decode_attention/group_open.cu")

# ... and close the same way: each warp's (max, sum, weighted values) per query head go to shared
# memory (from the lanes where @WRITER@), and warp w combines query heads w, w + WARPS, ...
GROUP_CLOSE = cuda_source("decode_attention/group_close.cu")

# The same attention with one block per (row, KV head, query position) serving all G query heads
# of that KV group: each K and V column is read once per group instead of once per query head
# (the per-head kernel took 2.3 of the compiled Llama-3.1-8B batch-64 step's 9.4 ms of device
# time under ncu). Each lane holds D/32 dims of G queries; WARPS
# warps split the keys, KPI keys per warp per iteration. Measured on the H200
# (benchmarks/probes/gqa_attention.py): 1.1-1.8x the per-head kernel at 8B batch 16-64 for
# one query (1.2-1.35x at 272 columns), 1.4-2.4x for 9 (verify), 1.2-1.5x for 9 at batch 1. Splitting the keys over more blocks
# (flash-decoding, a second combine launch) was slower at every shape tried, so it is not here.
_GROUPED_SOURCE = GROUPED_TEMPLATE = cuda_source("decode_attention/grouped_source.cu")  # the quantized kernel's too

_GROUPED_SOURCE = (_GROUPED_SOURCE.replace("@OPEN@", _GROUP_OPEN).replace("@KEYS@", _KEY_LOOP)
                   .replace("@CLOSE@", GROUP_CLOSE).replace("@N@", "PER").replace("@WRITER@", "true")
                   .replace("@LANES@", "    const int off = lane * PER;  // this lane's PER dims of every key"))
_GROUPED_SOURCE, _GROUPED_SOURCE_NEW = _variants(_GROUPED_SOURCE, "off", "ql", "true")

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

# The merge of a warp's lane groups (lanes LPK apart hold the same dims), the quantized vec kind's too.
VEC_MERGE = cuda_source("decode_attention/vec_merge.cu")
_VEC_SOURCE = (_VEC_SOURCE.replace("@OPEN@", _GROUP_OPEN).replace("@MERGE@", VEC_MERGE)
               .replace("@CLOSE@", GROUP_CLOSE).replace("@N@", "VEC")
               .replace("@WRITER@", "grp == 0").replace("@LANES@", """    const int sub = lane % LPK;  // this lane's VEC dims of a key: sub * VEC ..
    const int grp = lane / LPK;  // which of the warp's GPW keys
    const int off = sub * VEC;"""))
_VEC_SOURCE, _VEC_SOURCE_NEW = _variants(_VEC_SOURCE, "off", "ql", "true")


# (kind, writes the new K/V) -> (kernel name, input names, source); the writing variants take
# their inputs as they are (`ensure_row_contiguous=False`, see above).
SOURCES = {
    ("per_head", False): ("graphc_ragged_decode_attention", _INPUTS, _SOURCE),
    ("per_head", True): ("graphc_ragged_decode_attention_write", _INPUTS_NEW, _SOURCE_NEW),
    ("grouped", False): ("graphc_grouped_decode_attention", _INPUTS, _GROUPED_SOURCE),
    ("grouped", True): ("graphc_grouped_decode_attention_write", _INPUTS_NEW, _GROUPED_SOURCE_NEW),
    ("vec", False): ("graphc_vec_decode_attention", _INPUTS, _VEC_SOURCE),
    ("vec", True): ("graphc_vec_decode_attention_write", _INPUTS_NEW, _VEC_SOURCE_NEW),
}


def new_kernels() -> dict[tuple[str, bool], Kernel]:
    """Fresh kernel objects for every (kind, writing) variant; each is built on its first call."""
    return {key: Kernel(name, inputs, ["out"], source, ensure_row_contiguous=not key[1])
            for key, (name, inputs, source) in SOURCES.items()}
