"""Random weights for a config, built through mlx-lm's own model class.

Instantiating ``mlx_lm.models.<arch>.Model`` gives exactly the parameter
names and shapes ``mlx_lm.load`` expects after ``sanitize()``. We save those
names as-is (the layout ``mlx_lm.convert`` writes), which every supported
arch's ``sanitize()`` passes through unchanged:

- qwen3_next only stacks experts / shifts norms by +1 / moves the conv axis
  when it sees HF's per-expert ``experts.0.up_proj`` keys; stacked
  ``switch_mlp`` keys mean "already converted", so norms are stored as the
  actual scale (around 1.0) and conv1d in mlx's (C, K, 1) layout.
- gpt_oss only splits ``gate_up_proj`` when ``gate_proj.weight`` is absent.
- gemma3_text ties embeddings when ``lm_head.weight`` is missing, so a tied
  config simply omits it.

Values come from numpy's PCG64 in sorted-name order, so the same seed gives
bit-identical weights on any machine.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

_DTYPES = ("float32", "float16", "bfloat16")


def _init_param(name: str, shape: tuple[int, ...], cfg: dict, rng) -> np.ndarray:
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        # The final RMSNorm leaves unit-RMS rows, so logit std ~= std*sqrt(hidden):
        # 3/sqrt(hidden) gives a spread of a few units, enough that greedy
        # choices depend on the prompt.
        # (gemma3 also scales input embeddings by sqrt(hidden): RMS ~3, fine
        # behind its pre-norms.)
        std = 3.0 / math.sqrt(cfg["hidden_size"])
        return rng.normal(0.0, std, shape)
    if leaf == "sinks":
        # Non-zero so the sink term changes attention (zeros would still count,
        # but randomness makes per-head differences visible in tests).
        return rng.normal(0.0, 1.0, shape)
    if leaf == "A_log":
        return np.log(rng.uniform(1.0, 16.0, shape))
    if leaf == "dt_bias":
        return 1.0 + 0.1 * rng.normal(0.0, 1.0, shape)
    if leaf == "bias":
        return rng.normal(0.0, 0.02, shape)
    if "conv1d" in name:
        # mlx layout (C, K, 1): depthwise, fan-in is the kernel width.
        return rng.normal(0.0, 1.0 / math.sqrt(shape[1]), shape)
    if len(shape) == 1:
        # Norm scales. gemma3 applies (1 + w), everything else applies w.
        jitter = 0.1 * rng.normal(0.0, 1.0, shape)
        return jitter if cfg["model_type"] == "gemma3_text" else 1.0 + jitter
    # Linear / expert weights: (..., out, in). 1/sqrt(fan_in) keeps activations
    # near unit scale, so q.k scores spread and attention (windows, sinks) matters.
    return rng.normal(0.0, 1.0 / math.sqrt(shape[-1]), shape)


def build_model(cfg: dict[str, Any]):
    """Instantiate mlx-lm's model for ``cfg`` (the same classes mlx_lm.load uses)."""
    model_class, args_class = _get_classes(config=cfg)
    return model_class(args_class.from_dict(cfg))


def random_weights(cfg: dict[str, Any], seed: int, dtype: str = "float32") -> dict:
    """Name -> mx.array for a fresh model of ``cfg``, deterministic in ``seed``."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    model = build_model(cfg)
    params = dict(tree_flatten(model.parameters()))
    if cfg["model_type"] == "gemma3_text" and cfg.get("tie_word_embeddings", True):
        params.pop("lm_head.weight", None)
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name in sorted(params):
        shape = tuple(params[name].shape)
        value = _init_param(name, shape, cfg, rng).astype(np.float32)
        out[name] = mx.array(value).astype(getattr(mx, dtype))
    return out


def save_weights(weights: dict, out: Path) -> Path:
    path = Path(out) / "model.safetensors"
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})
    return path
