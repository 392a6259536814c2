"""Generated text -> OpenAI tool_calls, whole (non-streamed replies) or incrementally (SSE deltas).

The grammar (tools.py) already guarantees each complete call is `start + JSON + end` with a
known name and schema-valid arguments, so parsing here is a split, not a repair. A call cut
short by max_tokens is not a call: its text stays in `content` and finish_reason stays
"length".
"""

from __future__ import annotations

import json
import uuid

from .tools import ToolFormat


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(body: str) -> dict | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return {"id": new_call_id(), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def split_calls(text: str, fmt: ToolFormat) -> tuple[str | None, list[dict]]:
    """(content before the first call or None, complete calls in order)."""
    start, end = fmt.start.strip(), fmt.end.strip()
    pos = text.find(start)
    if pos < 0:
        return text, []
    content = text[:pos].strip() or None
    calls = []
    while pos >= 0:
        close = text.find(end, pos)
        if close < 0:
            # cut short: keep what was written as content, so nothing generated is lost
            return (text.strip() or None) if not calls else content, calls
        call = _call(text[pos + len(start):close])
        if call is None:
            return text, []
        calls.append(call)
        pos = text.find(start, close + len(end))
    return content, calls


class ToolStream:
    """Feeds generated text in pieces; yields ("content", str) and ("call", dict) events.

    Text that could be the beginning of the start marker is held back until it is known not
    to be, so no part of a call's markup ever reaches a client as content."""

    def __init__(self, fmt: ToolFormat):
        self.start, self.end = fmt.start.strip(), fmt.end.strip()
        self.buf = ""
        self.in_call = False
        self.calls = 0
        self.content_seen = False

    def feed(self, piece: str) -> list[tuple[str, object]]:
        self.buf += piece
        events = []
        while True:
            if not self.in_call:
                pos = self.buf.find(self.start)
                if pos >= 0:
                    text = self.buf[:pos]
                    if self.calls == 0 and text.strip():
                        events.append(("content", text.rstrip()))
                    self.buf = self.buf[pos + len(self.start):]
                    self.in_call = True
                    continue
                keep = self._partial_marker_len()
                text, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                if text and self.calls == 0:
                    # leading whitespace before a call is not content worth sending
                    if self.content_seen or text.strip():
                        events.append(("content", text))
                        self.content_seen = True
                    else:
                        self.buf = text + self.buf
                return events
            close = self.buf.find(self.end)
            if close < 0:
                return events
            call = _call(self.buf[:close])
            self.buf = self.buf[close + len(self.end):]
            self.in_call = False
            if call is not None:
                call["index"] = self.calls
                self.calls += 1
                events.append(("call", call))

    def _partial_marker_len(self) -> int:
        """Length of the longest suffix of buf that is a proper prefix of the start marker."""
        for n in range(min(len(self.start) - 1, len(self.buf)), 0, -1):
            if self.start.startswith(self.buf[-n:]):
                return n
        return 0

    def flush(self) -> str:
        """What is left at the end (an unfinished call or a held-back partial marker), as content."""
        rest = (self.start + self.buf) if self.in_call else self.buf
        self.buf, self.in_call = "", False
        return rest
