"""A decode or verify step's new keys and values written into a quantized cache in place: one CUDA
kernel that quantizes both (as `mx.quantize`, bit for bit) and writes all six planes.

Why: the `quantized` cache policy (`--kv-bits`) kept each step's new columns with two
`mx.quantize` calls and six slice writes (codes, scales and biases of the keys and of the values)
per layer, before graphc's quantized attention kernel (runtime/kernels/quantized_attention.py).
At the Llama-3.1-8B shape, batch 64, 2,048 tokens, eager on an H100, the 8-bit step was 2.1-2.3 ms
slower than bf16, a fixed cost about what ~8 more launches a layer (256 a step) take. Here they are
one launch a layer. The bf16 path writes its columns inside the attention kernel
(runtime/kernels/decode_attention.py's writing variants); a separate kernel is kept here because
the attention's blocks of one row would otherwise each have to quantize the new columns they read
(a verify step's query l reads the l columns before it, written by other blocks).

What it writes is mx.quantize's (codes, scales, biases) of the new rows: the kernel reproduces MLX's
CUDA `affine_quantize` op for op (its start values of min and max, round(), the casts), and
`check()` compares the two bit for bit on this device before it serves (at both widths, every
group size, each dtype, including groups of only negative values, of one value and of zeros);
otherwise the policy keeps mx.quantize and the slice writes (runtime/cache/quantized.py).

In place: the planes are the cache's row-contiguous arrays, which MLX does not see change; the
kernel's only output is the attention's `end` (the column after the new ones), so the attention
launch that takes it runs after this one, and nothing else reads the new columns before it (the
next step's reads depend on this step's tokens). A plane that is not row-contiguous stops the kernel
(`__trap`), never a silent miswrite.

    cuda/quantized_write/source.cu   the kernel: a lane per 8 values, a scale group per GS / 8 lanes
"""

from __future__ import annotations

import mlx.core as mx

from . import Kernel, KernelOp, answers_of, cuda_source, in_process_check, restore_answers

__all__ = ["KERNEL", "QuantizedWrite", "check", "quantized_write", "reference", "takes"]

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
THREADS = 128
_INPUTS = ["nk", "nv", "k", "k_scales", "k_biases", "v", "v_scales", "v_biases", "col"]
_SOURCE = cuda_source("quantized_write/source.cu")

# ((B, Hkv, L, C, D, col), dtypes, bits, group sizes): Llama-3.2-1B and -3.1-8B KV heads, a verify's
# 5 new columns, a capacity past the written ones, in bf16 at every width and group size, float16 and
# float32 at one each (the math is the same float32; only the loads and the scales' cast differ).
# Each (dtype, bits, group) is a build of its own.
CHECK_CASES = (((3, 8, 1, 64, 64, 37), (mx.bfloat16,), BITS, (32, 64)),
               ((2, 8, 1, 256, 128, 200), (mx.bfloat16,), BITS, (32, 64, 128)),
               ((2, 2, 5, 128, 128, 90), (mx.bfloat16, mx.float16, mx.float32), (8,), (64,)),
               ((2, 4, 3, 16, 64, 13), (mx.float16, mx.float32), (4,), (32,)))


def takes(D: int, group_size: int, bits: int) -> bool:
    """Whether the kernel takes this head dim and format: 8 values a lane, D / 8 lanes a row within
    a warp, and whole scale groups of a row."""
    return (D % 8 == 0 and D // 8 <= 32 and group_size in GROUP_SIZES and D % group_size == 0
            and bits in BITS)


def reference(nk, nv, planes: tuple, col: int, group_size: int, bits: int) -> mx.array:
    """The kernel's effect by MLX's own ops: mx.quantize of the new rows written at columns
    col .. col + L - 1 of each plane (MLX's slice writes rebind the callers' arrays, as the kernel
    writes their buffers); returns `end` (col + L)."""
    L = nk.shape[2]
    q = dict(group_size=group_size, bits=bits)
    for plane, new in zip(planes, (*mx.quantize(nk, **q), *mx.quantize(nv, **q))):
        plane[..., col:col + L, :] = new
    return mx.array([col + L], dtype=mx.int32)


class QuantizedWrite(KernelOp):
    """Quantize a step's new keys / values and write them into the six planes in place."""

    name = "quantized_write"

    def __init__(self):
        self.kernel = Kernel("graphc_quantized_write", _INPUTS, ["end"], _SOURCE, ensure_row_contiguous=False)
        self._check = in_process_check(lambda seed: self._compare(seed))

    def applies(self, D: int, group_size: int = 64, bits: int = 8) -> bool:
        return takes(D, group_size, bits)

    def check(self, seed: int = 0) -> str | None:
        """None when the planes it writes are mx.quantize's bit for bit here (and it leaves every
        other column alone); else why not."""
        return self._check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def stored_verdicts(self) -> dict:
        return {"check": answers_of(self._check)}

    def restore_verdicts(self, stored: dict) -> None:
        restore_answers(self._check, stored["check"])

    def __call__(self, *args, **kwargs):
        return self.write(*args, **kwargs)

    def write(self, nk, nv, planes: tuple, col, group_size: int, bits: int) -> mx.array:
        """nk, nv [B, Hkv, L, D] (any layout whose last dim is contiguous); planes: (k codes, k scales,
        k biases, v codes, v scales, v biases), the cache's row-contiguous arrays ([B, Hkv, C, D * bits
        / 32] uint32 and [B, Hkv, C, D / group_size] in nk's dtype), written **in place** at columns
        col .. col + L - 1; col int32 [1] -> end int32 [1] = col + L, to pass on to the attention."""
        B, Hkv, L, D = nk.shape
        if not takes(D, group_size, bits):
            raise ValueError(f"the quantized KV write does not take head dim {D} at group_size {group_size}, "
                             f"bits {bits}")
        if nv.shape != nk.shape or nv.dtype != nk.dtype:
            raise ValueError(f"new keys {nk.shape} {nk.dtype} and values {nv.shape} {nv.dtype} differ")
        codes, scales = (B, Hkv, planes[0].shape[2], D * bits // 32), (B, Hkv, planes[0].shape[2], D // group_size)
        for p, shape, dtype in zip(planes, (codes, scales, scales) * 2, (mx.uint32, nk.dtype, nk.dtype) * 2):
            if p.shape != shape or p.dtype != dtype:
                raise ValueError(f"plane {p.shape} {p.dtype} is not {shape} {dtype} ({bits}-bit, group "
                                 f"{group_size} rows of head dim {D} over {B} rows x {Hkv} KV heads)")
        total = B * Hkv * L * 2 * (D // 8)  # lanes: 8 values each, of every new key and value row
        (end,) = self.kernel(inputs=[nk, nv, *planes, col],
                             template=[("T", nk.dtype), ("BITS", bits), ("GS", group_size)],
                             grid=(-(-total // THREADS) * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
                             output_shapes=[(1,)], output_dtypes=[mx.int32])
        return end

    def _compare(self, seed: int) -> str | None:
        key = mx.random.key(seed)
        for (B, Hkv, L, C, D, col), dtypes, widths, groups in CHECK_CASES:
            for dtype in dtypes:
                for bits in widths:
                    for group in groups:
                        ks = mx.random.split(key, 4)
                        key = ks[3]
                        why = self._compare_one(ks[:3], B, Hkv, L, C, D, col, dtype, bits, group)
                        if why is not None:
                            return why
        return None

    def _compare_one(self, keys, B, Hkv, L, C, D, col, dtype, bits, group) -> str | None:
        # The new keys as RoPE leaves them (a view of [B, L, Hkv, D] rows), the values contiguous.
        nk = awkward_groups(mx.random.normal((B, L, Hkv, D), key=keys[0]), group, bits).astype(dtype)
        nk = nk.transpose(0, 2, 1, 3)
        nv = (mx.random.normal((B, Hkv, L, D), key=keys[1]) * 3).astype(dtype)
        planes = garbage_planes(keys[2], B, Hkv, C, D, dtype, bits, group)
        before = [bits_of(p) for p in planes]
        end = self.write(nk, nv, planes, mx.array([col], dtype=mx.int32), group, bits)
        mx.eval(end, *planes)
        where = f"B={B} Hkv={Hkv} L={L} D={D} {dtype} bits={bits} group_size={group}"
        if end.item() != col + L:
            return f"quantized KV write returned end {end.item()}, not {col + L}, at {where}"
        want = (*mx.quantize(nk, group_size=group, bits=bits), *mx.quantize(nv, group_size=group, bits=bits))
        for name, plane, old, new in zip(PLANE_NAMES, planes, before, want):
            got = bits_of(plane)
            if not mx.array_equal(got[..., col:col + L, :], bits_of(new)).item():
                return f"quantized KV write: {name} differ from mx.quantize's at {where}"
            rest = mx.concatenate([got[..., :col, :], got[..., col + L:, :]], axis=2)
            if not mx.array_equal(rest, mx.concatenate([old[..., :col, :], old[..., col + L:, :]], axis=2)).item():
                return f"quantized KV write: {name} changed outside the new columns at {where}"
        return None


PLANE_NAMES = ("key codes", "key scales", "key biases", "value codes", "value scales", "value biases")


def awkward_groups(x: mx.array, group: int, bits: int) -> mx.array:
    """x [B, L, Hkv, D] (a fresh array: written in place) with the groups where quantizers differ, a
    kind a KV head of its first row: only negative values (MLX's CUDA quantize takes its max from 0,
    its CPU one from -inf), a single value, zeros (scale 1e-7, bias 0), and max 2^bits - 1, min 0 and
    halves between (scale -1, bias 2^bits - 1: every code falls on a half, which round() takes away
    from zero and the CPU's rint to even; exact in bf16)."""
    n = (1 << bits) - 1
    j = mx.arange(x.shape[-1]) % group
    halves = mx.where(j == 0, n, mx.where(j == 1, 0, (j % n) + 0.5)).astype(mx.float32)
    kinds = (-mx.abs(x[0, 0, 0]) - 1, mx.full(j.shape, 0.75), mx.zeros(j.shape), halves)
    for h, row in enumerate(kinds[: x.shape[2]]):
        x[0, 0, h] = row
    return x


def garbage_planes(key, B, Hkv, C, D, dtype, bits, group) -> tuple:
    """Six planes of random bits (evaluated): what the write must leave alone outside its columns."""
    ks = mx.random.split(key, 2)
    codes = mx.random.randint(0, 1 << 30, (B, Hkv, C, D * bits // 32), key=ks[0]).astype(mx.uint32)
    scales = mx.random.normal((B, Hkv, C, D // group), key=ks[1]).astype(dtype)
    planes = (codes, scales, scales + 1, codes + 1, scales * 2, scales - 1)
    planes = tuple(mx.contiguous(p) for p in planes)
    mx.eval(*planes)
    return planes


def bits_of(x: mx.array) -> mx.array:
    """x's bits as unsigned integers of its width: equal bits, not merely equal numbers (-0, NaN)."""
    return x if x.dtype == mx.uint32 else mx.view(x, {2: mx.uint16, 4: mx.uint32}[x.dtype.size])


# The runtime's instance (runtime/kernels/registry.py lists it).
KERNEL = QuantizedWrite()


def quantized_write(nk, nv, planes, col, group_size, bits):
    return KERNEL.write(nk, nv, planes, col, group_size, bits)


def check(seed: int = 0) -> str | None:
    return KERNEL.check(seed)
