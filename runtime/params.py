"""What a request asks for: how to pick tokens and when to stop."""

from __future__ import annotations

import attrs


@attrs.frozen
class SamplingParams:
    """Per-request generation settings. Defaults give greedy decoding of up to 256 tokens.

    Selection: `temperature` 0 is greedy (exact argmax); otherwise `top_k` (0 = off),
    `top_p`, `min_p` filter and a Gumbel-max draw picks. `seed` makes the draw a pure
    function of (seed, position, token id), whatever else shares the batch.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalize_prompt: bool = False
    logit_bias: dict | None = None
    banned_token_ids: tuple = ()
    min_tokens: int = 0
    logprobs: int | None = None  # top-N alternatives per token (0 = chosen token only)
    logprob_token_ids: tuple = ()
    prompt_logprobs: int | None = None
    stop: tuple = ()  # stop strings
    stop_token_ids: tuple = ()
    ignore_eos: bool = False
    logits_processors: tuple = ()  # Python callables (token_ids, logits) -> logits; break the chain
    grammar: object = None  # structured-output spec (see docs/structured-output.md)

    def validate(self, vocab_size: int | None = None) -> "SamplingParams":
        """Raise ValueError naming the bad field; return self so calls chain."""

        def bad(field, msg):
            raise ValueError(f"{field} {msg}")

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 0:
            bad("max_tokens", f"must be a non-negative integer, got {self.max_tokens!r}")
        from .sampling.params import validate_params

        validate_params(self)  # temperature, top-k/p, min-p, seed, penalties, bias, logprobs, ...
        if not all(isinstance(s, str) for s in self.stop):
            bad("stop", f"must be strings, got {self.stop!r}")
        if vocab_size is not None:
            ids = list((self.logit_bias or {}).keys()) + list(self.banned_token_ids) + list(self.logprob_token_ids)
            ids += list(self.stop_token_ids)
            for t in ids:
                if not isinstance(t, int) or not 0 <= t < vocab_size:
                    bad("token id", f"{t!r} is out of range for a vocabulary of {vocab_size}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def chain_safe(self) -> bool:
        """Rows whose next step needs host work (grammar masks, Python processors) break the chain."""
        return not self.logits_processors and self.grammar is None
