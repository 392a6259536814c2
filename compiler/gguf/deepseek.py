"""llama.cpp's `deepseek2` architecture (DeepSeek-V2/V2.5/V2-Lite/V3/R1) -> mlx-lm's deepseek_v2 / deepseek_v3.

One GGUF architecture holds two routers: DeepSeek-V2 scores experts with a softmax,
DeepSeek-V3 with a sigmoid plus a per-expert bias (`exp_probs_b`). mlx-lm has one class
for each, so `expert_gating_func` (absent in V2 files made before the key existed, which
llama.cpp then reads as softmax) picks deepseek_v2 or deepseek_v3.

Multi-head latent attention (MLA) needs the most care. The Hugging Face model has one
`kv_b_proj` (per head: qk_nope rows for the keys, then v_head rows for the values, over
the kv_lora_rank latent). Files converted before April 2025 store it as `attn_kv_b`;
newer ones split it for llama.cpp's absorbed attention into `attn_k_b` (each head's key
part transposed: kv_lora_rank × qk_nope) and `attn_v_b` (v_head × kv_lora_rank).
mlx-lm's deepseek_v2 takes `kv_b_proj`, its deepseek_v3 takes the split form
(`embed_q` = attn_k_b, `unembed_out` = attn_v_b). Where a layout has to be transposed
(attn_k_b into kv_b_proj, or attn_kv_b's key rows into embed_q) the quantized rows run
along the wrong axis for MLX, so that part is widened; everything else stays as stored.
"""

from __future__ import annotations

import numpy as np

from .quants import Affine
from .reader import GGUFError, GGUFHeader

ATTN = {"attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
        "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm": "self_attn.kv_a_layernorm",
        "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
        "ffn_up_exps": "mlp.switch_mlp.up_proj", "ffn_down_exps": "mlp.switch_mlp.down_proj",
        "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
        "ffn_down_shexp": "mlp.shared_experts.down_proj"}
# Tensors that do not map one to one: handled by `mla_weights` once a layer's are all read.
JOINED = frozenset({"attn_kv_b", "attn_k_b", "attn_v_b", "exp_probs_b"})
SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func values


def is_v3(header: GGUFHeader) -> bool:
    gating = int(header.metadata.get("deepseek2.expert_gating_func", SOFTMAX))
    if gating not in (SOFTMAX, SIGMOID):
        raise GGUFError(f"deepseek2.expert_gating_func = {gating} is neither softmax (1) nor sigmoid (2)")
    return gating == SIGMOID


def deepseek_config(get, header: GGUFHeader, path, cfg: dict) -> None:
    """Fill `cfg` (the common fields already there) with deepseek_v2 / deepseek_v3's MLA and MoE fields.

    `get(key, default=None, required=True)` reads `deepseek2.<key>`."""
    v3 = cfg["model_type"] == "deepseek_v3"
    rope = int(get("rope.dimension_count"))
    # MLA files (llama.cpp since 2025) describe the absorbed form in key_length/value_length
    # (kv_lora_rank + rope, kv_lora_rank) and the per-head sizes in the *_mla keys.
    q_head = int(get("attention.key_length_mla", required=False) or get("attention.key_length"))
    v_head = int(get("attention.value_length_mla", required=False) or get("attention.value_length"))
    cfg.pop("head_dim", None)
    q_lora = get("attention.q_lora_rank", required=False)
    experts = int(get("expert_count", 0, required=False) or 0)
    shared = int(get("expert_shared_count", 0, required=False) or 0)
    groups = int(get("expert_group_count", 1, required=False) or 1)
    cfg.update(
        kv_lora_rank=int(get("attention.kv_lora_rank")), q_lora_rank=int(q_lora) if q_lora else None,
        qk_rope_head_dim=rope, qk_nope_head_dim=q_head - rope, v_head_dim=v_head,
        # MLA is multi-head once decompressed; llama.cpp's head_count_kv of 1 is the latent cache
        num_key_value_heads=cfg["num_attention_heads"],
        n_routed_experts=experts or None, n_shared_experts=shared or None,
        num_experts_per_tok=int(get("expert_used_count")) if experts else None,
        moe_intermediate_size=int(get("expert_feed_forward_length", cfg["intermediate_size"])),
        routed_scaling_factor=float(get("expert_weights_scale", 1.0, required=False)),
        first_k_dense_replace=int(get("leading_dense_block_count", 0, required=False)),
        moe_layer_freq=1,  # llama.cpp has no such key: every layer past the dense ones is MoE
        n_group=groups, topk_group=int(get("expert_group_used_count", groups, required=False)),
    )
    renorm = bool(get("expert_weights_norm", False, required=False))
    if v3:
        cfg.update(topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=renorm)
    else:
        if renorm:  # mlx-lm's deepseek_v2 never renormalizes the chosen experts' weights
            raise GGUFError(f"{path}: a softmax-routed deepseek2 file with expert_weights_norm = true has "
                            "no mlx-lm counterpart (deepseek_v2 does not renormalize the top-k weights)")
        # greedy over all experts unless the file names expert groups (DeepSeek-V2's
        # group-limited routing: the best topk_group groups by their best expert)
        cfg["topk_method"] = "group_limited_greedy" if groups > 1 else "greedy"
    cfg["rope_scaling"] = _yarn(get, path) or (None if v3 else {"factor": 1.0})  # v2 reads the dict always
    if q_head - rope <= 0:
        raise GGUFError(f"{path}: deepseek2 key length {q_head} is not larger than the RoPE part {rope}")


def _yarn(get, path) -> dict | None:
    kind = get("rope.scaling.type", required=False)
    if kind in (None, "none"):
        return None
    if kind != "yarn":
        raise GGUFError(f"{path}: deepseek2 RoPE scaling '{kind}' is not supported (none and yarn are)")
    # llama.cpp's converter stores DeepSeek's mscale_all_dim as yarn_log_multiplier = 0.1·mscale_all_dim;
    # its graph scales the logits by (1 + 0.1·mscale_all_dim·ln factor)² and keeps the rotated
    # values' magnitude. No separate mscale is stored: mscale = mscale_all_dim (as in every
    # DeepSeek config) makes mlx-lm's rope ratio mscale/mscale_all_dim 1, as llama.cpp's is.
    m = float(get("rope.scaling.yarn_log_multiplier", 0.0, required=False)) / 0.1
    return {"type": "yarn", "factor": float(get("rope.scaling.factor")),
            "original_max_position_embeddings": int(get("rope.scaling.original_context_length")),
            "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0, required=False)),
            "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0, required=False)),
            "mscale": m, "mscale_all_dim": m}


def _rows(x, sl):
    """Rows `sl` (per head, on axis 1) of an Affine or array shaped (heads, rows, cols)."""
    if isinstance(x, Affine):
        return Affine(x.q[:, sl], x.scales[:, sl], x.biases[:, sl], x.bits)
    return x[:, sl]


def _dense(x) -> np.ndarray:
    return x.dequantize() if isinstance(x, Affine) else np.asarray(x, np.float32)


def mla_weights(layer: str, parts: dict, cfg: dict, path) -> list[tuple[str, object, list[str], bool]]:
    """A layer's joined tensors -> [(mlx-lm parameter, Affine or array, source TensorInfos, transposed)].

    `parts` maps attn_kv_b / attn_k_b / attn_v_b / exp_probs_b to (TensorInfo, decoded)."""
    heads, nope, vdim, rank = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"],
                               cfg["kv_lora_rank"])
    v3 = cfg["model_type"] == "deepseek_v3"
    pre = f"model.layers.{layer}"
    out = []
    if "exp_probs_b" in parts:
        t, bias = parts["exp_probs_b"]
        if not v3:
            raise GGUFError(f"{path}: {t.name} (DeepSeek-V3's expert score bias) in a softmax-routed file: "
                            "mlx-lm's deepseek_v2 router has no such bias")
        out.append((f"{pre}.mlp.gate.e_score_correction_bias", np.asarray(bias, np.float32), [t], False))
    elif v3 and cfg["n_routed_experts"] and int(layer) >= cfg["first_k_dense_replace"]:
        # llama.cpp treats the bias as optional (none = zero); mlx-lm's class always has one
        out.append((f"{pre}.mlp.gate.e_score_correction_bias", np.zeros(cfg["n_routed_experts"], np.float32), [], False))
    if "attn_kv_b" in parts:
        t, kv = parts["attn_kv_b"]
        if t.shape != (heads * (nope + vdim), rank):
            raise GGUFError(f"{path}: {t.name} has shape {t.shape}, not ({heads}·({nope}+{vdim}), {rank})")
        if not v3:
            out.append((f"{pre}.self_attn.kv_b_proj.weight", kv, [t], False))
        else:
            kv = _reshape(kv, (heads, nope + vdim, rank))
            k = _dense(_rows(kv, slice(0, nope))).swapaxes(1, 2)  # (heads, rank, nope)
            out.append((f"{pre}.self_attn.embed_q.weight", np.ascontiguousarray(k), [t], True))
            out.append((f"{pre}.self_attn.unembed_out.weight", _rows(kv, slice(nope, None)), [t], False))
    elif "attn_k_b" in parts and "attn_v_b" in parts:
        (tk, k), (tv, v) = parts["attn_k_b"], parts["attn_v_b"]
        if tk.shape != (heads, rank, nope) or tv.shape != (heads, vdim, rank):
            raise GGUFError(f"{path}: {tk.name} {tk.shape} / {tv.name} {tv.shape} are not "
                            f"({heads}, {rank}, {nope}) / ({heads}, {vdim}, {rank})")
        if v3:
            out.append((f"{pre}.self_attn.embed_q.weight", k, [tk], False))
            out.append((f"{pre}.self_attn.unembed_out.weight", v, [tv], False))
        else:  # kv_b_proj rows per head: the key part (un-transposed) then the value part
            kv = np.concatenate([_dense(k).swapaxes(1, 2), _dense(v)], axis=1).reshape(heads * (nope + vdim), rank)
            out.append((f"{pre}.self_attn.kv_b_proj.weight", kv, [tk, tv], True))
    elif parts.keys() & {"attn_k_b", "attn_v_b"}:
        raise GGUFError(f"{path}: layer {layer} has only one of attn_k_b / attn_v_b; the file is incomplete")
    return out


def _reshape(x, shape):
    if isinstance(x, Affine):
        lead = shape[:-1]
        return Affine(x.q.reshape(*lead, -1), x.scales.reshape(*lead, -1), x.biases.reshape(*lead, -1), x.bits)
    return np.asarray(x).reshape(shape)
