"""What a request asks for: how to pick tokens and when to stop."""

from __future__ import annotations

import attrs

from .sampling.params import MAX_INT32, validate_params
from .speculative.config import parse_speculative


def _bias_converter(v):
    if v is None:
        return None
    # Keys may arrive as strings from JSON (OpenAI's logit_bias is {"123": 5}).
    try:
        return {int(k): float(x) for k, x in dict(v).items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"logit_bias must map token ids to numbers, got {v!r}") from e


def _tuple(v):
    if v is None:
        return ()
    return (v,) if isinstance(v, (str, int)) or callable(v) else tuple(v)


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@attrs.frozen
class SamplingParams:
    """Per-request generation settings. Defaults give greedy decoding of up to 256 tokens.

    max_tokens         tokens to generate at most (finish_reason "length"). 0: the prompt only —
                       it is prefilled (prompt logprobs if asked), nothing is generated, and it
                       finishes with "length" (the same rule in the CLI and the server).
    temperature        0.0 = greedy (argmax); > 0 divides the logits.
    top_k              0 = off; else keep the k highest-ranked tokens.
    top_p              1.0 = off; nucleus over the (top-k renormalised) probabilities.
    min_p              0.0 = off; keep p >= min_p * p_max.
    seed               None = noise from the step's random key; int = reproducible
                       noise keyed by (seed, position, token id), whatever shares the batch.
    repetition_penalty 1.0 = off; CTRL-style, sign-aware, on tokens seen.
    frequency_penalty  0.0 = off; subtract penalty * count.
    presence_penalty   0.0 = off; subtract penalty once if count > 0.
    penalize_prompt    False: penalties see generated tokens only; True: prompt too.
    logit_bias         {token id: additive bias} or None (JSON string keys accepted).
    banned_token_ids   ids that can never be chosen (logit -inf).
    min_tokens         EOS ids are banned until this many tokens were generated.
    logprobs           None = none; N in 0..20 = chosen token's logprob plus top N.
    logprob_token_ids  extra token ids whose logprobs are reported each step.
    prompt_logprobs    None = none; N in 0..20 = per prompt token logprob plus top N.
    stop, stop_token_ids, ignore_eos   when to stop (finish_reason "stop").
    logits_processors  Python callables (token_ids [n], logits [1, V]) -> logits, mlx-lm's convention
                       (its make_logits_processors output works as is); run on the host, break the chain.
    grammar            structured output (graphc.runtime.grammar.Grammar), see docs/structured-output.md.
    speculative        None = the engine's default; "off"; "prompt_lookup"; or a mapping
                       {"method": ..., "num_draft_tokens": ..., "max_ngram": ..., "min_ngram": ...}
                       (docs/speculative.md). Plain greedy rows only: other rows decode normally.
    num_draft_tokens   k, the most draft tokens verified per step (None = the method's default).
    prefix_boundaries  prompt offsets where a chat message ends (the server's chat rendering sets
                       them): recurrent / sliding layers keep prefix state there, so the next,
                       longer turn of the chat resumes at one (docs/cache-policies.md). Output is unchanged.
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
    logit_bias: dict | None = attrs.field(default=None, converter=_bias_converter, hash=False)
    banned_token_ids: tuple = attrs.field(default=(), converter=_tuple)
    min_tokens: int = 0
    logprobs: int | None = None  # top-N alternatives per token (0 = chosen token only)
    logprob_token_ids: tuple = attrs.field(default=(), converter=_tuple)
    prompt_logprobs: int | None = None
    stop: tuple = attrs.field(default=(), converter=_tuple)  # stop strings
    stop_token_ids: tuple = attrs.field(default=(), converter=_tuple)
    ignore_eos: bool = False
    logits_processors: tuple = attrs.field(default=(), converter=_tuple)
    grammar: object = None
    speculative: str | dict | None = attrs.field(default=None, hash=False)
    num_draft_tokens: int | None = None
    prefix_boundaries: tuple = attrs.field(default=(), converter=_tuple, hash=False)

    def validate(self, vocab_size: int | None = None) -> "SamplingParams":
        """Raise ValueError naming the bad field; return self so calls chain."""

        def bad(field, msg):
            raise ValueError(f"{field} {msg}")

        if (not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool)
                or not 0 <= self.max_tokens <= MAX_INT32):
            bad("max_tokens", f"must be an integer in 0..{MAX_INT32}, got {self.max_tokens!r}")

        parse_speculative(self.speculative, self.num_draft_tokens)  # ValueError names the field
        validate_params(self)  # temperature, top-k/p, min-p, seed, penalties, bias, logprobs, ...
        if not all(isinstance(s, str) for s in self.stop):
            bad("stop", f"must be strings, got {self.stop!r}")
        for s in self.stop:  # a lone surrogate cannot be matched against decoded text, nor printed
            if not _encodable(s):
                bad("stop", "holds a lone UTF-16 surrogate (not valid Unicode text)")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            bad("stop_token_ids", f"must be token ids (integers), got {self.stop_token_ids!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.prefix_boundaries):
            bad("prefix_boundaries", f"must be prompt offsets (integers >= 0), got {self.prefix_boundaries!r}"[:200])
        if vocab_size is not None:
            ids = list((self.logit_bias or {}).keys()) + list(self.banned_token_ids) + list(self.logprob_token_ids)
            ids += list(self.stop_token_ids)
            for t in ids:
                if not isinstance(t, int) or not 0 <= t < vocab_size:
                    bad("token id", f"{str(t)[:40]} is out of range for a vocabulary of {vocab_size}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def chain_safe(self) -> bool:
        """Rows whose next step needs host work (grammar masks, Python processors) break the chain."""
        return not self.logits_processors and self.grammar is None
