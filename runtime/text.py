"""Incremental detokenization with stop strings.

Text is released only once it can no longer be the start of a stop string, and
never in the middle of a multi-byte UTF-8 character (a trailing U+FFFD is held
back until the next token completes it).

The text is the exact continuation (`tokenizer.decode(output_ids)`, leading space
included, so `prompt + text` reads right). Each new token is decoded together
with the few tokens before it — decoding a token alone can drop or add a space
with SentencePiece-style tokenizers — so the cost per token is O(1), not O(T).
"""

from __future__ import annotations


MAX_PENDING = 8  # tokens; the longest UTF-8 sequence is 4 bytes


class TextState:
    def __init__(self, tokenizer, stop: tuple = ()):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] is context whose text is already in self._decoded
        self._read = 0
        self._decoded = ""
        self.stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # the full text so far (stop string excluded once hit)
        self._released = 0
        self.stopped = False

    def add(self, token: int) -> bool:
        """Add a token; True when a stop string completed (the text is cut before it)."""
        if self.stopped:
            return True
        self._ids.append(token)
        before = self._tok.decode(self._ids[self._prefix:self._read])
        after = self._tok.decode(self._ids[self._prefix:])
        # A trailing U+FFFD is an incomplete UTF-8 sequence: wait for the rest, but not forever
        # (a weak model can emit stray continuation bytes that never complete).
        if not after.endswith("\ufffd") or len(self._ids) - self._read >= MAX_PENDING:
            self._decoded += after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
        text = self._decoded
        if self.stop:
            start = max(0, len(self.text) - self._hold)
            for s in self.stop:
                i = text.find(s, start)
                if i >= 0:
                    self.text = text[:i]
                    self.stopped = True
                    return True
        self.text = text
        return False

    def ready(self) -> str:
        """New text that is safe to show now."""
        end = len(self.text) - (self._hold if self.stop and not self.stopped else 0)
        if end <= self._released:
            return ""
        out = self.text[self._released:end]
        self._released = end
        return out

    def flush(self) -> str:
        """Everything not yet shown (the request is over)."""
        if not self.stopped and self._read < len(self._ids):
            # Whatever is left (a sequence that never completed) is shown as decode() shows it.
            before = self._tok.decode(self._ids[self._prefix:self._read])
            self.text = self._decoded + self._tok.decode(self._ids[self._prefix:])[len(before):]
        out = self.text[self._released:]
        self._released = len(self.text)
        return out
