"""Token selection, penalties, logit edits and logprobs as pure lazy mx functions.

The step graph's ``logit_edits``, ``sample`` and ``logprobs`` nodes. Build a
``SamplingTensors`` once per batch composition, then per step call
``sample_step`` (or the three pieces: ``edit_logits`` -> ``select_tokens`` ->
``token_logprobs``) and ``advance``. See docs/sampling.md.

The murmur hash, the Gumbel noise and the rank-key math live in runtime/token_math/, below
this package and the kernels alike; import them from there.
"""

from graphc.contracts.providers import resolve

from .edits import (
    apply_additive_mask,
    apply_edits,
    apply_logits_processors,
    apply_token_bitmask,
)
from .logprobs import LogprobsOutput, logprobs_of, prompt_logprobs, token_logprobs
from .params import MAX_LOGPROBS, SamplingParamsLike, validate_params
from .penalties import (
    apply_penalties,
    build_token_counts,
    penalize,
    penalty_history,
    update_token_counts,
)
from .select import noise_state, select_tokens
from .step import StepOutput, advance, edit_logits, sample_step
from .tensors import CANDIDATE_MAX, RowGroup, SamplingTensors

__all__ = [
    "CANDIDATE_MAX",
    "MAX_LOGPROBS",
    "LogprobsOutput",
    "RowGroup",
    "SamplingParams",
    "SamplingParamsLike",
    "SamplingTensors",
    "StepOutput",
    "advance",
    "apply_additive_mask",
    "apply_edits",
    "apply_logits_processors",
    "apply_penalties",
    "apply_token_bitmask",
    "build_token_counts",
    "edit_logits",
    "logprobs_of",
    "noise_state",
    "penalize",
    "penalty_history",
    "prompt_logprobs",
    "sample_step",
    "select_tokens",
    "token_logprobs",
    "update_token_counts",
    "validate_params",
]


# graphc.runtime.SamplingParams, re-exported here on first use: runtime/params.py imports
# this package's rules (sampling/params.py) at load time, which runs this __init__ first.
SAMPLING_PARAMS = "graphc.runtime.params:SamplingParams"


def __getattr__(name: str):
    if name == "SamplingParams":
        return resolve(SAMPLING_PARAMS, "graphc.runtime.sampling.SamplingParams")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
