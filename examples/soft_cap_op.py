"""An op authored outside graphc: a logit soft-cap, `cap * tanh(logits / cap)`.

Gemma 2 and Grok cap their final logits this way; here it is a node any step graph can
insert between its logits and its edits/sampling, with the cap as a param:

    plugins: [soft_cap_op.py]
    nodes:
      - {id: capped, op: soft_cap, inputs: [logits], params: {cap: 30.0}}

The registration is the op's whole contract: it reads and produces `logits` (so the
validator accepts it exactly where logits flow), takes one float param (validated, shown
by `graphc inspect`), and runs in the `final` phase — on a prompt's last chunk and every
decode step, before host edits such as grammar masks. See docs/graph-format.md.
"""

from __future__ import annotations

import mlx.core as mx

from graphc.compiler.ops import LOGITS, Param, register_op


def _positive(v):
    return None if v > 0 else f"must be > 0, got {v!r}"


@register_op(
    "soft_cap",
    inputs=(LOGITS,),
    output=LOGITS,
    phase="final",
    params={"cap": Param(float, 30.0, check=_positive, doc="logits are squashed into (-cap, cap)")},
    describe=lambda node, binding, kind: f"cap * tanh(logits / cap), cap = {node.params['cap']}",
)
def soft_cap(ctx, node, logits):
    """cap * tanh(logits / cap): monotone, so greedy picks do not change; sampling flattens."""
    cap = node.params["cap"]
    return cap * mx.tanh(logits.astype(mx.float32) / cap)
