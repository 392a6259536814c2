"""Model shapes for the bench: real configs with random weights built in memory (no downloads).

Weights are drawn straight in the target dtype, one parameter at a time, so an 8B
model never materializes float32 temporaries (16 GB of bf16, not 32 GB of f32).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import _get_classes, dequantize_model

from graphc.compiler.gguf import resolve_model_path

_LLAMA3_ROPE = {"rope_type": "llama3", "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192}

SHAPES: dict[str, dict] = {
    # A CPU smoke shape: seconds for the whole bench.
    "tiny": dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                 rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                 max_position_embeddings=8192),
    # CPU-sized, but with a real-sized vocabulary: selection cost (sampling, grammar masks) scales with V.
    "small-32k": dict(model_type="llama", hidden_size=256, num_hidden_layers=4, intermediate_size=768,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=32, vocab_size=32000,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                      max_position_embeddings=8192),
    # meta-llama/Llama-3.2-1B config.json
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                         max_position_embeddings=131072, rope_scaling=dict(_LLAMA3_ROPE, factor=8.0)),
    # A hybrid shape for the agent replay: Qwen3-Next's layer plan (three gated-delta linear-attention
    # layers to one full-attention layer, its head counts and dims) at ~2B parameters, with a small
    # mixture of experts in place of its 512 (expert routing is not what a prefix cache changes).
    "qwen3-next-2b": dict(model_type="qwen3_next", hidden_size=2048, num_hidden_layers=24, intermediate_size=4096,
                          num_attention_heads=16, num_key_value_heads=2, head_dim=256, vocab_size=32000,
                          rms_norm_eps=1e-6, rope_theta=10000000.0, partial_rotary_factor=0.25,
                          full_attention_interval=4, linear_num_key_heads=16, linear_num_value_heads=32,
                          linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                          num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024,
                          shared_expert_intermediate_size=1024, decoder_sparse_step=1, mlp_only_layers=[],
                          norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False,
                          max_position_embeddings=65536),
}
# The same layer plan with the dense MLP in every layer: random router weights put experts within
# a last bit of each other, so on a GPU bf16 rounding alone picks other experts and the load-time
# self-check cannot tell a lowering from mlx-lm's own forward (docs/models.md). The GPU agent
# replay (benchmarks/serving/h200-replay.sh hybrid) measures the hybrid cache on this one.
SHAPES["qwen3-next-2b-dense"] = dict(SHAPES["qwen3-next-2b"], mlp_only_layers=list(range(24)))


class IdTokenizer:
    """Enough of a tokenizer for token-id prompts: the engine's detokenizer sees ids, emits nothing."""

    eos_token_ids: list = []

    class _Detok:
        text = ""

        def add_token(self, token):
            pass

        def finalize(self):
            pass

        def reset(self):
            pass

    @property
    def detokenizer(self):
        return self._Detok()

    def encode(self, text):
        raise ValueError("random-weight bench shapes take token-id prompts only")

    def decode(self, ids):
        return ""


def _std(name: str, shape: tuple, cfg: dict) -> float | None:
    if len(shape) == 1:
        return None  # norm scale: ones
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        return 3.0 / math.sqrt(cfg["hidden_size"])  # a few units of logit spread
    return 1.0 / math.sqrt(shape[-1])


def random_model(cfg: dict, dtype=mx.bfloat16, seed: int = 0):
    """mlx-lm's model for `cfg` with random `dtype` weights, evaluated parameter by parameter."""
    model_class, args_class = _get_classes(config=cfg)
    model = model_class(args_class.from_dict(cfg))  # its own init stays lazy: never evaluated
    params = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    new = []
    for i, (name, p) in enumerate(params):
        std = _std(name, p.shape, cfg)
        if std is None:
            w = mx.ones(p.shape, dtype=dtype)
        else:
            w = mx.random.normal(p.shape, dtype=dtype, key=keys[i]) * mx.array(std, dtype)
        mx.eval(w)
        new.append((name, w))
    model.update(tree_unflatten(new))
    model.eval()
    return model


def weight_bytes(model) -> int:
    return sum(p.nbytes for _, p in tree_flatten(model.parameters()))


def load_shape(name_or_dir: str, dtype: str = "bfloat16", seed: int = 0, dequantize: bool = False):
    """(model, tokenizer, config, label) for a shape name or a model folder. `dequantize`: a
    quantized folder (or .gguf) is measured with its weights dequantized to `dtype` — the same
    weights unquantized, e.g. a bf16 stand-in for a trained model that is at hand only quantized."""
    if name_or_dir in SHAPES:
        if dequantize:
            raise SystemExit(f"graphc bench: --dequantize: the shape '{name_or_dir}' has random unquantized weights; "
                             "give a quantized model folder or .gguf")
        cfg = dict(SHAPES[name_or_dir])
        model = random_model(cfg, getattr(mx, dtype), seed)
        return model, IdTokenizer(), cfg, name_or_dir

    path = resolve_model_path(name_or_dir)
    if not (path / "config.json").exists():
        known = ", ".join(SHAPES)
        raise SystemExit(f"graphc bench: '{name_or_dir}' is neither a shape ({known}) nor a model folder")

    model, tokenizer = mlx_lm.load(str(path))
    config = json.loads((path / "config.json").read_text())
    if not dequantize:
        return model, tokenizer, config, path.name

    if "quantization" not in config:
        raise SystemExit(f"graphc bench: --dequantize: '{name_or_dir}' is not quantized "
                         "(no `quantization` in its config)")
    model = dequantize_model(model)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    return model, tokenizer, config, f"{path.name} (dequantized to {dtype})"
