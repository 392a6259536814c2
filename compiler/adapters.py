"""LoRA adapters over a model folder: what `mlx_lm.lora` writes (adapter_config.json and
adapters.safetensors) and `mlx_lm.load(..., adapter_path=)` applies.

graphc serves an adapted model as mlx-lm's own forward runs it (its LoRA layers unfused, so
greedy output matches mlx-lm's with the same adapter). The adapter's files are part of the
model's identity wherever graphc keys something by the weights: the disk tier's block names
(runtime/cache/disk_tier.py) and the self-check's stored verdicts (selfcheck_cache.py)."""

from __future__ import annotations

from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")


def check_adapter_folder(adapter_path: str | Path) -> Path:
    """The adapter folder, or FileNotFoundError saying which of its files is missing."""
    p = Path(adapter_path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"no adapter folder at '{adapter_path}' (expected {' and '.join(ADAPTER_FILES)}, "
                                "as mlx_lm.lora writes them)")
    missing = [f for f in ADAPTER_FILES if not (p / f).is_file()]
    if missing:
        raise FileNotFoundError(f"the adapter folder '{adapter_path}' has no {' or '.join(missing)} "
                                "(mlx_lm.lora writes adapter_config.json and adapters.safetensors)")
    return p


def adapter_files(adapter_path: str | Path | None) -> list[Path]:
    """The files an adapter's identity is read from (none without an adapter)."""
    if adapter_path is None:
        return []
    p = Path(adapter_path).expanduser()
    return [p / f for f in ADAPTER_FILES if (p / f).is_file()]
