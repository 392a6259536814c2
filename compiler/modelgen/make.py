"""make_model: write a tiny random-weight model folder that mlx_lm.load reads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .archs import ARCHS, Dims, build_config
from .tokenizer import CHAT_TEMPLATES, write_tokenizer
from .weights import random_weights, save_weights


def make_config(
    arch: str,
    *,
    hidden_size=None,
    num_layers=None,
    num_heads=None,
    num_kv_heads=None,
    head_dim=None,
    intermediate_size=None,
    vocab_size=None,
    sliding_window=None,
    dtype: str = "float32",
    **overrides: Any,
) -> dict[str, Any]:
    """The config.json dict make_model would write (no files touched)."""
    dims = Dims(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        sliding_window=sliding_window,
    )
    cfg = build_config(arch, dims, overrides)
    cfg["torch_dtype"] = dtype
    return dict(sorted(cfg.items()))


def make_model(
    arch: str,
    out: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_size=None,
    num_layers=None,
    num_heads=None,
    num_kv_heads=None,
    head_dim=None,
    intermediate_size=None,
    vocab_size=None,
    sliding_window=None,
    dtype: str = "float32",
    chat_template: str = "chatml",
    **overrides: Any,
) -> Path:
    """Write a random-weight ``arch`` model folder to ``out`` and return its path.

    The folder holds config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json (ChatML template) and special_tokens_map.json.
    Weights are deterministic in ``seed``. Extra keyword arguments override
    config.json fields (e.g. ``num_local_experts=8``).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; supported: {', '.join(ARCHS)}")
    cfg = make_config(
        arch,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        sliding_window=sliding_window,
        dtype=dtype,
        **overrides,
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # Tokenizer first: an invalid vocab size fails before the weights are built.
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {chat_template!r}; choose from {', '.join(CHAT_TEMPLATES)}")
    write_tokenizer(out, cfg["vocab_size"], chat_template)
    save_weights(random_weights(cfg, seed, dtype), out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out
