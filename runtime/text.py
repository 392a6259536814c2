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

import codecs
import json


MAX_PENDING = 8  # tokens; the longest UTF-8 sequence is 4 bytes


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what byte-level BPE vocabularies use)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def token_bytes_table(tokenizer) -> list[bytes] | None:
    """Each token id's bytes, for byte-level BPE tokenizers (None for others).

    With it, detokenizing a token is a table lookup plus an incremental UTF-8 decode —
    about a microsecond, against tens for a tokenizer.decode() call — which matters at
    64 rows a step. Added (special) tokens decode to their content, as decode() does.
    """
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    dec = spec.get("decoder") or {}
    kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders", [])}
    if "ByteLevel" not in kinds or kinds - {"ByteLevel", "Sequence", None}:
        return None
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    added = {a["id"]: a["content"] for a in spec.get("added_tokens", [])}
    vocab = backend.get_vocab(with_added_tokens=True)
    table: list[bytes] = [b""] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        if i in added:
            table[i] = added[i].encode()
        elif all(c in byte_of for c in piece):
            table[i] = bytes(byte_of[c] for c in piece)
        else:
            return None
    return table


class TextState:
    def __init__(self, tokenizer, stop: tuple = (), table: list[bytes] | None = None):
        self._tok = tokenizer
        self._table = table  # token_bytes_table(tokenizer): the fast path when present
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace") if table is not None else None
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
        if self._table is not None:
            # Incomplete UTF-8 stays buffered in the incremental decoder until completed.
            # Ids past the tokenizer's vocabulary (padded embedding rows) decode to nothing.
            self._decoded += self._utf8.decode(self._table[token] if 0 <= token < len(self._table) else b"")
            return self._check_stop(self._decoded)
        self._ids.append(token)
        before = self._tok.decode(self._ids[self._prefix:self._read])
        after = self._tok.decode(self._ids[self._prefix:])
        # A trailing U+FFFD is an incomplete UTF-8 sequence: wait for the rest, but not forever
        # (a weak model can emit stray continuation bytes that never complete).
        if not after.endswith("\ufffd") or len(self._ids) - self._read >= MAX_PENDING:
            self._decoded += after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
        return self._check_stop(self._decoded)

    def _check_stop(self, text: str) -> bool:
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
        if not self.stopped and self._utf8 is not None:
            self.text = self._decoded = self._decoded + self._utf8.decode(b"", final=True)
        elif not self.stopped and self._read < len(self._ids):
            # Whatever is left (a sequence that never completed) is shown as decode() shows it.
            before = self._tok.decode(self._ids[self._prefix:self._read])
            self.text = self._decoded + self._tok.decode(self._ids[self._prefix:])[len(before):]
        out = self.text[self._released:]
        self._released = len(self.text)
        return out
