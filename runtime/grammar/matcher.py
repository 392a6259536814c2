"""llguidance matchers per request, and the token bitmask as an additive edit row.

The bitmask is computed on the CPU (numpy API, no torch) while the device runs the
forward of the same step: the runner launches the forward up to the logits, fills
the masks, then builds the edit + sample part on top (see ModelRunner.decode).
"""

from __future__ import annotations

import json

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

from .schema import close_objects
from .spec import Grammar


class GrammarError(ValueError):
    """A grammar that does not compile: a clean request error, never a crash."""


class GrammarCompiler:
    """Builds the llguidance tokenizer once per engine and compiles request grammars."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids=()):
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        eos = sorted(eos_token_ids) or None
        self._ll = llguidance
        # The model's vocabulary may be padded past the tokenizer's (or, in tests and benches,
        # be smaller than it): the mask covers both; ids the model lacks are sliced off later.
        n_vocab = max(vocab_size, len(hf))
        self.lltok = llguidance.hf.from_tokenizer(hf, n_vocab=n_vocab, eos_token=eos[0] if eos else None)
        self.vocab_size = n_vocab
        self.executor = llguidance.LLExecutor()

    def grammar_text(self, g: Grammar) -> str:
        M = self._ll.LLMatcher
        # Compact JSON (no free whitespace): a weak model cannot wander in blank space until
        # max_tokens cuts the document short.
        compact = {"whitespace_flexible": False}
        if g.kind == "json_schema":
            # Objects are closed unless the schema allows extra keys (see grammar/schema.py).
            schema = close_objects(json.loads(g.source))
            return M.grammar_from_json_schema(json.dumps(schema), overrides=compact)
        if g.kind == "json_object":
            return M.grammar_from_json_schema({"type": "object"}, overrides=compact)
        if g.kind == "regex":
            return M.grammar_from_regex(g.source)
        return M.grammar_from_lark(g.source)

    def compile(self, grammar) -> "GrammarState":
        g = Grammar.coerce(grammar)
        try:
            text = self.grammar_text(g)
        except ValueError as e:
            raise GrammarError(f"{g.kind} grammar: {e}") from None
        err = self._ll.LLMatcher.validate_grammar(text, self.lltok)
        if err:
            raise GrammarError(f"{g.kind} grammar does not compile: {err}")
        m = self._ll.LLMatcher(self.lltok, text, log_level=0)
        if m.is_error():
            raise GrammarError(f"{g.kind} grammar does not compile: {m.get_error()}")
        return GrammarState(m)

    def fill_masks(self, states: list["GrammarState | None"]) -> np.ndarray:
        """Bitmask words [B, ceil(V/32)] int32; rows without a grammar allow every token."""
        words = allocate_token_bitmask(len(states), self.vocab_size)
        todo = [(s.matcher, i) for i, s in enumerate(states) if s is not None]
        if todo:
            fill_next_token_bitmask_par(self.executor, todo, words)
        return words


class GrammarState:
    """One request's matcher."""

    def __init__(self, matcher):
        self.matcher = matcher

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise GrammarError(f"token {token} was not accepted by the grammar: {self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar accepts no more tokens (only EOS): the request should stop."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()


def bitmask_to_additive(words, vocab_size: int):
    """[B, W] int32 bit words -> [B, V] float32 additive row: 0 where allowed, -inf elsewhere (lazy mx)."""
    w = mx.array(words) if not isinstance(words, mx.array) else words
    shifts = mx.arange(32, dtype=mx.uint32)
    bits = (w.astype(mx.uint32)[:, :, None] >> shifts) & 1
    bits = bits.reshape(w.shape[0], -1)[:, :vocab_size]
    return mx.where(bits.astype(mx.bool_), mx.array(0.0, mx.float32), mx.array(-mx.inf, mx.float32))
