"""Engine.load: a model folder or .gguf file to an engine (whole, or sharded under mlx.launch).

Apart from engine.py because loading is about files and weights, not the step loop: the folder
check, mlx-lm's load with a useful error, the CPU weights choice (cpu_weights.py) that changes
the model before any engine sees it, and the distributed path (distributed/load.py)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import mlx_lm

from graphc.compiler.adapters import check_adapter_folder
from graphc.compiler.errors import UnsupportedModel
from graphc.compiler.gguf import resolve_model_path
from graphc.compiler.modelgen import demo_model_path

from .cpu_weights import check_mode, convert
from .distributed import load_sharded
from .tokenizer_setup import quiet_length_warning

log = logging.getLogger("graphc.load")


def load_engine(cls, model_dir: str | Path | None, graph, *, distributed: bool, cpu_weights: str | None, **kwargs):
    """What `cls.load` (Engine.load) documents."""
    if cpu_weights is not None:
        check_mode(cpu_weights)
    if distributed and kwargs.get("adapter_path") is not None:
        raise ValueError("adapter_path applies a LoRA adapter to a model loaded whole; a distributed load shards "
                         "the weights as stored (fuse the adapter into the model first: mlx_lm.fuse)")
    if distributed:  # the distributed load checks and compares the options as keywords
        if cpu_weights == "float32":  # a sharded model runs as stored (cpu_weights.py)
            raise ValueError("cpu_weights='float32' converts a model loaded whole; a distributed load "
                             "shards the weights as stored")
        base = kwargs.pop("engine_config", None)
        return load_sharded(model_dir, graph, engine_cls=cls, **{**(base.changed() if base else {}), **kwargs})
    if model_dir is None:
        model_dir = demo_model_path()
    path = resolve_model_path(model_dir)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"no model folder at '{model_dir}' (expected a config.json there); "
            "graphc never downloads weights — build a test model with `graphc make-model`"
        )
    config = json.loads((path / "config.json").read_text())
    adapter = kwargs.get("adapter_path")
    if adapter is not None:
        check_adapter_folder(adapter)
    t0 = time.perf_counter()
    try:
        model, tokenizer = mlx_lm.load(str(path), **({"adapter_path": str(adapter)} if adapter is not None else {}))
    except Exception as e:  # noqa: BLE001 - whatever mlx-lm (or transformers under it) raises
        what = f"'{path}' with the adapter '{adapter}'" if adapter is not None else f"'{path}'"
        raise UnsupportedModel(
            f"model type '{config.get('model_type', '?')}': mlx_lm.load could not load {what}: "
            f"{type(e).__name__}: {e}. graphc loads models through mlx-lm; fix the folder (config.json, "
            "tokenizer files, an adapter's layer names) so that mlx_lm.load reads it") from e
    log.info("loaded weights and tokenizer from %s%s: %.1f s", path,
             f" with the LoRA adapter {adapter}" if adapter is not None else "", time.perf_counter() - t0)
    quiet_length_warning(tokenizer)
    weights = convert(model, cpu_weights)
    # model_path is what the user named (a .gguf file stays a .gguf file in names and logs).
    engine = cls(model, tokenizer, config, graph, model_path=str(model_dir), **kwargs)
    engine.weights = weights
    return engine
