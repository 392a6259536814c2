"""Writes a GGUF file from an mlx-lm model folder the way llama.cpp's converter lays it out.

Test-only: the `gguf` package (llama.cpp's own Python writer and quantizers) writes the
file, so the importer is checked against an independent implementation of the format.
Llama q/k rows get llama.cpp's per-head permutation; the tokenizer goes in as GGUF's
byte-level BPE metadata (tokens, merges, token types, special ids, chat template).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf_blocks import LAYOUT, random_blocks

HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # phi3's fused projections
}
for _block in ("mlp", "block_sparse_moe"):  # qwen3_moe, mixtral experts
    HF_TO_GGUF.update({f"{_block}.gate": "ffn_gate_inp", f"{_block}.switch_mlp.gate_proj": "ffn_gate_exps",
                       f"{_block}.switch_mlp.up_proj": "ffn_up_exps",
                       f"{_block}.switch_mlp.down_proj": "ffn_down_exps"})
HF_TO_GGUF.update({  # deepseek2: MLA projections and the shared experts
    "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b", "self_attn.k_b_proj": "attn_k_b", "self_attn.v_b_proj": "attn_v_b",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp"})
HF_TO_GGUF.update({"mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
                   "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp"})


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation (HF split-halves -> interleaved RoPE rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Gemma 3's four norms per layer, as llama.cpp names them
GEMMA3 = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
          "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf: str, arch: str | None = None) -> str:
    if hf.endswith(".mlp.gate.e_score_correction_bias"):  # DeepSeek-V3's router bias
        return f"blk.{hf.split('.')[2]}.exp_probs_b.bias"
    if hf.startswith("model.layers."):
        _, _, i, rest = hf.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        names = {**HF_TO_GGUF, **GEMMA3} if arch in ("gemma2", "gemma3") else HF_TO_GGUF
        return f"blk.{i}.{names[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]


def write_gguf(model_dir: Path, out: Path, qtype: str = "F32", *, arch: str | None = None,
               tokenizer_model: str = "gpt2", pre: str = "default", extra_tensors=None,
               tokenizer=None, mla_split: bool = True) -> dict:
    """Write `out` from `model_dir`; 2-D matmul weights (and the embedding) stored as `qtype`
    (a type name, or a function of the HF tensor name giving one: mixed files like Q4_K_M).

    `tokenizer(writer)`, when given, writes the tokenizer metadata instead of the folder's BPE.
    deepseek2: `mla_split` writes kv_b as llama.cpp has since 2025 (attn_k_b transposed +
    attn_v_b), else as one attn_kv_b (older files).
    Returns the float32 weights by HF name (what the file was made from)."""
    import gguf
    import mlx.core as mx
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    cfg = json.loads((model_dir / "config.json").read_text())
    arch = arch or cfg["model_type"]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(model_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(out), arch)
    w.add_uint32(f"{arch}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{arch}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{arch}.attention.head_count", cfg["num_attention_heads"])
    # llama.cpp's MLA files say one KV head: the shared latent
    w.add_uint32(f"{arch}.attention.head_count_kv", 1 if arch == "deepseek2" and mla_split else cfg["num_key_value_heads"])
    w.add_uint32(f"{arch}.context_length", cfg["max_position_embeddings"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{arch}.rope.freq_base", cfg["rope_theta"])
    if arch == "gemma2":
        w.add_float32(f"{arch}.attn_logit_softcapping", cfg["attn_logit_softcapping"])
        w.add_float32(f"{arch}.final_logit_softcapping", cfg["final_logit_softcapping"])
        w.add_uint32(f"{arch}.attention.sliding_window", 4096)
    if arch in ("qwen3", "qwen3moe", "gemma3", "gemma2"):
        w.add_uint32(f"{arch}.attention.key_length", cfg["head_dim"])
    if arch == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", cfg["sliding_window"])
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", cfg["sliding_window_pattern"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        w.add_uint32(f"{arch}.expert_count", experts)
        w.add_uint32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
    if cfg.get("shared_expert_intermediate_size"):
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"])
    if cfg.get("moe_intermediate_size"):
        w.add_uint32(f"{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    if arch == "deepseek2":
        _deepseek_metadata(w, cfg, mla_split)
    if tokenizer is not None:
        tokenizer(w)
    else:
        _add_tokenizer(w, model_dir, cfg, tokenizer_model, pre)
    type_of = qtype if callable(qtype) else (lambda _name, t=qtype: t)
    rng = np.random.default_rng(0)
    for name, arr in _file_tensors(weights, cfg, arch, mla_split):
        qtype = type_of(name)
        if qtype in K_FALLBACK and arr.shape[-1] % 256:  # llama.cpp's fallback for rows not of 256
            qtype = K_FALLBACK[qtype]
        qt = getattr(T, qtype)
        data = arr
        if name.endswith("shared_expert_gate.weight"):  # llama.cpp's layout: one row, stored 1-D
            data = arr = arr.reshape(-1)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):  # llama.cpp's Gemma norm shift
            data = arr + 1
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            data = permute(arr, cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"])
        if arr.ndim in (2, 3) and qtype not in ("F32",):
            if qtype == "F16":
                w.add_tensor(gguf_name(name, arch), data.astype(np.float16))
            elif qtype in LAYOUT and qtype not in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
                # gguf has no quantizer for K-quants / IQ4: random valid blocks stand in (the
                # tests take the file's own dequantization as the reference weights)
                rows = int(np.prod(data.shape[:-1]))
                blocks = random_blocks(qtype, rows, data.shape[-1], rng).reshape(*data.shape[:-1], -1)
                w.add_tensor(gguf_name(name, arch), blocks, raw_dtype=qt)
            else:
                w.add_tensor(gguf_name(name, arch), quants.quantize(data, qt), raw_dtype=qt)
        else:
            w.add_tensor(gguf_name(name, arch), data.astype(np.float32))
    for name, (raw, t) in (extra_tensors or {}).items():
        w.add_tensor(name, raw, raw_dtype=getattr(T, t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def _file_tensors(weights: dict, cfg: dict, arch: str, mla_split: bool):
    """(HF-style name, float32 array) per file tensor; deepseek's kv_b as llama.cpp splits it."""
    for name, arr in sorted(weights.items()):
        if arch != "deepseek2" or not name.endswith(("kv_b_proj.weight", "embed_q.weight", "unembed_out.weight")):
            yield name, arr
            continue
        heads, nope, vdim = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        pre = name.rsplit(".", 2)[0]
        if name.endswith("kv_b_proj.weight"):  # deepseek_v2 source
            kv = arr.reshape(heads, nope + vdim, -1)
            k, v = kv[:, :nope].swapaxes(1, 2), kv[:, nope:]
        elif name.endswith("embed_q.weight"):  # deepseek_v3 source: already split
            k, v = arr, weights[f"{pre}.unembed_out.weight"]
        else:
            continue
        if mla_split:
            yield f"{pre}.k_b_proj.weight", np.ascontiguousarray(k)
            yield f"{pre}.v_b_proj.weight", np.ascontiguousarray(v)
        else:
            yield f"{pre}.kv_b_proj.weight", np.concatenate([k.swapaxes(1, 2), v], axis=1).reshape(heads * (nope + vdim), -1)


def _deepseek_metadata(w, cfg: dict, mla_split: bool) -> None:
    """The deepseek2.* keys llama.cpp's converter writes (MLA form when `mla_split`)."""
    a, rank, rope = "deepseek2", cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    q_head = cfg["qk_nope_head_dim"] + rope
    w.add_uint32(f"{a}.leading_dense_block_count", cfg["first_k_dense_replace"])
    w.add_uint32(f"{a}.vocab_size", cfg["vocab_size"])
    if cfg.get("q_lora_rank"):
        w.add_uint32(f"{a}.attention.q_lora_rank", cfg["q_lora_rank"])
    w.add_uint32(f"{a}.attention.kv_lora_rank", rank)
    if mla_split:
        w.add_uint32(f"{a}.attention.key_length", rank + rope)
        w.add_uint32(f"{a}.attention.value_length", rank)
        w.add_uint32(f"{a}.attention.key_length_mla", q_head)
        w.add_uint32(f"{a}.attention.value_length_mla", cfg["v_head_dim"])
    else:
        w.add_uint32(f"{a}.attention.key_length", q_head)
        w.add_uint32(f"{a}.attention.value_length", cfg["v_head_dim"])
    w.add_uint32(f"{a}.expert_count", cfg["n_routed_experts"])
    w.add_uint32(f"{a}.expert_used_count", cfg["num_experts_per_tok"])
    w.add_uint32(f"{a}.expert_shared_count", cfg["n_shared_experts"])
    w.add_float32(f"{a}.expert_weights_scale", cfg["routed_scaling_factor"])
    if cfg.get("n_group", 1) > 1:
        w.add_uint32(f"{a}.expert_group_count", cfg["n_group"])
        w.add_uint32(f"{a}.expert_group_used_count", cfg["topk_group"])
    if cfg["model_type"] == "deepseek_v3":  # V2 files often lack the key: llama.cpp reads softmax then
        w.add_bool(f"{a}.expert_weights_norm", cfg["norm_topk_prob"])
        w.add_uint32(f"{a}.expert_gating_func", 2)
    w.add_uint32(f"{a}.rope.dimension_count", rope)
    ys = cfg.get("rope_scaling")
    if ys:
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", ys["factor"])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", ys["original_max_position_embeddings"])
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * ys["mscale_all_dim"])


def _add_tokenizer(w, model_dir: Path, cfg: dict, model: str, pre: str) -> None:
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    tc = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    special = set()
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        if t.get("special"):
            special.add(t["id"])
    tokens = [None] * len(vocab)
    for tok, i in vocab.items():
        tokens[i] = tok
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_string("tokenizer.ggml.model", model)
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_array("tokenizer.ggml.token_type", [3 if i in special else 1 for i in range(len(tokens))])
    eos = cfg["eos_token_id"]
    w.add_uint32("tokenizer.ggml.eos_token_id", eos[0] if isinstance(eos, list) else eos)
    w.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    w.add_uint32("tokenizer.ggml.padding_token_id", cfg["pad_token_id"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", tc["chat_template"])
