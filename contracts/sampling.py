"""The sampling functions the head ops lower to (compiler/ops/head.py), as a contract.

The head ops (`logit_edits`, `sample`, `logprobs`, `prompt_logprobs`) are declared by the
compiler; the math they run is the runtime's sampling package (runtime/sampling/: pure,
lazy mx functions over the batch's SamplingTensors `st`). The compiler reaches it through
`kernels()`, which returns the module the `graphc.sampling` entry point `kernels` names
(pyproject.toml; contracts/providers.py says why) with at least these names:

    penalize(logits, st, counts) -> logits                     repetition / frequency / presence
    apply_edits(logits, st, *, n_generated) -> logits          logit bias, banned tokens, min_tokens
    apply_additive_mask(logits, mask [B, V]) -> logits         host rows (grammar masks, processors)
    select_tokens(logits, st, positions, key) -> int32 [B]     greedy / temperature / top-k / top-p / min-p
    logprobs_of(logits, inv_temperature, tokens, *, top, token_ids=None)
                                                               -> .chosen / .top_ids / .top_logprobs / .requested
    CANDIDATE_MAX                                              largest top_k served by the [B, K] candidate set

`st` and the per-row arrays come from StepInputs.sampling (contracts/step.py), built by the
same runtime, so the compiler never needs their classes.
"""

from __future__ import annotations

from types import ModuleType

from .providers import provider

FUNCTIONS = ("penalize", "apply_edits", "apply_additive_mask", "select_tokens", "logprobs_of", "CANDIDATE_MAX")


def kernels() -> ModuleType:
    """The module providing FUNCTIONS (imported on first use)."""
    return provider("graphc.sampling", "kernels", "sampling for the head ops (" + ", ".join(FUNCTIONS) + ")")
