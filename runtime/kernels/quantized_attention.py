"""Ragged attention over quantized KV (the `quantized` cache policy, `--kv-bits`): L new queries
per row over columns [start[b], end - L + 1 + l) of a cache kept as mx.quantize codes — a CUDA
kernel.

Why: mlx-lm attends over a quantized cache with `mx.quantized_matmul` (queries against packed
keys, then weights against packed values). MLX 0.32's CUDA backend has no quantized_matmul kernel
at head dim 64, and at head dim 128 none for a few keys (benchmarks/probes/cuda_quantized_attention.py),
so quantized KV could not serve on CUDA at all; where it ran, one layer's decode attention took
1.20x bf16 (H100). This kernel reads the codes and their per-group scales and biases and
dequantizes in registers (x = code * scale + bias), so a step reads about half the bytes of bf16 KV
at 8 bits.

Its layout is the grouped kernel's of runtime/kernels/decode_attention.py (one block per row, KV
head and query position, serving that group's query heads; WARPS warps split the keys, KPI keys a
warp per trip); its semantics are that kernel's: query l of a row sees the row's columns from
start[b] through end - L + l. It is used only on CUDA (eager decode and verify steps of llama-family
layers, runtime/kernel_views.py) and only after `check()` has compared it with `reference` (MLX's
dequantize, then masked attention) on random inputs in this process, at both widths and every
group size; otherwise quantized KV is refused on CUDA at load, as before. Where its own check passed,
runtime/kernels/quantized_write.py writes a step's new columns just before it (one launch a layer),
and its output is the `end` this kernel then takes.

    cuda/quantized_attention/open.cu        both kinds' opening: the block's row, pointers, the queries
    cuda/quantized_attention/*_lanes.cu     each kind's lane layout
    cuda/quantized_attention/key_loop.cu    the grouped kind's trips: KPI keys and values dequantized
    cuda/quantized_attention/vec_source.cu  the vec kind's trips, scores and softmax
"""

from __future__ import annotations

import mlx.core as mx

from . import Kernel, KernelOp, answers_of, cuda_source, in_process_check, restore_answers
from .decode_attention_cuda import GROUP_CLOSE, GROUPED_TEMPLATE, VEC_MERGE
from .decode_attention_shapes import reference as float_reference

__all__ = ["KERNEL", "QuantizedAttention", "check", "dequantized", "quantized_attention", "reference", "takes"]

WARPS = 4
MAX_GROUP = 8  # query heads per KV head: a lane holds G x D/32 query values in registers
GROUP_SIZES = (32, 64, 128)
BITS = (4, 8)

# Both kinds open the same way (open.cu: the block's row, KV head and query position; pointers at the
# row's codes, scales and biases; the queries in registers), the lane layout in @LANES@.
_OPEN = cuda_source("quantized_attention/open.cu")


def _opening(lanes: str, n: str) -> str:
    """The opening with a kind's lane layout (`lanes`: its *_lanes.cu) and dims a lane holds (`n`)."""
    return _OPEN.replace("@LANES@", lanes).replace("@N@", n)


# The grouped kind: the grouped kernel's body (scores, online softmax, weighted values) after a key
# loop that dequantizes each key and value into registers; closed as the grouped kernel closes (each
# warp's max, sum and weighted values combined per query head).
_SOURCE = (GROUPED_TEMPLATE.replace("@OPEN@", _opening(cuda_source("quantized_attention/grouped_lanes.cu"), "PER"))
           .replace("@KEYS@", cuda_source("quantized_attention/key_loop.cu")).replace("@CLOSE@", GROUP_CLOSE)
           .replace("@N@", "PER").replace("@WRITER@", "true"))
# The vec kind: each key's codes as one 8-byte (8 bits) or 4-byte (4 bits) load a lane, a few lanes a
# key, as decode_attention's vec kernel lays bf16 keys out; its warps' lane groups merge as that
# kernel's do (VEC_MERGE) before the close.
_VEC_SOURCE = (cuda_source("quantized_attention/vec_source.cu")
               .replace("@OPEN@", _opening(cuda_source("quantized_attention/vec_lanes.cu"), "VEC"))
               .replace("@MERGE@", VEC_MERGE).replace("@CLOSE@", GROUP_CLOSE.replace("@N@", "VEC"))
               .replace("@WRITER@", "grp == 0"))
_INPUTS = ["q", "k", "k_scales", "k_biases", "v", "v_scales", "v_biases", "start", "end", "scale"]
# The vec kind's (warps a block, keys a lane per trip, codes a lane per key), by head dim. Measured on
# an H100 (Llama-3.1-8B heads, batch 64, 2,048 columns, one layer at 8 bits;
# benchmarks/results/h100-quantized-configs-8b-2048.txt, `python benchmarks/probes/quantized_configs.py`):
# 4 x 4 x 8 took 248 us, 4 x 2 x 16 214 us (bf16 KV through the bf16 vec kernel: 212 us). 8 codes a
# lane at 8 bits is one 8-byte load where the bf16 vec kernel's lanes load 16 bytes, so as many loads
# for half the bytes; 16 codes a lane is one 16-byte load, fastest though it takes 210 registers a
# thread against 128 at 4 x 4 x 8 and in the bf16 kernel (sm_90a, codes converted by GRAPHC_CODE in
# cuda/quantized_attention/vec_source.cu; `python -m graphc.benchmarks.kernel_builds --full --only
# quantized_vec`). Head dims not measured keep 4 x 4 x 8.
VEC_CONFIG = (4, 4, 8)
VEC_CONFIG_BY_DIM = {128: (4, 2, 16)}
CODES_PER_LANE = (8, 16)
# The configs benchmarks/probes/quantized_configs.py times (`python -m graphc.benchmarks.kernel_builds
# --full` builds each).
VEC_CONFIGS = ((4, 4, 8), (4, 2, 8), (8, 2, 8), (8, 4, 8), (4, 8, 8), (4, 2, 16), (8, 2, 16), (4, 1, 16))


def vec_config(D: int) -> tuple[int, int, int]:
    """The vec kind's (warps, keys a lane per trip, codes a lane) at head dim D."""
    return VEC_CONFIG_BY_DIM.get(D, VEC_CONFIG)


# ((B, Hq, Hkv, C, D, end, L), bits, group sizes): batch, heads, capacity, head dim, columns written,
# queries. Llama-3.2-1B and -3.1-8B heads at both widths and two group sizes each, a group of one, a
# verify's 5 queries over 8 query heads per KV head; a capacity past the written columns throughout.
# Each (dtype, D, G, bits, group) is a build of its own (NVRTC, once per machine and code).
CHECK_CASES = (((3, 32, 8, 64, 64, 50, 1), BITS, (32, 64)), ((2, 32, 8, 256, 128, 200, 1), BITS, (64, 128)),
               ((2, 4, 4, 96, 64, 95, 1), (8,), (64,)), ((2, 16, 2, 128, 128, 90, 5), BITS, (64,)))


def takes(Hq: int, Hkv: int, D: int, group_size: int, bits: int) -> bool:
    """Whether the kernel takes these heads and this format."""
    return (bool(Hkv) and Hq % Hkv == 0 and 1 <= Hq // Hkv <= MAX_GROUP and D % 32 == 0 and D <= 256
            and group_size in GROUP_SIZES and D % group_size == 0 and bits in BITS)


def vec_fits(Hq: int, Hkv: int, D: int, codes: int | None = None) -> bool:
    """Whether the vec kind takes these heads at `codes` codes a lane (`vec_config`'s by default): D / codes
    lanes a key must divide a warp (D = 32, 64, 128, 256 at 8 codes; 32 to 256 at 16), and a lane's
    queries and sums in registers (at most 4 query heads a group, the bound decode_attention's vec
    kernel keeps)."""
    codes = codes or vec_config(D)[2]
    return codes in CODES_PER_LANE and D % codes == 0 and 32 % (D // codes) == 0 and Hq // Hkv <= 4


def dequantized(planes: tuple, group_size: int, bits: int) -> tuple[mx.array, mx.array]:
    """(keys, values) as floats from (k codes, k scales, k biases, v codes, v scales, v biases)."""
    kq, ks, kb, vq, vs, vb = planes
    return (mx.dequantize(kq, ks, kb, group_size=group_size, bits=bits),
            mx.dequantize(vq, vs, vb, group_size=group_size, bits=bits))


def reference(q, planes: tuple, start, end, scale, group_size: int, bits: int):
    """The kernel's result from MLX's own ops: dequantize, then masked attention."""
    k, v = dequantized(planes, group_size, bits)
    return float_reference(q, k, v, start, end, scale)


class QuantizedAttention(KernelOp):
    """Decode attention over ragged rows of a quantized cache."""

    name = "quantized_attention"

    def __init__(self):
        self.kernels = {"grouped": Kernel("graphc_quantized_decode_attention", _INPUTS, ["out"], _SOURCE),
                        "vec": Kernel("graphc_quantized_vec_decode_attention", _INPUTS, ["out"], _VEC_SOURCE)}
        self.vec_ok: str | None = "not checked"  # the vec kind's own verdict (None: it matched), set by check()
        self._check = in_process_check(lambda seed: self._compare(seed))

    def applies(self, Hq: int, Hkv: int, D: int, group_size: int = 64, bits: int = 8) -> bool:
        return takes(Hq, Hkv, D, group_size, bits)

    def check(self, seed: int = 0) -> str | None:
        """None when the grouped kind matches `reference` on random inputs here (both widths, the
        check's group sizes); else why not. The vec kind serves where it fits once it matched too."""
        return self._check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def stored_verdicts(self) -> dict:
        return {"check": answers_of(self._check), "vec": self.vec_ok}

    def restore_verdicts(self, stored: dict) -> None:
        restore_answers(self._check, stored["check"])
        self.vec_ok = stored.get("vec", "not checked")

    def note(self) -> str:
        """Which kinds serve (after `check()`), for the plan."""
        return "vec where it fits, grouped elsewhere" if self.vec_ok is None else f"grouped (vec off: {self.vec_ok})"

    def pick(self, Hq: int, Hkv: int, D: int) -> str:
        """vec where it fits and matched here, else grouped. Not yet timed against each other on a GPU:
        vec because decode_attention's grouped layout was latency-bound where its vec one was not."""
        return "vec" if self.vec_ok is None and vec_fits(Hq, Hkv, D) else "grouped"

    def __call__(self, *args, **kwargs):
        return self.attend(*args, **kwargs)

    def attend(self, q, planes: tuple, start, end, scale, group_size: int, bits: int, kind: str | None = None,
               config: tuple[int, int, int] | None = None):
        """q [B, Hq, L, D]; planes: (k codes, k scales, k biases, v codes, v scales, v biases) as the
        cache keeps them ([B, Hkv, C, D * bits / 32] uint32 and [B, Hkv, C, D / group_size]);
        start [B] int32; end [1] int32 -> [B, Hq, L, D]. `kind`: "grouped", "vec" or None (`pick`);
        `config`: the vec kind's (warps, keys a lane per trip, codes a lane), `vec_config(D)` by
        default (another is for probes: only `vec_config`'s was checked)."""
        B, Hq, L, D = q.shape
        Hkv = planes[0].shape[1]
        if not takes(Hq, Hkv, D, group_size, bits):
            raise ValueError(f"quantized attention does not take q {q.shape} over {Hkv} KV heads at "
                             f"group_size {group_size}, bits {bits}")
        if planes[0].shape[-1] * 32 != D * bits or planes[1].shape[-1] * group_size != D:
            raise ValueError(f"codes {planes[0].shape} / scales {planes[1].shape} are not {bits}-bit, group "
                             f"{group_size} rows of head dim {D}")
        kind = kind or self.pick(Hq, Hkv, D)
        warps, kpl, codes = config or vec_config(D)
        if kind == "vec" and not vec_fits(Hq, Hkv, D, codes):
            raise ValueError(f"the vec kind does not take {Hq} query heads over {Hkv} KV heads at head dim {D} "
                             f"with {codes} codes a lane")
        if not isinstance(scale, mx.array):
            scale = mx.array([scale], dtype=mx.float32)
        kq, ks, kb, vq, vs, vb = planes
        warps = warps if kind == "vec" else WARPS
        template = [("T", q.dtype), ("D", D), ("G", Hq // Hkv), ("WARPS", warps), ("BITS", bits), ("GS", group_size)]
        (out,) = self.kernels[kind](inputs=[q, kq, ks, kb, vq, vs, vb, start, end, scale],
                                    template=template + ([("KPL", kpl), ("CPL", codes)] if kind == "vec" else []),
                                    grid=(B * Hkv * L * warps * 32, 1, 1), threadgroup=(warps * 32, 1, 1),
                                    output_shapes=[q.shape], output_dtypes=[q.dtype])
        return out

    def _compare_kind(self, seed: int, kind: str) -> str | None:
        key = mx.random.key(seed)
        for (B, Hq, Hkv, C, D, end, L), widths, groups in CHECK_CASES:
            if kind == "vec" and not vec_fits(Hq, Hkv, D):
                continue
            for bits in widths:
                for group in groups:
                    ks = mx.random.split(key, 4)
                    key = ks[3]
                    q = mx.random.normal((B, Hq, L, D), key=ks[0]).astype(mx.bfloat16)
                    k = mx.random.normal((B, Hkv, C, D), key=ks[1]).astype(mx.bfloat16)
                    v = mx.random.normal((B, Hkv, C, D), key=ks[2]).astype(mx.bfloat16)
                    planes = (*mx.quantize(k, group_size=group, bits=bits), *mx.quantize(v, group_size=group, bits=bits))
                    start = mx.array([(7 * i) % (end - L) for i in range(B)], dtype=mx.int32)
                    ends = mx.array([end], dtype=mx.int32)
                    want = reference(q.astype(mx.float32), tuple(p if p.dtype == mx.uint32 else p.astype(mx.float32)
                                                                 for p in planes), start, ends, D ** -0.5, group, bits)
                    got = self.attend(q, planes, start, ends, D ** -0.5, group, bits, kind=kind)
                    err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
                    if not err < 2e-2:
                        return (f"quantized attention ({kind}) differs from dequantized masked attention by "
                                f"{err:.3g} at B={B} Hq={Hq} Hkv={Hkv} L={L} C={C} D={D} bits={bits} "
                                f"group_size={group}")
        return None

    def _compare(self, seed: int) -> str | None:
        """The grouped kind must match (else the kernel is off); the vec kind serves where it also matched."""
        why = self._compare_kind(seed, "grouped")
        if why is None:
            try:
                self.vec_ok = self._compare_kind(seed, "vec")
            except Exception as e:  # noqa: BLE001 - a build failure leaves the grouped kind in use
                self.vec_ok = f"vec kind failed: {type(e).__name__}: {e}"
        return why


# The runtime's instance (runtime/kernels/registry.py lists it).
KERNEL = QuantizedAttention()


def quantized_attention(q, planes, start, end, scale, group_size, bits):
    return KERNEL.attend(q, planes, start, end, scale, group_size, bits)


def check(seed: int = 0) -> str | None:
    return KERNEL.check(seed)
