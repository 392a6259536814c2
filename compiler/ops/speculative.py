"""The `verify` op: speculative decoding's verification step, declared in the graph.

A verify batch feeds each row its last accepted token plus up to k draft tokens (rows
right-padded to a common L = k + 1; `StepInputs.options["draft_lengths"]` says how many of
each row's tokens are drafts). One forward writes all L positions to the caches; this op
takes the target's greedy token at every position and counts, per row, the longest prefix
of drafts the target agrees with. Row i then emits targets[i, :accepted[i] + 1] — the
accepted drafts plus the target's own next token, so every step yields at least one token —
and the runtime trims the rejected positions from its caches (runtime/speculative/).

The op reads the decoder's hidden states, not a `logits` node: the head over every position
is built only for a verify batch (`on_request`), so ordinary decode steps (and the compiled
decode path) never carry it.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.contracts.policies import rollback_problem

from .registry import HIDDEN, TOKENS, register_op

VERIFY = "verify"  # VerifyOutput


@attrs.frozen(eq=False)
class VerifyOutput:
    """Lazy verification result: targets int32 [B, L] (greedy token after each position),
    accepted int32 [B] (drafts the target agreed with, a prefix of each row's drafts)."""

    targets: mx.array
    accepted: mx.array

    def arrays(self) -> list:
        return [self.targets, self.accepted]


def _describe_verify(node, binding, kind):
    why = rollback_problem(binding)
    head = "every position's logits" + (" (the model's own forward)" if binding.lowering != "fast"
                                        else " (norm + lm_head on all L positions)")
    base = (f"speculative verification: last token + k drafts per row, {head}, greedy target per position, "
            "accepted = longest agreeing draft prefix")
    return base + (f"; OFF for this model: {why}" if why else "; rejected positions trimmed per row")


@register_op("verify", inputs=(HIDDEN, TOKENS), output=VERIFY, phase="final", kinds=("decode",), on_request=True,
             describe=_describe_verify,
             doc="speculative decoding: greedy target at every position and the accepted draft prefix per row")
def verify(ctx, node, h, tokens):
    opts = ctx.inputs.options or {}
    lengths = opts.get("draft_lengths")
    if lengths is None:  # an ordinary decode step: nothing to verify
        return None
    if ctx.binding.lowering != "fast":
        logits = h  # the model's own forward returned every position's logits (all_positions=True)
    else:
        adapter = ctx.binding.adapter
        logits = adapter.head(adapter.norm(h))
    targets = mx.argmax(logits.astype(mx.float32), axis=-1).astype(mx.int32)  # [B, L]
    L = tokens.shape[1]
    if L == 1:
        return VerifyOutput(targets, mx.zeros((tokens.shape[0],), dtype=mx.int32))
    # An array when the verify forward is traced (runtime/compiled_decode.py): a list would be
    # baked into the trace as a constant.
    n = (lengths if isinstance(lengths, mx.array) else mx.array(lengths, dtype=mx.int32))[:, None]
    agree = (targets[:, :-1] == tokens[:, 1:]) & (mx.arange(L - 1)[None] < n)
    accepted = mx.cumprod(agree.astype(mx.int32), axis=1).sum(axis=1).astype(mx.int32)
    return VerifyOutput(targets, accepted)
