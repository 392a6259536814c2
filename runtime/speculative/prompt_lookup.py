"""Prompt-lookup drafting: propose the tokens that followed the last occurrence of the current
n-gram suffix earlier in the row's own context (prompt + output so far).

Input-grounded work (summarize, edit, quote, fill in code) copies long runs of its input, so
the continuation of a matching n-gram is often exactly what the model is about to write. It
costs no model: a dict from n-gram to where it last ended, updated incrementally as tokens
are appended, so a step's lookup is O(max_ngram) Python work per row, not a scan of the text.
"""

from __future__ import annotations


class NgramIndex:
    """Per-row index over one growing token sequence.

    `draft(tokens, k)`: `tokens` is the row's whole sequence so far (it only ever grows by
    appending; `known` marks where the real part ends when the tail is assumed). Returns up to
    k tokens that followed the most recent earlier occurrence of the longest suffix n-gram
    (max_ngram down to min_ngram), or [] when none occurred before."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._last: dict[tuple, int] = {}  # n-gram -> end (exclusive) of its latest indexed occurrence
        self._done = 0  # n-grams ending at positions < _done are indexed

    def _index_upto(self, tokens: list[int], end: int) -> None:
        # The n-grams ending at the sequence's current end are left out: they are the query,
        # and an occurrence must have at least one token after it to propose.
        for e in range(max(self._done, self.min_ngram), end):
            for n in range(self.min_ngram, min(self.max_ngram, e) + 1):
                self._last[tuple(tokens[e - n:e])] = e
        self._done = max(self._done, end)

    def draft(self, tokens: list[int], k: int, known: int | None = None) -> list[int]:
        """`known`: how many leading tokens are the row's real sequence (default: all). The rest
        are assumed — a pipelined verify drafts past drafts not verified yet — so they are
        queried but never indexed (the index only ever holds real n-grams)."""
        T = len(tokens)
        if k <= 0 or T <= self.min_ngram:
            return []
        self._index_upto(tokens, T if known is None else min(known, T))
        for n in range(min(self.max_ngram, T - 1), self.min_ngram - 1, -1):
            e = self._last.get(tuple(tokens[T - n:]))
            if e is not None:
                return list(tokens[e:e + k])
        return []
