"""`quantized`: full-attention KV stored as `bits`-bit codes, opt-in and not exact.

The format is mlx-lm's own `QuantizedKVCache`: `mx.quantize(x, group_size, bits)` along
head_dim, so per token and KV head a layer keeps head_dim * bits / 8 bytes of codes (packed
in uint32) plus one scale and one bias per `group_size` values, in the model's dtype. At
bf16, head_dim 128, group 64: 136 bytes per K or V row at 8 bits and 72 at 4 bits, against
256 for bf16.

Attention runs on the codes, as mlx-lm's does: the cache has `bits` and `group_size`, so the
model's own attention (mlx_lm.models.base.scaled_dot_product_attention) sees a quantized
cache and calls `quantized_scaled_dot_product_attention` — `mx.quantized_matmul` of the
queries against the packed keys, softmax, `mx.quantized_matmul` against the packed values —
on the (codes, scales, biases) triples `update_and_fetch` returns. Nothing is dequantized
into a float buffer.

Everything that batches, trims or moves KV applies unchanged: codes, scales and biases are
six planes of one `FullKV` (growth by doubling, left-padded rows, `filter` / `extend` /
`extract`, speculative `trim_rows`), and the prefix cache stores the six planes in the
shared pool at their own dtypes, so a hit restores exactly the codes a cold run computed.
Quantizing is per token (groups run along head_dim), so chunked prefill and prefix hits
give the codes a whole-prompt prefill gives.

On CUDA, llama-family layers attend through graphc's quantized attention kernel instead
(KernelQuantizedKV: MLX's CUDA quantized_matmul lacks most attention shapes), and their decode and
verify steps write the new columns through graphc's quantized write kernel where its check passed
(WritingQuantizedKV: one launch a layer for the two mx.quantize calls and six slice writes, the
same bits; runtime/kernels/quantized_write.py).

What it is checked against: the load-time self-check runs mlx-lm's forward on
`QuantizedKVCache(group_size, bits)` for these layers (`reference_cache`) and requires
graphc's batched, chunked steps to match it to rounding; how far either is from bf16 KV is
measured, not assumed (tests/test_kv_quantized.py, docs/cache-policies.md).
"""

from __future__ import annotations

import logging

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from graphc.compiler.fused_block import llama_block, llama_not_own_block

from ..kernels import quantized_attention, quantized_write
from .base import CachePolicy, PolicyParam
from .device_ints import on_device
from .full import FullKV
from .prefix_state import PrefixKind, PrefixState
from .registry import register_policy

log = logging.getLogger("graphc.load")

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)  # what mx.quantize accepts
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
_FORMATS: dict = {}  # (base class, bits, group_size) -> its cache class
_TOLD: set = set()  # why the write kernel is off, each reason logged once a process


class QuantizedKV(FullKV):
    PLANES = ("keys", "values", "k_scales", "k_biases", "v_scales", "v_biases")
    # mlx-lm's attention switches to its quantized SDPA when the cache has `bits`; with_format
    # sets both per (bits, group_size).
    bits = 8
    group_size = 64

    @classmethod
    def with_format(cls, bits: int, group_size: int) -> type:
        """The cache class of one format (one class per format and base, made once): FullKV makes new
        instances with type(self)(...) (extract, restore), so the format travels with the class."""
        key = (cls, bits, group_size)
        if key not in _FORMATS:
            _FORMATS[key] = type(f"{cls.__name__}{bits}g{group_size}", (cls,), {"bits": bits, "group_size": group_size})
        return _FORMATS[key]

    def update_and_fetch(self, keys, values):
        q = dict(group_size=self.group_size, bits=self.bits)
        kq, ks, kb = mx.quantize(keys, **q)
        vq, vs, vb = mx.quantize(values, **q)
        out = self.append({"keys": kq, "values": vq, "k_scales": ks, "k_biases": kb,
                           "v_scales": vs, "v_biases": vb})
        return ((out["keys"], out["k_scales"], out["k_biases"]),
                (out["values"], out["v_scales"], out["v_biases"]))

    def keys_and_values(self):
        """(codes, scales, biases) of the keys and of the values, as mlx-lm's QuantizedKVCache
        returns them (KV-sharing layers attend over another layer's cache this way)."""
        if self.keys is None:
            return None, None
        n = self.idx
        return (tuple(getattr(self, p)[..., :n, :] for p in ("keys", "k_scales", "k_biases")),
                tuple(getattr(self, p)[..., :n, :] for p in ("values", "v_scales", "v_biases")))

    @property
    def state(self):
        return self.keys_and_values()



class KernelQuantizedKV(QuantizedKV):
    """QuantizedKV whose llama-family layers attend through graphc's quantized attention kernel
    (runtime/kernels/quantized_attention.py): the policy's caches where that kernel matched its
    reference on this device (`QuantizedPolicy.for_target`, from the target's facts the plan reads
    too). Why: MLX's CUDA quantized_matmul, which mlx-lm's quantized SDPA runs on, lacks kernels for
    most attention shapes (none at head dim 64). Other layers keep mlx-lm's path."""

    _mask = None  # the forward's mask, while run_layer runs a llama block

    def run_layer(self, layer, h, mask):
        if llama_not_own_block(layer) is not None:
            return layer(h, mask, self)
        self._mask = mask  # the prompt chunks' attention (below) takes the forward's own mask
        try:
            return llama_block(layer, None, h, self)
        finally:
            self._mask = None

    def attend_new(self, q, k, v, scale):
        """Write the new keys / values as codes, then attend: up to KERNEL_QUERIES queries a row
        (decode and verify steps) in the kernel over the codes of the whole buffer (each row from
        its first valid column); prompt chunks over the dequantized written columns in MLX's
        attention (one dequantize per chunk and layer, MLX's fused kernels for the many queries)."""
        if q.shape[2] <= KERNEL_QUERIES:
            end = self.write_new(k, v)
            planes = tuple(getattr(self, p) for p in _KERNEL_PLANES)
            return quantized_attention.quantized_attention(q, planes, self.left_pad_array(), end, scale,
                                                           self.group_size, self.bits)
        keys, values = self.update_and_fetch(k, v)
        kd, vd = quantized_attention.dequantized((*keys, *values), self.group_size, self.bits)
        return mx.fast.scaled_dot_product_attention(q, kd, vd, scale=scale, mask=self._mask)

    def write_new(self, k, v) -> mx.array:
        """Write a step's new keys / values at column idx; the written end (int32 [1]) for the
        attention: here by mx.quantize and a slice write per plane (8 launches a layer)."""
        self.update_and_fetch(k, v)
        return on_device([self.idx])


class WritingQuantizedKV(KernelQuantizedKV):
    """KernelQuantizedKV whose decode and verify steps write their new columns with graphc's quantized
    write kernel (runtime/kernels/quantized_write.py): both mx.quantize calls and the six slice writes
    of a layer as one launch, writing the planes in place — the same codes, scales and biases bit for
    bit (its check compared them with mx.quantize on this device: `QuantizedPolicy.for_target`).
    Why: those 8 launches a layer were the 8-bit step's fixed cost over bf16 (2.1-2.3 ms a step at
    Llama-3.1-8B, batch 64, H100). In place is safe as for the bf16 kernel's write: the planes are this
    cache's row-contiguous arrays (the kernel stops on any other layout); the columns written are at
    idx and past it, which nothing has read yet (an older array that shares a buffer with them — a
    filter keeping rows as a view, a prefix capture's pending slices — reads only columns before idx,
    and a speculative rollback's columns were read by a step already evaluated); and the attention
    takes the kernel's output as its end, so it runs after the write."""

    def write_new(self, k, v) -> mx.array:
        n = k.shape[2]
        if (self.keys is None or k.dtype != self.k_scales.dtype
                or not quantized_write.takes(k.shape[-1], self.group_size, self.bits)):
            return super().write_new(k, v)  # a first write (no planes yet) or a format the kernel lacks
        if self.grows_next(n):  # wider buffers first, as append grows them (the planes as templates)
            self._grow({p: getattr(self, p) for p in self.PLANES}, self.idx + n)
        planes = tuple(getattr(self, p) for p in _KERNEL_PLANES)
        end = quantized_write.quantized_write(k, v, planes, on_device([self.idx]), self.group_size, self.bits)
        self.idx += n
        self._offset = None
        return end


# The planes in the order the kernels take them: each K plane, then each V plane.
_KERNEL_PLANES = ("keys", "k_scales", "k_biases", "values", "v_scales", "v_biases")


# A step of at most this many queries a row attends in the kernel (one query for decode, k + 1 for a
# verify); longer prompt chunks dequantize their columns for MLX's attention.
KERNEL_QUERIES = 16


class DequantizedKVCache(KVCache):
    """The load-time self-check's reference where the kernel serves (KernelQuantizedKV): mlx-lm's
    own forward on a plain KVCache that stores each key and value as mx.quantize codes dequantized
    again — the same codes as QuantizedKVCache's, attended in MLX's float attention instead of
    quantized_matmul (which cannot run there): the same numbers up to summation order."""

    def __init__(self, group_size: int, bits: int):
        super().__init__()
        self.group_size, self.q_bits = group_size, bits

    def update_and_fetch(self, keys, values):
        q = dict(group_size=self.group_size, bits=self.q_bits)
        return super().update_and_fetch(mx.dequantize(*mx.quantize(keys, **q), **q),
                                        mx.dequantize(*mx.quantize(values, **q), **q))


def format_of(cache) -> tuple | None:
    """(bits, group_size) of a cache of a built-in format class (QuantizedKV.with_format), else None:
    the compiled decode path (runtime/compiled_decode_quantized.py) traces exactly these."""
    for (base, bits, group), cls in _FORMATS.items():
        if base is QuantizedKV and type(cache) is cls:
            return bits, group
    return None


@register_policy("quantized")
class QuantizedPolicy(CachePolicy):
    """Full-attention KV as `bits`-bit codes with a scale and a bias per `group_size` values
    (mlx-lm's QuantizedKVCache format); prefixes shared through the pool, stored quantized."""

    LAYER_KINDS = ("full_attention",)
    PARAMS = {
        "bits": PolicyParam(int, 8, "bits per KV value: 8 or 4"),
        "group_size": PolicyParam(int, 64, "values per scale and bias along head_dim: 32, 64 or 128"),
        "prefix": PolicyParam(bool, True, "share prompt prefixes through the pool (false: no prefix cache)"),
    }
    # Checked against mlx-lm's own QuantizedKVCache (reference_cache), not bf16 KV: no allowance.
    lossy_tolerance = 0.0
    prefix_kind = PrefixKind.TOKENS
    exact = False  # what `graphc inspect` reports: the numbers differ from bf16 KV on purpose

    def __init__(self, layer, **params):
        super().__init__(layer, **params)
        bits, group = self.params["bits"], self.params["group_size"]
        if bits not in BITS:
            raise ValueError(f"cache policy 'quantized': bits (kv_bits) must be one of {BITS}, got {bits}")
        if group not in GROUP_SIZES:
            raise ValueError(f"cache policy 'quantized': group_size (kv_group_size) must be one of "
                             f"{GROUP_SIZES}, got {group}")
        dims = {layer.head_dim, layer.v_head_dim or layer.head_dim}
        bad = sorted(d for d in dims if d % group)
        if bad:
            fits = [g for g in GROUP_SIZES if all(d % g == 0 for d in dims)]
            hint = f"group_size (kv_group_size) {fits[-1]}" if fits else "policy pool_backed (no group size fits)"
            raise ValueError(f"cache policy 'quantized': layer {layer.index}'s head_dim {bad[0]} is not a multiple "
                             f"of group_size (kv_group_size) {group}; use {hint}")
        self.cache_class = QuantizedKV.with_format(bits, group)
        self.kernel = False  # for_target: graphc's CUDA kernel attends (KernelQuantizedKV)
        self.write = False  # for_target: and its write kernel writes the new columns (WritingQuantizedKV)

    def for_target(self, target) -> None:
        """On a device where graphc's quantized attention kernel matched its reference (the target's
        `quantized_attention` fact: runtime/target.py probes it where quantized KV is asked for), the
        caches attend through it, and write their new columns through the quantized write kernel where
        that matched mx.quantize too (`quantized_write`); elsewhere mlx-lm's quantized SDPA runs, as it
        always has."""
        self.kernel = target.why_not("quantized_attention") is None
        why = target.why_not("quantized_write") if self.kernel else "the attention kernel is off"
        self.write = why is None
        if self.kernel and not self.write and why not in _TOLD:
            _TOLD.add(why)
            log.info("quantized KV: new keys / values written by mx.quantize and slice writes, 8 launches a "
                     "layer (the quantized write kernel is off: %s)", why)
        base = (WritingQuantizedKV if self.write else KernelQuantizedKV) if self.kernel else QuantizedKV
        self.cache_class = base.with_format(self.params["bits"], self.params["group_size"])

    def bytes_per_token(self) -> int:
        h, bits, group = self.layer.kv_heads, self.params["bits"], self.params["group_size"]
        item = _ITEMSIZE.get(self.layer.dtype, 4)  # scales and biases keep the model's dtype
        dims = (self.layer.head_dim, self.layer.v_head_dim or self.layer.head_dim)
        return sum(h * (d * bits // 8 + 2 * (d // group) * item) for d in dims)

    def describe(self) -> str:
        p = self.params
        return (f"quantized(bits={p['bits']}, group_size={p['group_size']}"
                + ("" if p["prefix"] else ", prefix=false") + "; not exact: KV rounded to codes)")

    def new_cache(self) -> QuantizedKV:
        return self.cache_class(1)

    def reference_cache(self):
        """The mlx-lm cache this policy reproduces: what the load-time self-check compares it to
        (where graphc's CUDA kernel attends, the same codes on a plain KVCache: DequantizedKVCache)."""
        group, bits = self.params["group_size"], self.params["bits"]
        if self.kernel:
            return DequantizedKVCache(group, bits)
        return QuantizedKVCache(group_size=group, bits=bits)

    # -- the prefix protocol (runtime/cache/prefix_state.py) -----------------------------
    def prefix_unsupported(self) -> str | None:
        if not self.params["prefix"]:
            return f"policy '{self.name}' was declared with prefix: false"
        return None

    def prefix_capture(self, cache: QuantizedKV, row: int, start: int, end: int) -> PrefixState:
        return PrefixState(PrefixKind.TOKENS, start, end, cache.positions(row, start, end))

    def prefix_capture_rows(self, cache: QuantizedKV, spans: list) -> tuple:
        return cache.positions_rows(spans)

    def prefix_restore(self, state: PrefixState) -> QuantizedKV:
        return self.cache_class.restored(state.arrays)
