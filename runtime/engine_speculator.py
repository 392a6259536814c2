"""The Engine's speculator, built from its EngineConfig and the decode plan's `speculative arm`."""

from __future__ import annotations

import logging

from .config import EngineConfig
from .speculative import DraftModel, Speculator, parse_speculative, rollback_problem


def speculator_for(c: EngineConfig, compiled, *, views, stats: dict, eos_token_ids, tokenizer,
                   vocab_size: int) -> Speculator:
    """The engine's Speculator (runtime/speculative/): speculative decoding for rows that ask, or
    for every plain greedy row when `speculative` sets a default (a draft model makes
    "draft_model" the default). Off for models whose caches cannot roll back (logged when a
    default asked for it). Built from values the Engine hands over before it builds the runner
    (which is given the result): the CompiledGraph whose decode step verifies, the eager steps'
    KernelViews, the engine's stats dict (the speculator adds its counters), the
    end-of-sequence ids, and the tokenizer and vocabulary a draft model folder is loaded against."""
    speculative, draft_model = c.speculative, c.draft_model
    pipeline, adaptive = c.spec_pipeline, c.spec_adaptive
    if draft_model is not None and speculative is None:
        speculative = "draft_model"
    default = parse_speculative(speculative, c.num_draft_tokens)
    # The plan's "speculative arm" choice: measured among its arms, or one fixed arm (compiler/passes/).
    arm = compiled.plan("decode").choice("speculative arm")
    if arm.measured:
        pipeline, adaptive = "pipelined" in arm.arms, True
    elif arm.choice in ("verify", "pipelined"):
        pipeline, adaptive = arm.choice == "pipelined", False
    if draft_model is not None and not isinstance(draft_model, DraftModel):  # a folder or .gguf path
        draft_model = DraftModel.load(draft_model, tokenizer, vocab_size)
    spec = Speculator(compiled.decode, default=None if default == "off" else default,
                      max_batch=c.spec_max_batch, max_tokens=c.spec_max_tokens,
                      problem=rollback_problem(compiled.binding), stats=stats, pipeline=pipeline,
                      adaptive=adaptive, views=views, eos_token_ids=eos_token_ids, draft_model=draft_model)
    if default not in (None, "off") and spec.problem:
        logging.getLogger("graphc.engine").warning("speculative=%r is off for this model: %s", speculative,
                                                   spec.problem)
    return spec


__all__ = ["speculator_for"]
