"""Host edit rows: what the CPU adds to a batch's logits between the forward and the head.

Grammar masks (llguidance, filled on the CPU while the device runs the forward) and Python
logits processors, for rows that are not chain-safe. The runner holds one `HostEdits` and
calls it with the rows and their (queued) logits; it returns one additive [B, V] row per
batch row, or None. The graph's logit_edits node applies it only when the plan declares
`grammar` / `processors` (the runner does not even call it otherwise).
"""

from __future__ import annotations

import threading

import mlx.core as mx

from .grammar import GrammarCompiler
from .grammar.matcher import bitmask_to_additive
from .sampling import apply_logits_processors


def _guarded(req, failures: dict):
    """The request's Python logits processors as one callable that cannot fail the batch: an
    exception is recorded in `failures` (the engine's postprocess ends this request with
    finish_reason "error") and leaves its logits as they were; the other rows go on."""
    procs = req.params.logits_processors
    if not procs:
        return None

    def run(ids, logits):
        try:
            out = logits
            for proc in procs:
                out = proc(ids, out)
            return out
        except Exception as e:  # noqa: BLE001 - user code: any failure is this request's own
            failures[req.id] = f"logits processor failed: {type(e).__name__}: {e}"
            return logits

    return (run,)


class HostEdits:
    """Grammar masks + logits processors for a batch's rows; owns the grammar compiler."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids=()):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._grammar = None  # GrammarCompiler, built on the first request that needs one
        self._lock = threading.Lock()
        self.failures: dict[str, str] = {}  # request id -> why its logits processor failed

    def take_failure(self, req) -> str | None:
        """Why `req`'s logits processor failed since the last call (None: it did not)."""
        return self.failures.pop(req.id, None) if self.failures else None

    @property
    def grammar_compiler(self):
        """Built on first use; thread-safe (AsyncEngine compiles grammars on worker threads)."""
        with self._lock:
            if self._grammar is None:
                self._grammar = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._grammar

    def __call__(self, rows, logits):
        """Additive [B, V] edits for `rows`, or None when none of them needs the host."""
        edits = None
        if any(r.grammar is not None for r in rows):
            # Runs on the CPU while the device computes `logits` (queued by the runner).
            words = self.grammar_compiler.fill_masks([r.grammar for r in rows])
            edits = bitmask_to_additive(words, self.vocab_size)
        if any(r.params.logits_processors for r in rows):
            # mlx-lm's convention: proc(token ids so far [n], logits [1, V]) -> [1, V].
            base = logits if edits is None else logits + edits
            new = apply_logits_processors(base, [_guarded(r, self.failures) for r in rows],
                                          [r.prompt_ids + r.output_ids for r in rows])
            delta = new - base
            delta = mx.where(mx.isnan(delta), 0.0, delta)  # -inf already in base (a grammar mask) stays
            edits = delta if edits is None else edits + delta
        return edits
