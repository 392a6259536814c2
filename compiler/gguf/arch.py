"""Which GGUF architectures graphc imports, and how their metadata becomes an mlx-lm config.json.

llama.cpp names tensors and metadata keys its own way (`blk.N.attn_q`, `llama.block_count`);
mlx-lm's model classes take Hugging Face names. Each supported architecture is one entry:
the mlx-lm model_type, whether llama.cpp permuted the q/k rows for its interleaved RoPE
(its Hugging Face converter does that for the Llama family only), and the config keys.
"""

from __future__ import annotations

import attrs

from .deepseek import ATTN as DEEPSEEK_TENSORS
from .deepseek import JOINED as DEEPSEEK_JOINED
from .deepseek import deepseek_config, is_v3
from .reader import GGUFError, GGUFHeader


def _experts(block: str) -> dict[str, str]:
    """llama.cpp's stacked expert tensors -> mlx-lm's SwitchGLU under `block`."""
    return {"ffn_gate_inp": f"{block}.gate", "ffn_gate_exps": f"{block}.switch_mlp.gate_proj",
            "ffn_up_exps": f"{block}.switch_mlp.up_proj", "ffn_down_exps": f"{block}.switch_mlp.down_proj"}


@attrs.frozen
class Arch:
    model_type: str  # mlx-lm's models/<model_type>.py
    permuted_qk: bool  # llama.cpp stored q/k rows permuted for its interleaved ("normal") RoPE
    needs_head_dim: bool = False  # the mlx-lm class takes head_dim explicitly
    hf_class: str = "LlamaForCausalLM"
    tensors: dict = attrs.field(factory=dict)  # per-layer names beyond (or replacing) LAYER_TENSORS
    norm_shift: float = 0.0  # llama.cpp stored every *norm.weight plus this (Gemma's 1 + w norms)
    joined: frozenset = frozenset()  # per-layer tensors that map many-to-many (deepseek's MLA)


ARCHS = {
    "llama": Arch("llama", permuted_qk=True),
    # Mistral 7B files say "llama"; a few converters say "mistral": same layout and permutation.
    "mistral": Arch("llama", permuted_qk=True),
    "qwen2": Arch("qwen2", permuted_qk=False, hf_class="Qwen2ForCausalLM"),
    "qwen3": Arch("qwen3", permuted_qk=False, needs_head_dim=True, hf_class="Qwen3ForCausalLM"),
    "qwen3moe": Arch("qwen3_moe", permuted_qk=False, needs_head_dim=True, hf_class="Qwen3MoeForCausalLM",
                     tensors=_experts("mlp")),
    # Qwen1.5/2 MoE: routed experts plus one always-on shared expert with a sigmoid gate.
    "qwen2moe": Arch("qwen2_moe", permuted_qk=False, hf_class="Qwen2MoeForCausalLM",
                     tensors={**_experts("mlp"), "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
                              "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                              "ffn_up_shexp": "mlp.shared_expert.up_proj",
                              "ffn_down_shexp": "mlp.shared_expert.down_proj"}),
    # Phi-3 keeps HF's fused projections: q|k|v rows in attn_qkv, gate|up rows in ffn_up.
    "phi3": Arch("phi3", permuted_qk=False, hf_class="Phi3ForCausalLM",
                 tensors={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
    # Gemma 3: four norms per layer (llama.cpp's ffn_norm is the pre-feed-forward one), every
    # norm weight stored +1 since ggml's RMS norm multiplies by w where Gemma's uses 1 + w.
    "gemma3": Arch("gemma3_text", permuted_qk=False, needs_head_dim=True, hf_class="Gemma3ForCausalLM",
                   tensors={"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                            "post_ffw_norm": "post_feedforward_layernorm"}, norm_shift=1.0),
    "gemma2": Arch("gemma2", permuted_qk=False, needs_head_dim=True, hf_class="Gemma2ForCausalLM",
                   tensors={"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                            "post_ffw_norm": "post_feedforward_layernorm"}, norm_shift=1.0),
    # DeepSeek-V2 (softmax router); a sigmoid-routed deepseek2 file is DeepSeek-V3 (below)
    "deepseek2": Arch("deepseek_v2", permuted_qk=False, hf_class="DeepseekV2ForCausalLM",
                      tensors=DEEPSEEK_TENSORS, joined=DEEPSEEK_JOINED),
}
DEEPSEEK_V3 = Arch("deepseek_v3", permuted_qk=False, hf_class="DeepseekV3ForCausalLM",
                   tensors=DEEPSEEK_TENSORS, joined=DEEPSEEK_JOINED)
# Mixtral files say "llama" and carry llama.expert_count: the llama layout plus experts.
MIXTRAL = Arch("mixtral", permuted_qk=True, hf_class="MixtralForCausalLM", tensors=_experts("block_sparse_moe"))
# Named in the refusal: llama.cpp architectures whose mlx-lm class exists but whose tensor
# layout graphc does not map yet (docs/gguf.md says why for each).
NOT_YET = {
    "gemma": "norm weights stored +1 and GELU MLP: not mapped yet",
}

# GGUF tensor names -> mlx-lm parameter paths (per layer: blk.N.<name>).
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def arch_of(header: GGUFHeader, path) -> tuple[str, Arch]:
    name = header.metadata.get("general.architecture")
    if name is None:
        raise GGUFError(f"{path}: no general.architecture in the metadata; is this a model file?")
    if name not in ARCHS:
        why = f" ({NOT_YET[name]})" if name in NOT_YET else ""
        raise GGUFError(f"{path}: architecture '{name}' is not supported by graphc's GGUF import{why} "
                        f"(supported: {', '.join(sorted(ARCHS))}, and mixtral as 'llama' with experts); "
                        "convert the original Hugging Face model with `mlx_lm.convert` instead")
    if name in ("llama", "mistral") and int(header.metadata.get(f"{name}.expert_count", 0) or 0) > 0:
        return name, MIXTRAL
    if name == "deepseek2" and is_v3(header):
        return name, DEEPSEEK_V3
    return name, ARCHS[name]


def make_config(header: GGUFHeader, path, arch_name: str, arch: Arch, vocab_size: int, tied: bool,
                eos_ids: list[int], bos_id: int | None) -> dict:
    md = header.metadata

    def get(key, default=None, required=True):
        full = f"{arch_name}.{key}"
        if full in md:
            return md[full]
        if required and default is None:
            raise GGUFError(f"{path}: the metadata has no '{full}', which a {arch_name} model needs")
        return default

    if any(t.name in ("rope_freqs.weight", "rope_factors_long.weight") for t in header.tensors):
        raise GGUFError(f"{path}: this file carries per-dimension RoPE factors (rope_freqs, Llama 3.1+ "
                        "long-context scaling), which graphc's GGUF import does not map yet; convert the "
                        "Hugging Face model with `mlx_lm.convert` instead")
    n_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    cfg = {
        "model_type": arch.model_type,
        "architectures": [arch.hf_class],
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
    }
    if bos_id is not None:
        cfg["bos_token_id"] = bos_id
    head_dim = get("attention.key_length", required=False)
    if head_dim is not None or arch.needs_head_dim:
        cfg["head_dim"] = int(head_dim if head_dim is not None else hidden // n_heads)
    scaling = get("rope.scaling.type", required=False)
    if arch.model_type.startswith("deepseek"):  # MLA sizes, MoE routing, YaRN: compiler/gguf/deepseek.py
        deepseek_config(get, header, path, cfg)
    elif scaling not in (None, "none"):
        if scaling != "linear":
            raise GGUFError(f"{path}: RoPE scaling '{scaling}' is not supported by graphc's GGUF import "
                            "(none and linear are)")
        cfg["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    if arch_name == "qwen2":
        cfg["rope_traditional"] = False
    experts = int(get("expert_count", 0, required=False) or 0)
    if arch.model_type == "mixtral":
        cfg.update(num_local_experts=experts, num_experts_per_tok=int(get("expert_used_count")))
    if arch.model_type == "qwen3_moe":
        # llama.cpp's qwen3moe renormalizes the chosen experts' weights and has no dense layers
        cfg.update(num_experts=experts, num_experts_per_tok=int(get("expert_used_count")),
                   moe_intermediate_size=int(get("expert_feed_forward_length")), decoder_sparse_step=1,
                   mlp_only_layers=[], norm_topk_prob=True)
    if arch.model_type == "qwen2_moe":  # llama.cpp's qwen2moe does not renormalize the top-k weights
        cfg.update(num_experts=experts, num_experts_per_tok=int(get("expert_used_count")),
                   moe_intermediate_size=int(get("expert_feed_forward_length")),
                   shared_expert_intermediate_size=int(get("expert_shared_feed_forward_length")))
    if arch.model_type == "gemma2":
        # mlx-lm's gemma2 attends globally in every layer; llama.cpp's alternates a sliding
        # window. They agree within the window, so the context is capped at it.
        window = int(get("attention.sliding_window", 4096))
        cfg.update(attn_logit_softcapping=float(get("attn_logit_softcapping", 50.0)),
                   final_logit_softcapping=float(get("final_logit_softcapping", 30.0)),
                   query_pre_attn_scalar=int(hidden // n_heads if cfg["num_hidden_layers"] == 46 else cfg["head_dim"]),
                   max_position_embeddings=min(cfg["max_position_embeddings"], window))
    if arch.model_type == "gemma3_text":
        head_dim = cfg["head_dim"]
        # llama.cpp's gemma3: local layers use RoPE base 10000 and every 6th layer is global;
        # queries scale by 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden/heads)
        cfg.update(rope_local_base_freq=10000.0, sliding_window=int(get("attention.sliding_window", 512)),
                   sliding_window_pattern=int(get("attention.sliding_window_pattern", 6, required=False)),
                   query_pre_attn_scalar=int(hidden // n_heads if cfg["num_hidden_layers"] == 62 else head_dim))
    if arch.model_type == "phi3":
        dims = get("rope.dimension_count", required=False)
        if dims is not None:
            cfg["partial_rotary_factor"] = int(dims) / int(cfg.get("head_dim", hidden // n_heads))
    return cfg
