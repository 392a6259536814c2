"""Ops: the registry (registry.py) and the built-in ops, each registered by its own module.

    forward.py    embed, attention, logits (wrapping the forward binding chose)
    head.py       logit_edits, sample, logprobs, prompt_logprobs
    embedding.py  pool, normalize (graphs/embed.yaml)
    scoring.py    score (graphs/score.yaml)
    speculative.py verify (speculative decoding's verification step)

A plugin registers more with `register_op` (docs/graph-format.md, "Writing an op").
"""

from . import embedding, forward, head, scoring, speculative  # noqa: F401  (importing registers the built-ins)
from .head import EDIT_KINDS, HOST_EDITS, PromptLogprobs, PromptTargets
from .registry import (
    BATCH_KINDS,
    EMBEDDINGS,
    HIDDEN,
    LOGITS,
    LOGPROBS,
    OPS,
    PHASES,
    PROMPT_LOGPROBS,
    TOKEN_SCORES,
    TOKENS,
    BoundNode,
    OpDef,
    Param,
    get_op,
    last_position,
    register_op,
)
from .scoring import TokenScores
from .speculative import VERIFY, VerifyOutput

# Every step graph embeds and runs the decoder stack; what it does after that is its own.
REQUIRED_OPS = ("embed", "attention")

# Output names the runtime reads, and the value type each must carry. Other names are
# allowed: StepOutputs.values holds every graph output under its own name.
RUNTIME_OUTPUTS = {
    "next_tokens": TOKENS,
    "logprobs": LOGPROBS,
    "prompt_logprobs": PROMPT_LOGPROBS,
    "embeddings": EMBEDDINGS,
    "scores": TOKEN_SCORES,
    "verify": VERIFY,
}
# A graph needs at least one of these: it generates, embeds or scores.
PRIMARY_OUTPUTS = ("next_tokens", "embeddings", "scores")

__all__ = [
    "BATCH_KINDS", "EDIT_KINDS", "EMBEDDINGS", "HIDDEN", "HOST_EDITS", "LOGITS", "LOGPROBS", "OPS", "PHASES",
    "PRIMARY_OUTPUTS", "PROMPT_LOGPROBS", "REQUIRED_OPS", "RUNTIME_OUTPUTS", "TOKEN_SCORES", "TOKENS",
    "BoundNode", "OpDef", "Param", "PromptLogprobs", "PromptTargets", "TokenScores", "VERIFY", "VerifyOutput", "get_op", "last_position",
    "register_op",
]
