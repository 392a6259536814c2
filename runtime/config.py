"""EngineConfig: every option an Engine takes, as one frozen value.

    from graphc.runtime import Engine, EngineConfig
    engine = Engine.load("path/to/model", max_batch=16)            # keywords build an EngineConfig
    engine = Engine.load("path/to/model", engine_config=EngineConfig(max_batch=16))
    engine.engine_config.max_batch                                  # -> 16

One field per option, one line each, so an option added by a feature is a one-line change
here (and its reader in the engine). `EngineConfig.from_kwargs` is what `Engine(...)` and
`Engine.load(...)` call: an unknown keyword is a TypeError naming it (and the nearest known
name), a bad value a ValueError naming the option.
"""

from __future__ import annotations

import difflib

import attrs

from graphc.compiler.passes.prefill_choices import FINAL_CHUNK_REQUESTS, LINEAR_PREFILL_REQUESTS, PREFILL_LANES

from .cache.disk_choice import MODES as DISK_READ_MODES
from .cache.disk_tier import DEFAULT_BLOCK_TOKENS
from .scheduler import STEP_TOKENS

COMPILE_MODES = (None, True, False, "auto", "measured")
LOWERINGS = ("auto", "fast", "generic")  # compiler/compile.py LOWERINGS: checked there too


def _positive_int(inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


def _optional_positive_int(inst, attribute, value) -> None:
    if value is not None:
        _positive_int(inst, attribute, value)


def _step_tokens(inst, attribute, value) -> None:
    if value != "auto":
        _optional_positive_int(inst, attribute, value)


def _compile_mode(inst, attribute, value) -> None:
    if not any(value is m or (isinstance(m, str) and value == m) for m in COMPILE_MODES):
        raise ValueError(f"compile must be True, False, 'auto' or 'measured', got {value!r}")


def _lowering(inst, attribute, value) -> None:
    if value not in LOWERINGS:
        raise ValueError(f"unknown lowering '{value}' (known: {', '.join(LOWERINGS)})")


def _pad_setting(inst, attribute, value) -> None:
    if not (value is True or value is False or value == "auto"):
        raise ValueError(f"pad_final_chunk must be 'auto', True or False, got {value!r}")


def _final_chunk(inst, attribute, value) -> None:
    if value not in FINAL_CHUNK_REQUESTS:
        raise ValueError(f"final_chunk must be one of {', '.join(FINAL_CHUNK_REQUESTS)}, got {value!r}")


def _lanes(inst, attribute, value) -> None:
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value not in PREFILL_LANES):
        raise ValueError(f"prefill_lanes must be 'auto' or one of {', '.join(map(str, PREFILL_LANES))}, got {value!r}")


def _linear_prefill(inst, attribute, value) -> None:
    if value not in LINEAR_PREFILL_REQUESTS:
        raise ValueError(f"linear_prefill must be one of {', '.join(LINEAR_PREFILL_REQUESTS)}, got {value!r}")


def _disk_read(inst, attribute, value) -> None:
    if value not in DISK_READ_MODES:
        raise ValueError(f"kv_cache_disk_read must be one of {', '.join(DISK_READ_MODES)}, got {value!r}")


def _fraction(inst, attribute, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
        raise ValueError(f"mem_fraction must be a number in (0, 1], got {value!r}")


def _options_dict(value):
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"decode_options must be a dict of decode options (compiler/decode_options.py), got {value!r}")
    return dict(value) if value else None


@attrs.frozen(kw_only=True)
class EngineConfig:
    """How an Engine runs a model; the model, tokenizer and graph are given beside it."""

    # Scheduling
    prefill_chunk: int = attrs.field(default=2048, validator=_positive_int)  # prompt tokens per prefill forward
    max_batch: int = attrs.field(default=64, validator=_positive_int)  # rows in one decode batch
    chain: bool = True  # queue decode step N+1 on step N's lazy tokens
    batch_prefill: bool = True  # whole short prompts share one left-padded prefill forward
    kv_budget_tokens: int | None = attrs.field(default=None, validator=_optional_positive_int)  # None: unbounded
    # Tokens one step computes, prefill chunks and decode rows together (runtime/scheduler.py); None: no budget
    step_tokens: int | str | None = attrs.field(default=STEP_TOKENS, validator=_step_tokens)  # "auto": measured
    # A prompt's last chunk padded to a multiple of 128 tokens, exact layers only (runtime/chunk_pad.py); "auto": CUDA
    pad_final_chunk: bool | str = attrs.field(default="auto", validator=_pad_setting)
    # A prompt's last chunk as one forward or as L-1 positions then the last (compiler/passes/prefill_choices.py)
    final_chunk: str = attrs.field(default="auto", validator=_final_chunk)  # "auto": the target decides
    # Batched prefill forwards at once, on CPU streams (compiler/passes/prefill_choices.py); "auto": measured
    prefill_lanes: int | str = attrs.field(default="auto", validator=_lanes)
    # Gated-delta layers' prompt chunks: "chunked" or mlx-lm's own recurrence (compiler/passes/prefill_choices.py)
    linear_prefill: str = attrs.field(default="auto", validator=_linear_prefill)  # "auto": chunked on cuda
    # Prefix cache
    prefix_cache: bool = True
    # With the GPU warm-up's chunk shapes: when a request ends, build the attention shapes of its
    # conversation's next turn while idle (runtime/warmup_plans.py ContinuationWarmUp); opt-in
    warm_continuations: bool = False
    mem_fraction: float | None = attrs.field(default=None, validator=_fraction)  # of device memory for the pool
    max_total_tokens: int | None = attrs.field(default=None, validator=_optional_positive_int)  # pool slots
    prefix_interval: int | None = attrs.field(default=None, validator=_optional_positive_int)  # capture boundary
    snapshot_interval: int | None = attrs.field(default=None, validator=_optional_positive_int)  # hybrid state every N tokens
    # KV cache: quantized full-attention KV (compiler/compile.py with_kv_bits; opt-in, not exact)
    kv_bits: int | None = None  # 8 or 4: checked by the compiler, which names the graph it cannot rewrite
    kv_group_size: int | None = None  # a setting of kv_bits
    # The prefix cache's disk tier (runtime/cache/disk_tier.py): on when kv_cache_dir is given
    kv_cache_dir: str | None = None
    kv_cache_disk_gb: float | None = None  # None: the tier's default size
    kv_cache_block_tokens: int = attrs.field(default=DEFAULT_BLOCK_TOKENS, validator=_positive_int)
    # A hit's blocks read from disk or computed again: "auto" (measured), "always", "never" (runtime/cache/disk_choice.py)
    kv_cache_disk_read: str = attrs.field(default="auto", validator=_disk_read)
    # Compilation (compiler/decode_options.py; None leaves what the graph's `decode:` section says)
    lowering: str = attrs.field(default="auto", validator=_lowering)  # auto | fast | generic
    compile: bool | str | None = attrs.field(default=None, validator=_compile_mode)
    skinny_gemm: bool | None = None
    decode_options: dict | None = attrs.field(default=None, converter=_options_dict, eq=False)
    # Sampling: where unseeded sampled rows' seeds come from (None: the OS)
    seed: int | None = None
    # Speculative decoding (docs/speculative.md)
    speculative: object = None
    num_draft_tokens: int | None = None
    spec_max_batch: int = attrs.field(default=16, validator=_positive_int)
    spec_max_tokens: int | None = None
    draft_model: object = attrs.field(default=None, eq=False)  # a DraftModel, or a folder / .gguf path
    spec_pipeline: bool | None = None
    spec_adaptive: bool | None = None
    # What the user named (a .gguf file stays a .gguf file in names and logs)
    model_path: str | None = None
    # The LoRA adapter folder Engine.load applied over it (mlx-lm's adapters.safetensors and
    # adapter_config.json): part of the model's identity for the disk tier and stored self-checks
    adapter_path: str | None = None

    @classmethod
    def option_names(cls) -> tuple:
        """The keywords Engine(...) / Engine.load(...) take besides model, tokenizer, config, graph."""
        return tuple(f.name for f in attrs.fields(cls))

    def changed(self) -> dict:
        """The options that differ from their defaults, as keywords (model_path and adapter_path
        aside: the loader names the folders): what `Engine.load(distributed=True, engine_config=...)` hands the
        distributed load, which checks and compares the options as keywords."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(type(self))
                if f.name not in ("model_path", "adapter_path") and getattr(self, f.name) != f.default}

    @classmethod
    def from_kwargs(cls, base: "EngineConfig | None" = None, **kwargs) -> "EngineConfig":
        """`base` (or the defaults) with `kwargs` applied; TypeError for a keyword no field has."""
        names = cls.option_names()
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            k = unknown[0]
            near = difflib.get_close_matches(k, names, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else f" (known: {', '.join(sorted(names))})"
            raise TypeError(f"Engine got an unexpected keyword argument '{k}'{hint}")
        return attrs.evolve(base, **kwargs) if base is not None else cls(**kwargs)


__all__ = ["EngineConfig"]
