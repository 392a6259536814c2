"""The Engine's one-forward graphs: embeddings and scoring (graphs/embed.yaml, graphs/score.yaml).

Each runs once per input on fresh caches (runtime/oneshot.py), compiled on first use as a sibling
of the engine's generation graph (same model, layer kinds and checked lowering). A mixin of
Engine: it reads the engine's `compiled`, `model`, `encode` and its `_oneshot` runner cache.
"""

from __future__ import annotations

from graphc.compiler.compile import compile_sibling

from .oneshot import OneShotRunner, embed, score


class OneShotGraphs:
    def oneshot(self, graph, output: str):
        """The runner of a graph that runs once per input (graphs/embed.yaml, graphs/score.yaml, or a
        user's), compiled on first use against this engine's model and lowering."""
        key = (str(graph), output)
        if key not in self._oneshot:
            self._oneshot[key] = OneShotRunner(compile_sibling(self.compiled, graph, self.model), output)
        return self._oneshot[key]

    def embed(self, inputs, *, dimensions: int | None = None, graph="embed"):
        """Embeddings of each input (a string or token ids; or a list of them) through `graph`'s
        `embeddings` output. `dimensions` truncates before normalizing (OpenAI's Matryoshka
        semantics). Returns an EmbeddingResult (vectors in input order, prompt token count)."""
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not inputs:
            raise ValueError("input is empty: give at least one string or token list")
        runner = self.oneshot(graph, "embeddings")
        if dimensions is not None:
            width = int(runner.compiled.binding.config.get("hidden_size") or 0)
            if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1 or (
                    width and dimensions > width):
                raise ValueError(f"dimensions must be an integer in 1..{width or 'hidden_size'}, got {dimensions!r}")
            if not any(n.op == "normalize" for n in runner.compiled.spec.nodes):
                raise ValueError(f"graph '{runner.compiled.spec.name}' has no normalize node, which `dimensions` needs")
        return embed(runner, [self.encode(x) for x in inputs], dimensions)

    def score(self, prompt, continuation, *, graph="score"):
        """Logprob of each `continuation` token given `prompt` and the continuation before it, in one
        forward without sampling (evaluation harnesses' loglikelihood). Returns a ScoreResult;
        `score_many` scores several (prompt, continuation) pairs batched."""
        return self.score_many([(prompt, continuation)], graph=graph)[0]

    def score_many(self, pairs, *, graph="score"):
        enc = []
        for prompt, cont in pairs:
            c = self.encode(cont)
            enc.append((self.encode(prompt), c))
        return score(self.oneshot(graph, "scores"), enc)


__all__ = ["OneShotGraphs"]
