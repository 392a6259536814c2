"""GGUF tensors -> mlx-lm parameters: names, q/k row order, and the `quantization` entry.

mx.load returns Q4_0/Q4_1/Q8_0 tensors already as MLX affine quantization (packed uint32
weight + float16 scales and biases, group size 32), so they are kept quantized as stored:
Q4_0 is scale·q − 8·scale, Q4_1 scale·q + min, Q8_0 scale·q − 128·scale. Other ggml types
are refused by name, since mx.load would silently widen them to float16.
"""

from __future__ import annotations

import re

import mlx.core as mx

from .arch import GLOBAL_TENSORS, LAYER_TENSORS, Arch
from .reader import GGUFError, GGUFHeader

GROUP_SIZE = 32  # every ggml block type graphc imports has 32 values per block
QUANT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
PLAIN = {"F32", "F16"}
SUPPORTED = sorted(PLAIN | set(QUANT_BITS))

_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL = re.compile(r"^(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for unknown tensors."""
    m = _LAYER.match(gguf_name)
    if m and m.group(2) in LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{LAYER_TENSORS[m.group(2)]}.{m.group(3)}"
    m = _GLOBAL.match(gguf_name)
    if m and m.group(1) in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[m.group(1)]}.{m.group(2)}"
    return None


def check_types(header: GGUFHeader, path) -> None:
    bad = {}
    for t in header.tensors:
        if t.type_name not in PLAIN and t.type_name not in QUANT_BITS:
            bad.setdefault(t.type_name, []).append(t.name)
    if bad:
        what = "; ".join(f"{k} ({len(v)} tensors, e.g. {v[0]})" for k, v in sorted(bad.items()))
        raise GGUFError(f"{path}: tensor type(s) {what} are not supported by graphc's GGUF import "
                        f"(supported: {', '.join(SUPPORTED)}); pick a Q4_0, Q4_1, Q8_0 or F16 file")


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


def convert_weights(header: GGUFHeader, loaded: dict, arch: Arch, config: dict, path) -> tuple[dict, dict | None]:
    """(mlx-lm weights, quantization entry or None) from mx.load's tensors."""
    out: dict[str, mx.array] = {}
    bits_of: dict[str, int] = {}  # module path -> bits, for quantized modules
    heads = {"self_attn.q_proj": config["num_attention_heads"], "self_attn.k_proj": config["num_key_value_heads"]}
    for t in header.tensors:
        name = hf_name(t.name)
        if name is None:
            raise GGUFError(f"{path}: tensor '{t.name}' has no counterpart in mlx-lm's "
                            f"{arch.model_type} model; this file's layout is not supported")
        module, kind = name.rsplit(".", 1)
        stem = t.name[: -len(kind) - 1]
        parts = {kind: loaded[t.name]}
        if t.type_name in QUANT_BITS:
            parts["scales"] = loaded[f"{stem}.scales"]
            parts["biases"] = loaded[f"{stem}.biases"]
            bits_of[module] = QUANT_BITS[t.type_name]
        n_heads = next((n for suffix, n in heads.items() if module.endswith(suffix)), None)
        for part, arr in parts.items():
            if arch.permuted_qk and n_heads is not None:
                arr = unpermute_rows(arr, n_heads)
            out[f"{module}.{part}"] = arr
    if not bits_of:
        return out, None
    # The most common width is the default; modules of the other width are named one by one.
    counts = {}
    for b in bits_of.values():
        counts[b] = counts.get(b, 0) + 1
    default = max(counts, key=counts.get)
    quant = {"group_size": GROUP_SIZE, "bits": default}
    for module, b in sorted(bits_of.items()):
        if b != default:
            quant[module] = {"group_size": GROUP_SIZE, "bits": b}
    return out, quant
