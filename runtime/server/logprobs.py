"""Engine logprob entries -> the two OpenAI shapes (completions' parallel lists, chat's objects).

The engine reports one entry per generated token (runtime/sampling/logprobs.py:
`{"logprob": float, "top": [(id, logprob), ...], ...}`). `entry_parts` also takes
objects with those attributes or bare floats, so a change of container on the engine
side does not break the wire format. JSON has no -inf: a banned token's logprob is
sent as -9999.0, as OpenAI and vLLM do.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

from .protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

FLOOR = -9999.0


def _finite(x) -> float:
    x = float(x)
    return FLOOR if math.isnan(x) or x < FLOOR else x


def entry_parts(entry, token_id: int) -> tuple[int, float, list[tuple[int, float]]]:
    """(token id, logprob, [(top id, top logprob), ...]) of one engine entry."""
    if entry is None:
        return token_id, float("nan"), []
    if isinstance(entry, (int, float)):
        return token_id, float(entry), []
    get = entry.get if isinstance(entry, dict) else (lambda k, d=None: getattr(entry, k, d))
    lp = get("logprob", None)
    if lp is None:
        lp = get("chosen", float("nan"))
    tid = get("token_id", None)
    if tid is None:
        tid = get("token", None)  # prompt logprob entries name the scored token "token"
    if not isinstance(tid, int):
        tid = token_id
    top = get("top", None)
    if top is None:
        top = get("top_logprobs", None) or []
    if isinstance(top, dict):
        top = list(top.items())
    pairs = []
    for t in top:
        if isinstance(t, dict):
            pairs.append((int(t.get("token_id", t.get("id"))), float(t["logprob"])))
        else:
            pairs.append((int(t[0]), float(t[1])))
    return int(tid), float(lp), pairs


def logprob_source(res, from_deltas: list, deltas_complete: bool):
    """Per-token logprob entries of a finished choice: the result's list, else the deltas'."""
    if res is None:
        return None
    if res.logprobs and len(res.logprobs) == len(res.token_ids):
        return res.logprobs
    return from_deltas if deltas_complete and len(from_deltas) == len(res.token_ids) else None


class TokenText:
    """Token id -> its text and raw bytes, cached (the server's own tokenizer copy; event loop only).

    A token can hold part of a UTF-8 character: its text then shows U+FFFD, but `bytes` must be
    the token's real bytes, so clients can join them. Byte-level BPE vocabularies spell bytes
    with GPT-2's printable alphabet; SentencePiece ones use <0xNN> pieces and U+2581 for spaces.
    """

    _HEX = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._byte_level = type(getattr(tokenizer, "detokenizer", None)).__name__ == "BPEStreamingDetokenizer"
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)
        self.key = lru_cache(maxsize=65536)(self._key)

    def _text(self, tid: int) -> str:
        return self._tok.decode([tid])

    def _key(self, tid: int) -> str:
        """The token as completions' `tokens` / `top_logprobs` keys show it: its text, or, when its
        bytes are not valid UTF-8 on their own, OpenAI's `bytes:\\xNN...` spelling. Two partial
        characters would otherwise both print as U+FFFD and collapse into one dict entry."""
        raw = bytes(self.bytes(tid))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _bytes(self, tid: int) -> list[int]:
        text = self.text(tid)
        if "\ufffd" not in text:
            return list(text.encode("utf-8"))
        try:
            piece = self._tok.convert_ids_to_tokens(tid)
        except Exception:
            piece = None
        if isinstance(piece, str):
            m = self._HEX.match(piece)
            if m:
                return [int(m.group(1), 16)]
            if self._byte_level:
                table = _gpt2_byte_decoder()
                if all(c in table for c in piece):
                    return [table[c] for c in piece]
        return list(text.encode("utf-8"))


@lru_cache(maxsize=1)
def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable-character table, inverted (the alphabet byte-level BPE uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    return table


def completion_logprobs(entries, token_ids: list[int], texts: TokenText, offset: int) -> tuple[CompletionLogprobs, int]:
    """Completions' `logprobs` object for these tokens, text offsets starting at `offset`.
    Returns it and the offset after the last token (for the next streamed chunk)."""
    out = CompletionLogprobs()
    for entry, tid in zip(entries, token_ids):
        tid, lp, top = entry_parts(entry, tid)
        s = texts.text(tid)
        out.tokens.append(texts.key(tid))
        out.token_logprobs.append(None if math.isnan(lp) else _finite(lp))
        out.top_logprobs.append(_top_dict(top, texts) if top else None)
        out.text_offset.append(offset)
        offset += len(s)
    return out, offset


def _top_dict(top, texts) -> dict[str, float]:
    """Completions key alternatives by text (partial UTF-8 as `bytes:\\xNN`, see TokenText.key).
    Distinct tokens can still spell the same text; the engine lists them best first, so the
    first of a text keeps its place."""
    d: dict[str, float] = {}
    for t, v in top:
        d.setdefault(texts.key(t), _finite(v))
    return d


def chat_logprobs(entries, token_ids: list[int], texts: TokenText) -> ChatLogprobs:
    content = []
    for entry, tid in zip(entries, token_ids):
        tid, lp, top = entry_parts(entry, tid)
        content.append(ChatTokenLogprob(
            token=texts.text(tid), logprob=_finite(lp), bytes=texts.bytes(tid),
            top_logprobs=[TopLogprob(token=texts.text(t), logprob=_finite(v), bytes=texts.bytes(t)) for t, v in top]))
    return ChatLogprobs(content=content)
