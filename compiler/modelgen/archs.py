"""config.json builders for the architectures make-model supports.

Each builder returns the HF-style config for a tiny model of that family,
with every field its mlx-lm ``ModelArgs`` needs, and defaults chosen so each
family's distinguishing features are present (sliding windows, sinks, MoE,
linear attention) while a CPU forward stays fast.
"""

from __future__ import annotations

from typing import Any, Callable

from .tokenizer import special_token_ids, ENDOFTEXT, IM_END

DEFAULT_VOCAB = 1024


class Dims:
    """The size knobs common to every arch; ``None`` means the arch's default."""

    FIELDS = (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "sliding_window",
    )

    def __init__(self, **kw):
        for f in self.FIELDS:
            setattr(self, f, kw.get(f))

    def pick(self, name: str, default):
        v = getattr(self, name)
        return default if v is None else v


def _common(d: Dims, *, hidden, layers, heads, kv_heads, inter) -> dict[str, Any]:
    ids = special_token_ids()
    hidden = d.pick("hidden_size", hidden)
    heads = d.pick("num_heads", heads)
    head_dim = d.pick("head_dim", None) or hidden // heads
    cfg = {
        "hidden_size": hidden,
        "num_hidden_layers": d.pick("num_layers", layers),
        "num_attention_heads": heads,
        "num_key_value_heads": d.pick("num_kv_heads", kv_heads),
        "head_dim": head_dim,
        "intermediate_size": d.pick("intermediate_size", inter),
        "vocab_size": d.pick("vocab_size", DEFAULT_VOCAB),
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "bos_token_id": ids[ENDOFTEXT],
        # Both stop generation: <|im_end|> ends a chat turn, <|endoftext|> a document.
        "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
        "pad_token_id": ids[ENDOFTEXT],
    }
    if heads % cfg["num_key_value_heads"]:
        raise ValueError(
            f"num_heads ({heads}) must be a multiple of num_kv_heads "
            f"({cfg['num_key_value_heads']})"
        )
    return cfg


def _alternating(n: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


def llama(d: Dims) -> dict[str, Any]:
    cfg = _common(d, hidden=64, layers=2, heads=4, kv_heads=2, inter=128)
    cfg.update(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
    )
    if d.sliding_window is not None:
        # mlx-lm's llama honours layer_types; alternate so both kinds exist.
        cfg["sliding_window"] = d.sliding_window
        cfg["layer_types"] = _alternating(cfg["num_hidden_layers"])
    return cfg


def qwen3(d: Dims) -> dict[str, Any]:
    _no_window("qwen3", d)
    cfg = _common(d, hidden=64, layers=2, heads=4, kv_heads=2, inter=128)
    cfg.update(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        attention_bias=False,
    )
    return cfg


def gpt_oss(d: Dims) -> dict[str, Any]:
    cfg = _common(d, hidden=64, layers=4, heads=4, kv_heads=2, inter=64)
    n = cfg["num_hidden_layers"]
    if n < 2:
        raise ValueError("gpt_oss needs at least 2 layers (one sliding, one full)")
    cfg.update(
        model_type="gpt_oss",
        architectures=["GptOssForCausalLM"],
        rope_theta=150000.0,
        rope_scaling=None,
        sliding_window=d.pick("sliding_window", 8),
        layer_types=_alternating(n),
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_per_token=2,
        tie_word_embeddings=False,
        attention_bias=True,
    )
    return cfg


def gemma3_text(d: Dims) -> dict[str, Any]:
    cfg = _common(d, hidden=64, layers=4, heads=4, kv_heads=1, inter=128)
    pattern = 2
    n = cfg["num_hidden_layers"]
    if n < pattern or n % pattern:
        raise ValueError(
            f"gemma3_text needs num_layers a multiple of sliding_window_pattern "
            f"({pattern}), got {n}"
        )
    cfg.update(
        model_type="gemma3_text",
        architectures=["Gemma3ForCausalLM"],
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        query_pre_attn_scalar=cfg["head_dim"],
        sliding_window=d.pick("sliding_window", 8),
        sliding_window_pattern=pattern,
        # Informational (mlx-lm derives it from the pattern); matches HF configs.
        layer_types=[
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n)
        ],
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
    )
    return cfg


def qwen3_next(d: Dims) -> dict[str, Any]:
    _no_window("qwen3_next", d)
    cfg = _common(d, hidden=64, layers=4, heads=4, kv_heads=2, inter=128)
    head_dim = cfg["head_dim"]
    cfg.update(
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        full_attention_interval=2,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=cfg["intermediate_size"] // 2,
        moe_intermediate_size=cfg["intermediate_size"] // 4,
        mlp_only_layers=[],
        norm_topk_prob=True,
        tie_word_embeddings=False,
        attention_bias=False,
    )
    if cfg["num_hidden_layers"] < 2:
        raise ValueError("qwen3_next needs at least 2 layers (linear + full attention)")
    return cfg


def _no_window(arch: str, d: Dims) -> None:
    if d.sliding_window is not None:
        raise ValueError(
            f"{arch} has no sliding-window layers; --sliding-window applies to "
            f"llama, gpt_oss and gemma3_text"
        )


BUILDERS: dict[str, Callable[[Dims], dict[str, Any]]] = {
    "llama": llama,
    "qwen3": qwen3,
    "gpt_oss": gpt_oss,
    "gemma3_text": gemma3_text,
    "qwen3_next": qwen3_next,
}
ARCHS: tuple[str, ...] = tuple(BUILDERS)


def build_config(arch: str, dims: Dims, overrides: dict[str, Any]) -> dict[str, Any]:
    if arch not in BUILDERS:
        raise ValueError(
            f"unknown arch {arch!r}; supported: {', '.join(ARCHS)}"
        )
    cfg = BUILDERS[arch](dims)
    cfg.update(overrides)
    return cfg
