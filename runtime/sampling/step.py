"""One step's selection subgraph: the graph nodes ``logit_edits``, ``sample``
and ``logprobs`` composed in their documented order.

    penalties -> bias / bans / min_tokens / grammar -> [host processors]
      -> logprobs distribution (÷T, T=0 -> 1) -> ÷T, filters -> Gumbel-max

``advance`` gives the next step's per-row arrays from this step's lazy tokens,
which is all chained decode needs from the sampler.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import mlx.core as mx

from .edits import apply_edits, apply_logits_processors
from .logprobs import LogprobsOutput, token_logprobs
from .penalties import penalize, update_token_counts
from .select import select_tokens
from .tensors import SamplingTensors


@attrs.frozen(eq=False)
class StepOutput:
    """tokens int32 [B]; logprobs (None unless a row asked); logits: the edited
    logits selection saw ([B, V], float32 when anything edited them)."""

    tokens: mx.array
    logprobs: LogprobsOutput | None
    logits: mx.array


def edit_logits(
    logits: mx.array,
    st: SamplingTensors,
    *,
    counts: mx.array | None = None,
    n_generated: mx.array | None = None,
    token_bitmask: mx.array | None = None,
    additive_mask: mx.array | None = None,
    histories: Sequence[Sequence[int]] | None = None,
) -> mx.array:
    """The ``logit_edits`` node: penalties, then additive edits, then (host
    only, not chain-safe) per-row Python processors, which need ``histories``."""
    x = penalize(logits, st, counts)
    x = apply_edits(x, st, n_generated=n_generated, token_bitmask=token_bitmask, additive_mask=additive_mask)
    if not st.chain_safe:
        if histories is None:
            raise ValueError("this batch has host logits processors: pass each row's token histories")
        x = apply_logits_processors(x, st.logits_processors, histories)
    return x


def sample_step(
    logits: mx.array,
    st: SamplingTensors,
    *,
    positions: mx.array | None = None,
    n_generated: mx.array | None = None,
    counts: mx.array | None = None,
    key: mx.array | None = None,
    token_bitmask: mx.array | None = None,
    additive_mask: mx.array | None = None,
    histories: Sequence[Sequence[int]] | None = None,
) -> StepOutput:
    """Edits + selection + logprobs for one step; everything lazy.

    logits       [B, V] last-position logits of each row
    positions    int32 [B] sequence index of the token being chosen (noise key)
    n_generated  int32 [B] tokens generated so far (min_tokens)
    counts       int32 [B, V] penalty counts (when st.has_penalties)
    key          mx.random key for unseeded rows
    """
    x = edit_logits(
        logits,
        st,
        counts=counts,
        n_generated=n_generated,
        token_bitmask=token_bitmask,
        additive_mask=additive_mask,
        histories=histories,
    )
    tokens = select_tokens(x, st, positions, key)
    lp = token_logprobs(x, st, tokens) if st.want_logprobs else None
    return StepOutput(tokens=tokens, logprobs=lp, logits=x)


def advance(
    st: SamplingTensors,
    tokens: mx.array,
    *,
    positions: mx.array | None = None,
    n_generated: mx.array | None = None,
    counts: mx.array | None = None,
) -> tuple[mx.array | None, mx.array | None, mx.array | None]:
    """Next step's (positions, n_generated, counts) from this step's lazy tokens."""
    if positions is not None:
        positions = positions + 1
    if n_generated is not None:
        n_generated = n_generated + 1
    if counts is not None and st.has_penalties:
        counts = update_token_counts(counts, tokens)
    return positions, n_generated, counts
