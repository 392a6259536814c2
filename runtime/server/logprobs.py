"""Engine logprob entries -> the two OpenAI shapes (completions' parallel lists, chat's objects).

The engine reports one entry per generated token (runtime/sampling/logprobs.py:
`{"logprob": float, "top": [(id, logprob), ...], ...}`). `entry_parts` also takes
objects with those attributes or bare floats, so a change of container on the engine
side does not break the wire format. JSON has no -inf: a banned token's logprob is
sent as -9999.0, as OpenAI and vLLM do.
"""

from __future__ import annotations

import math
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
    """Token id -> its text and bytes, cached (the server's own tokenizer copy; event loop only)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.text = lru_cache(maxsize=65536)(self._text)

    def _text(self, tid: int) -> str:
        return self._tok.decode([tid])

    def bytes(self, tid: int) -> list[int]:
        return list(self.text(tid).encode("utf-8", errors="replace"))


def completion_logprobs(entries, token_ids: list[int], texts: TokenText, offset: int) -> tuple[CompletionLogprobs, int]:
    """Completions' `logprobs` object for these tokens, text offsets starting at `offset`.
    Returns it and the offset after the last token (for the next streamed chunk)."""
    out = CompletionLogprobs()
    for entry, tid in zip(entries, token_ids):
        tid, lp, top = entry_parts(entry, tid)
        s = texts.text(tid)
        out.tokens.append(s)
        out.token_logprobs.append(None if math.isnan(lp) else _finite(lp))
        out.top_logprobs.append({texts.text(t): _finite(v) for t, v in top} if top else None)
        out.text_offset.append(offset)
        offset += len(s)
    return out, offset


def chat_logprobs(entries, token_ids: list[int], texts: TokenText) -> ChatLogprobs:
    content = []
    for entry, tid in zip(entries, token_ids):
        tid, lp, top = entry_parts(entry, tid)
        content.append(ChatTokenLogprob(
            token=texts.text(tid), logprob=_finite(lp), bytes=texts.bytes(tid),
            top_logprobs=[TopLogprob(token=texts.text(t), logprob=_finite(v), bytes=texts.bytes(t)) for t, v in top]))
    return ChatLogprobs(content=content)
