"""Scoring: the logprob of each given next token, in one forward, without sampling.

graphs/score.yaml: embed -> attention -> logits (positions: all) -> score. Position i of a
row scores the row's token at i + 1 — the loglikelihood evaluation harnesses ask for
(`Engine.score(prompt, continuation)` keeps the continuation's part).
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from .registry import LOGITS, TOKEN_SCORES, TOKENS, needs_all_positions, register_op


@attrs.frozen(eq=False)
class TokenScores:
    """Lazy [B, L - 1]: logprobs f32 (of the token at i + 1 under log_softmax of position i's
    logits) and greedy bool (that token is the argmax there)."""

    logprobs: mx.array
    greedy: mx.array

    def arrays(self) -> list:
        return [self.logprobs, self.greedy]


def _check_score(node, spec):
    return needs_all_positions(node, spec, "scores")


@register_op("score", inputs=(LOGITS, TOKENS), output=TOKEN_SCORES, phase="final", check=_check_score,
             kinds=("prefill",),  # a decode step (one token per row) has no next token to score
             describe=lambda node, binding, kind: "log_softmax at every position, gathered at the next input "
                                                  "token; greedy = that token is the argmax",
             doc="per-position logprob of the next input token (no sampling)")
def score(ctx, node, logits, tokens):
    x = logits[:, :-1, :].astype(mx.float32)  # [B, L-1, V]
    nxt = tokens[:, 1:]
    lse = mx.logsumexp(x, axis=-1)
    chosen = mx.take_along_axis(x, nxt[..., None], axis=-1)[..., 0]
    return TokenScores(chosen - lse, mx.argmax(x, axis=-1) == nxt)
