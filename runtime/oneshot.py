"""Graphs that run once per input: embeddings (graphs/embed.yaml) and scoring (graphs/score.yaml).

No decode, no sampling, no prefix cache: each call runs whole inputs with fresh caches and
reads the graph's named output. Inputs go through one left-padded forward per batch where
the graph's policies keep plain FullKV rows (the same rule as batched prefill), else one
forward per input. Nothing here knows what the graph computes beyond its output's name:
the ops (compiler/ops/embedding.py, scoring.py) do.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.compiler.lower import StepInputs
from graphc.compiler.selfcheck import batch_prefill_ok

# Padded tokens per forward: bigger input lists are split into several batches.
BATCH_TOKENS = 8192


@attrs.frozen
class EmbeddingResult:
    embeddings: list  # one list[float] per input, in order
    prompt_tokens: int  # tokens over all inputs (OpenAI usage)


@attrs.frozen
class ScoreResult:
    """Scores of `continuation` given `prompt`: one entry per continuation token."""

    token_ids: list  # the continuation's ids
    logprobs: list  # float per continuation token: log p(token | everything before it)
    greedy: list  # bool per token: it is the argmax at its position
    prompt_tokens: int

    @property
    def total(self) -> float:
        """The continuation's loglikelihood (sum of its logprobs)."""
        return float(sum(self.logprobs))

    @property
    def is_greedy(self) -> bool:
        """Greedy decoding from the prompt would produce exactly the continuation."""
        return all(self.greedy)


class OneShotRunner:
    """Runs a compiled graph's prefill step once over whole inputs and returns one named output."""

    def __init__(self, compiled, output: str):
        self.compiled = compiled
        self.step = compiled.prefill
        if output not in self.step.outputs:
            names = ", ".join(self.step.outputs) or "none"
            raise ValueError(f"graph '{compiled.spec.name}' has no '{output}' output (it has: {names})")
        self.output = output
        self.policies = compiled.binding.policies
        self.batched = batch_prefill_ok(self.policies)

    def batches(self, inputs: list[list[int]]) -> list[list[int]]:
        """Index groups: sorted by length so padding stays small, capped at BATCH_TOKENS padded tokens."""
        if not self.batched:
            return [[i] for i in range(len(inputs))]
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        groups, cur = [], []
        for i in order:
            if cur and len(inputs[i]) * (len(cur) + 1) > BATCH_TOKENS:
                groups.append(cur)
                cur = []
            cur.append(i)
        return groups + ([cur] if cur else [])

    def run(self, inputs: list[list[int]], options: dict | None = None):
        """Yields (index group, pads, lazy output value) per batch; the caller evaluates and reads rows."""
        for group in self.batches(inputs):
            rows = [inputs[i] for i in group]
            L = max(map(len, rows))
            pads = [L - len(r) for r in rows]
            if self.batched:
                caches = [type(p.new_cache())(len(rows), pads) for p in self.policies]
            else:
                caches = [p.new_cache() for p in self.policies]
            tokens = mx.array([[0] * p + r for p, r in zip(pads, rows)], dtype=mx.int32)
            out = self.step(StepInputs(tokens, caches, final=True, pads=pads if any(pads) else None,
                                       options=options))
            yield group, pads, out.values[self.output]


def embed(runner: OneShotRunner, inputs: list[list[int]], dimensions: int | None = None) -> EmbeddingResult:
    out: list = [None] * len(inputs)
    for group, _, value in runner.run(inputs, {"dimensions": dimensions} if dimensions else None):
        rows = value.tolist()  # evaluates this batch
        for i, row in zip(group, rows):
            out[i] = row
    return EmbeddingResult(out, sum(map(len, inputs)))


def score(runner: OneShotRunner, pairs: list[tuple[list[int], list[int]]]) -> list[ScoreResult]:
    inputs = [p + c for p, c in pairs]
    out: list = [None] * len(pairs)
    for group, pads, value in runner.run(inputs):
        mx.eval(*value.arrays())
        lps, greedy = value.logprobs.tolist(), value.greedy.tolist()
        for row, i in enumerate(group):
            prompt, cont = pairs[i]
            # Position j scores token j + 1; the continuation's first token is scored at the
            # prompt's last position (pads[row] + len(prompt) - 1).
            first = pads[row] + len(prompt) - 1
            out[i] = ScoreResult(list(cont), lps[row][first:first + len(cont)],
                                 [bool(g) for g in greedy[row][first:first + len(cont)]], len(prompt))
    return out
