"""The op table: what each node kind consumes, produces and accepts as params.

Validation and lowering are both keyed by op name through this table, so adding
an op means adding one row here and one lowering rule in lower.py.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

# Value types that flow along graph edges.
TOKENS = "tokens"  # int32 [B, L]
HIDDEN = "hidden"  # float [B, L, D]
LOGITS = "logits"  # float32 [B, V] (or [B, L, V] with positions: all)
LOGPROBS = "logprobs"


@attrs.frozen
class Param:
    """One accepted parameter: its type, default and (optionally) allowed values."""

    type: type | tuple
    default: Any = None
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None  # returns a problem or None
    doc: str = ""


@attrs.frozen
class OpDef:
    name: str
    inputs: tuple[str, ...]  # value types, in order
    output: str
    params: dict = attrs.field(factory=dict)
    required: bool = False  # every graph must contain one
    doc: str = ""


def _max_top_n(v):
    return None if isinstance(v, int) and 0 <= v <= 20 else f"must be an integer in 0..20, got {v!r}"


EDIT_KINDS = ("penalties", "logit_bias", "banned_tokens", "min_tokens", "grammar", "processors")

OPS: dict[str, OpDef] = {
    op.name: op
    for op in [
        OpDef(
            "embed",
            inputs=(TOKENS,),
            output=HIDDEN,
            required=True,
            doc="token ids -> hidden states (the model's own embedding, with its scaling)",
        ),
        OpDef(
            "attention",
            inputs=(HIDDEN,),
            output=HIDDEN,
            required=True,
            doc="the decoder stack; each layer reads and writes the cache policy declared for its layer type",
        ),
        OpDef(
            "logits",
            inputs=(HIDDEN,),
            output=LOGITS,
            required=True,
            params={
                "positions": Param(str, "last", choices=("last", "all"), doc="which positions get logits"),
                "dtype": Param(str, "float32", choices=("float32", "model"), doc="dtype of logits"),
            },
            doc="final norm + LM head; skipped on non-final prefill chunks",
        ),
        OpDef(
            "logit_edits",
            inputs=(LOGITS,),
            output=LOGITS,
            params={
                "edits": Param((list, tuple), list(EDIT_KINDS), doc="which edit rows this graph may apply"),
            },
            doc="additive edit rows (bias, bans, min_tokens, grammar mask) and penalties, before selection",
        ),
        OpDef(
            "sample",
            inputs=(LOGITS,),
            output=TOKENS,
            required=True,
            params={
                "method": Param(str, "auto", choices=("auto", "greedy"), doc="greedy forces argmax for every row"),
            },
            doc="per-row temperature / top-k / top-p / min-p selection with Gumbel-max noise",
        ),
        OpDef(
            "logprobs",
            inputs=(LOGITS, TOKENS),
            output=LOGPROBS,
            params={
                "max_top_n": Param(int, 20, check=_max_top_n, doc="largest top-N a request may ask for"),
            },
            doc="chosen-token logprob, top-N and requested ids, from the edited distribution",
        ),
    ]
}

REQUIRED_OPS = tuple(name for name, op in OPS.items() if op.required)
