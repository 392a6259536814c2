"""Which GGUF architectures graphc imports, and how their metadata becomes an mlx-lm config.json.

llama.cpp names tensors and metadata keys its own way (`blk.N.attn_q`, `llama.block_count`);
mlx-lm's model classes take Hugging Face names. Each supported architecture is one entry:
the mlx-lm model_type, whether llama.cpp permuted the q/k rows for its interleaved RoPE
(its Hugging Face converter does that for the Llama family only), and the config keys.
"""

from __future__ import annotations

import attrs

from .reader import GGUFError, GGUFHeader


@attrs.frozen
class Arch:
    model_type: str  # mlx-lm's models/<model_type>.py
    permuted_qk: bool  # llama.cpp stored q/k rows permuted for its interleaved ("normal") RoPE
    needs_head_dim: bool = False  # the mlx-lm class takes head_dim explicitly


ARCHS = {
    "llama": Arch("llama", permuted_qk=True),
    # Mistral 7B files say "llama"; a few converters say "mistral": same layout and permutation.
    "mistral": Arch("llama", permuted_qk=True),
    "qwen2": Arch("qwen2", permuted_qk=False),
    "qwen3": Arch("qwen3", permuted_qk=False, needs_head_dim=True),
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
        raise GGUFError(f"{path}: architecture '{name}' is not supported by graphc's GGUF import "
                        f"(supported: {', '.join(sorted(ARCHS))}); convert the original Hugging Face "
                        "model with `mlx_lm.convert` instead")
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

    if any(t.name == "rope_freqs.weight" for t in header.tensors):
        raise GGUFError(f"{path}: this file carries per-dimension RoPE factors (rope_freqs, Llama 3.1+ "
                        "long-context scaling), which graphc's GGUF import does not map yet; convert the "
                        "Hugging Face model with `mlx_lm.convert` instead")
    n_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    cfg = {
        "model_type": arch.model_type,
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM"}[arch.model_type]],
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
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise GGUFError(f"{path}: RoPE scaling '{scaling}' is not supported by graphc's GGUF import "
                            "(none and linear are)")
        cfg["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    if arch_name == "qwen2":
        cfg["rope_traditional"] = False
    return cfg
