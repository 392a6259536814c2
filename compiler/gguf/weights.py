"""GGUF tensors -> mlx-lm parameters: names, q/k row order, the `quantization` entry, and a report.

Each tensor is decoded from the file's bytes (compiler/gguf/quants.py). Types with an exact
MLX affine form are kept quantized: packed uint32 `weight` + `scales` + `biases`, group
size 32, the scales in float16 where every one is exactly a float16 (Q4_0/Q4_1/Q5_x/Q8_0)
and in float32 otherwise (K-quants: d·sc needs up to 17 significant bits). The others are
widened to `widen_dtype` (float16 by default; float32 is exact).
"""

from __future__ import annotations

import re

import attrs
import mlx.core as mx
import numpy as np

from .arch import GLOBAL_TENSORS, LAYER_TENSORS, Arch
from .deepseek import mla_weights
from .quants import BLOCKS, GROUP_SIZE, KEPT_BITS, PLAIN, Affine, bits_per_weight, decode, pack
from .reader import GGUFError, GGUFHeader, tensor_bytes

SUPPORTED = sorted(BLOCKS)
WIDEN_DTYPES = {"float16": mx.float16, "float32": mx.float32, "bfloat16": mx.bfloat16}


@attrs.define
class TypeReport:
    """What became of one ggml type's tensors: kept quantized, widened, or plain floats."""

    fate: str  # "kept" | "widened" | "plain"
    tensors: int = 0
    values: int = 0
    file_bytes: int = 0
    out_bytes: int = 0
    transposed: int = 0  # tensors of a kept type widened to fit mlx-lm's MLA layout (deepseek2)

    def line(self, type_name: str) -> str:
        bpw = self.out_bytes * 8 / max(self.values, 1)
        what = {"kept": "kept quantized", "widened": "widened", "plain": "as stored"}[self.fate]
        if self.transposed:  # deepseek2: a transposed tensor, or one joined to a transposed one
            what = ("" if self.transposed == self.tensors else f"{what}, {self.transposed} ") + \
                "widened into mlx-lm's MLA layout"
        return (f"{type_name}: {self.tensors} tensors {what}, {self.file_bytes / 2**20:.1f} MiB in the file -> "
                f"{self.out_bytes / 2**20:.1f} MiB ({bits_per_weight(type_name):.2f} -> {bpw:.2f} bits/weight)")


_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL = re.compile(r"^(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str, arch: Arch | None = None) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for unknown tensors."""
    m = _LAYER.match(gguf_name)
    layer = {**LAYER_TENSORS, **(arch.tensors if arch else {})}
    if m and m.group(2) in layer:
        return f"model.layers.{m.group(1)}.{layer[m.group(2)]}.{m.group(3)}"
    m = _GLOBAL.match(gguf_name)
    if m and m.group(1) in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[m.group(1)]}.{m.group(2)}"
    return None


def check_types(header: GGUFHeader, path) -> None:
    bad = {}
    for t in header.tensors:
        if t.type_name not in BLOCKS:
            bad.setdefault(t.type_name, []).append(t.name)
    if bad:
        what = "; ".join(f"{k} ({len(v)} tensors, e.g. {v[0]})" for k, v in sorted(bad.items()))
        raise GGUFError(f"{path}: tensor type(s) {what} are not supported by graphc's GGUF import "
                        f"(supported: {', '.join(SUPPORTED)}); pick a K-quant (Q4_K_M, Q5_K_M, Q6_K), Q8_0 or F16 file")


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's q/k permutation: per head, rows (pairs, half) go back to (half, pairs).

    llama.cpp's converter reorders each head's rows so its interleaved RoPE rotates the same
    pairs as the Hugging Face split-halves RoPE; mlx-lm's llama uses the split halves, so the
    original order is restored. Works on packed quantized rows, scales and biases alike: each
    output row is moved whole."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise GGUFError(f"cannot un-permute {rows} rows over {n_heads} heads: not a multiple of 2×heads")
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def summary_lines(config: dict) -> list[str]:
    """The import's per-type report, from a converted folder's config.json (empty otherwise)."""
    info = config.get("graphc_gguf") or {}
    types = info.get("types")
    if not isinstance(types, dict):  # folders made by converter version 1 list only names
        return []
    lines = [f"gguf: {info.get('source')} (widened types in {info.get('widen_dtype')})"]
    for name, r in sorted(types.items()):
        lines.append("gguf:   " + TypeReport(r["fate"], r["tensors"], r["values"], r["file_bytes"],
                                             r["out_bytes"], r.get("transposed", 0)).line(name))
    return lines


def _fate(type_name: str) -> str:
    return "kept" if type_name in KEPT_BITS else "plain" if type_name in PLAIN else "widened"


def _mlx_parts(decoded, kind: str) -> dict[str, mx.array]:
    if isinstance(decoded, Affine):
        scales, biases = decoded.scales, decoded.biases
        exact16 = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in (scales, biases))
        dt = np.float16 if exact16 else np.float32
        return {kind: mx.array(pack(decoded.q, decoded.bits)), "scales": mx.array(scales.astype(dt)),
                "biases": mx.array(biases.astype(dt))}
    return {kind: mx.array(decoded)}


def convert_weights(header: GGUFHeader, path, arch: Arch, config: dict,
                    widen_dtype: str = "float16") -> tuple[dict, dict | None, dict[str, TypeReport]]:
    """(mlx-lm weights, quantization entry or None, per-type report) from the file's tensors."""
    widen = WIDEN_DTYPES[widen_dtype]
    out: dict[str, mx.array] = {}
    bits_of: dict[str, int] = {}  # module path -> bits, for quantized modules
    report: dict[str, TypeReport] = {}
    heads = {"self_attn.q_proj": config["num_attention_heads"], "self_attn.k_proj": config["num_key_value_heads"]}
    joined: dict[str, dict] = {}  # layer -> {gguf name: (TensorInfo, decoded)}, many-to-many tensors

    def emit(module: str, kind: str, decoded, sources, dtype=None):
        """`sources`: the file tensors it was made from; they share its bytes in the report."""
        type_name = sources[-1].type_name if sources else "F32"  # no source: a zero the file leaves out
        parts = _mlx_parts(decoded, kind)
        if module.endswith("shared_expert_gate") and parts[kind].ndim == 1:  # llama.cpp keeps it 1-D
            parts[kind] = parts[kind].reshape(1, -1)
        fate = _fate(type_name)
        if isinstance(decoded, Affine):
            bits_of[module] = decoded.bits
        elif dtype is not None:
            parts[kind] = parts[kind].astype(dtype)
        elif fate == "widened" or type_name == "BF16":
            parts[kind] = parts[kind].astype(widen if fate == "widened" else mx.bfloat16)
        if arch.norm_shift and module.endswith("norm") and kind == "weight":
            parts[kind] = (parts[kind].astype(mx.float32) - arch.norm_shift).astype(parts[kind].dtype)
        n_heads = next((n for suffix, n in heads.items() if module.endswith(suffix)), None)
        for part, arr in parts.items():
            if arch.permuted_qk and n_heads is not None:
                arr = unpermute_rows(arr, n_heads)
            out[f"{module}.{part}"] = arr
            total = max(sum(src.n_values for src in sources), 1)
            for src in sources:
                report[src.type_name].out_bytes += arr.nbytes * src.n_values // total

    for t in header.tensors:
        rep = report.setdefault(t.type_name, TypeReport(_fate(t.type_name)))
        rep.tensors += 1
        rep.values += t.n_values
        rep.file_bytes += t.n_bytes
        decoded = decode(t.type_name, tensor_bytes(path, header, t), t.shape)
        m = _LAYER.match(t.name)
        if m and m.group(2) in arch.joined:
            joined.setdefault(m.group(1), {})[m.group(2)] = (t, decoded)
            continue
        name = hf_name(t.name, arch)
        if name is None:
            raise GGUFError(f"{path}: tensor '{t.name}' has no counterpart in mlx-lm's "
                            f"{arch.model_type} model; this file's layout is not supported")
        module, kind = name.rsplit(".", 1)
        emit(module, kind, decoded, [t])
    if arch.joined:
        for layer in range(config["num_hidden_layers"]):
            parts = joined.get(str(layer), {})
            if not parts.keys() & {"attn_kv_b", "attn_k_b"}:
                raise GGUFError(f"{path}: layer {layer} has neither attn_kv_b nor attn_k_b/attn_v_b")
            for name, value, sources, transposed in mla_weights(str(layer), parts, config, path):
                module, kind = name.rsplit(".", 1)
                types = [src.type_name for src in sources]
                dtype = None
                if transposed:  # a quantized source had to be widened; plain sources keep their width
                    for ty in types:
                        report[ty].transposed += ty in KEPT_BITS
                    if not all(ty in PLAIN for ty in types):
                        dtype = widen
                    else:  # F16 (or BF16) sources alike stay so; mixed plain widths go to float32
                        dtype = {"F16": mx.float16, "BF16": mx.bfloat16}.get(types[0]) if len(set(types)) == 1 else None
                        dtype = dtype or mx.float32
                emit(module, kind, value, sources, dtype)
    if not bits_of:
        return out, None, report
    # The most common width is the default; modules of the other widths are named one by one.
    counts = {}
    for b in bits_of.values():
        counts[b] = counts.get(b, 0) + 1
    default = max(counts, key=counts.get)
    quant = {"group_size": GROUP_SIZE, "bits": default}
    for module, b in sorted(bits_of.items()):
        if b != default:
            quant[module] = {"group_size": GROUP_SIZE, "bits": b}
    return out, quant, report
