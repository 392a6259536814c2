"""Build a tiny random-weight model folder for any mlx-lm model type (config from tiny_configs.py).

The folder is what a user's model folder looks like: config.json, model.safetensors and a
tokenizer (graphc make-model's BPE), so both graphc and the reference read it through
``mlx_lm.load`` — sanitize(), remapping of wrapper types and all.

Weights: mlx-lm's own module initialisers (seeded), so exotic parameters (SSM decay, RWKV
mixing coefficients, conv kernels) keep the values their authors chose, then adjusted so a
random model's greedy output depends on the prompt instead of repeating one token:

- Linear weights are scaled up and embeddings down (gains below; per-type overrides in
  tiny_configs.INIT_GAINS), so layers, not the input token, decide the next token.
- Parameters that are all ones (norm scales) get +-10% jitter and all-zero ones (biases,
  router corrections, gemma-style ``1 + w`` norms) small noise, so they are not inert.

Only numpy's PCG64 and mlx's seeded generator are used: the same seed gives the same
weights on any machine.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from tiny_configs import CONFIGS, INIT_GAINS, VOCAB

# Linear weights: std LINEAR_GAIN / sqrt(fan_in), so each layer's output outweighs the token's own
# embedding in the residual stream (a tied head would otherwise echo the input token). Embeddings:
# EMBEDDING_GAIN x mlx's N(0, 1/dims) (models like gemma scale them up by sqrt(hidden) again).
# Output heads (out features == vocab): HEAD_GAIN more, so untied logits spread by a few units.
LINEAR_GAIN = 2.0
EMBEDDING_GAIN = 0.3
HEAD_GAIN = 3.0


def config_for(model_type: str) -> dict:
    """The config.json dict of ``model_type``'s tiny model."""
    if model_type not in CONFIGS:
        raise KeyError(f"no tiny config for mlx-lm model type {model_type!r}: add one to tests/conformance/tiny_configs.py")
    cfg = copy.deepcopy(CONFIGS[model_type])
    cfg.setdefault("model_type", model_type)
    cfg.setdefault("torch_dtype", "float32")
    return cfg


def _vocab_of(cfg: dict) -> int:
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size") or VOCAB)


def _module_kinds(model) -> dict[str, str]:
    """Parameter name -> 'linear' | 'embedding' | 'other', from the module that owns it."""
    kinds = {}
    for prefix, mod in model.named_modules():
        if isinstance(mod, nn.Embedding):
            kind = "embedding"
        elif isinstance(mod, nn.Linear) or type(mod).__name__ in ("SwitchLinear", "QuantizedSwitchLinear"):
            kind = "linear"
        else:
            continue
        for name, _ in tree_flatten(mod.parameters()):
            if name.endswith("weight"):
                kinds[f"{prefix}.{name}" if prefix else name] = kind
    return kinds


def random_weights(cfg: dict, seed: int = 0) -> dict[str, mx.array]:
    """Name -> float32 array for a fresh ``cfg`` model, deterministic in ``seed``."""
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config=cfg)
    model = model_class(args_class.from_dict(cfg))
    kinds = _module_kinds(model)
    gains = INIT_GAINS.get(cfg["model_type"], {})
    lin = LINEAR_GAIN * gains.get("linear", 1.0)
    emb = EMBEDDING_GAIN * gains.get("embedding", 1.0)
    vocab = _vocab_of(cfg)
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name, p in sorted(tree_flatten(model.parameters())):
        a = np.array(p.astype(mx.float32))
        kind = kinds.get(name, "other")
        if kind == "linear":
            a = a * math.sqrt(3.0) * lin  # mlx's U(+-1/sqrt(fan_in)) has std 1/sqrt(3 fan_in)
            if a.shape[-2] == vocab:
                a = a * HEAD_GAIN
        elif kind == "embedding":
            a = a * emb
        elif a.size and np.all(a == 1.0):
            a = a + 0.1 * rng.standard_normal(a.shape)
        elif a.size and np.all(a == 0.0):
            a = a + 0.02 * rng.standard_normal(a.shape)
        out[name] = mx.array(a.astype(np.float32))
    return out


def build_model_folder(model_type: str, out: str | Path, seed: int = 0) -> Path:
    """Write ``model_type``'s tiny model to ``out`` (config.json, model.safetensors, tokenizer)."""
    from graphc.compiler.modelgen.tokenizer import write_tokenizer

    cfg = config_for(model_type)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, _vocab_of(cfg))
    weights = random_weights(cfg, seed)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out
