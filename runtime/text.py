"""Incremental detokenization with stop strings.

Text is released only once it can no longer be the start of a stop string, and
never in the middle of a multi-byte UTF-8 character (the streaming detokenizer
holds back a trailing U+FFFD until the next token completes it).
"""

from __future__ import annotations


class TextState:
    def __init__(self, tokenizer, stop: tuple = ()):
        self._detok = tokenizer.detokenizer
        self.stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # the full text so far (stop string excluded once hit)
        self._released = 0
        self.stopped = False

    def add(self, token: int) -> bool:
        """Add a token; True when a stop string completed (the text is cut before it)."""
        if self.stopped:
            return True
        self._detok.add_token(token)
        text = self._detok.text
        if text.endswith("\ufffd"):
            text = text[:-1]  # an incomplete UTF-8 sequence: wait for the rest
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
        if not self.stopped:
            self._detok.finalize()
            text = self._detok.text
            self.text = text
        out = self.text[self._released:]
        self._released = len(self.text)
        return out
