"""Reasoning text apart from the answer: `<think>...</think>` models (Qwen3, DeepSeek-R1).

Two shapes reach the server:

- Qwen3 style: the model itself writes `<think>` ... `</think>` before its answer.
- DeepSeek-R1 style (and newer Qwen3 "thinking" templates): the chat template's generation
  prefix already ends with `<think>`, so the output starts inside the thinking and only
  `</think>` appears in it.

The interface (stable; other endpoints — /v1/responses, /v1/messages — reuse it):

    fmt = detect_reasoning(tokenizer.chat_template, tokenizer.get_vocab())   # None: no thinking
    started = opens_reasoning(prompt_text, fmt)       # the prompt left a <think> open
    reasoning, answer = split_reasoning(text, fmt, started=started)           # whole replies
    s = ReasoningStream(fmt, started=started)                                 # streamed replies
    for kind, piece in s.feed(delta): ...              # kind: "reasoning" | "content"
    for kind, piece in s.flush(): ...                  # at the end of the output

`reasoning` is None when the reply never entered thinking. Whitespace around the thinking
(Qwen3 writes `<think>\\n...\\n</think>\\n\\n`) is dropped: reasoning is stripped and the answer
loses its leading whitespace; a reply without thinking is left as is. The stream never emits
a partial tag into either channel (a tag split across deltas is held until it is decided), and
the pieces it emits join to exactly what `split_reasoning` returns for the whole text — one
state machine does both.

`answer_grammar` wraps a structured-output grammar (response_format, tools) so the model
thinks freely and the grammar binds only after `</think>`.
"""

from __future__ import annotations

import json
import re
from typing import Mapping

import attrs

from graphc.runtime.grammar import Grammar
from graphc.runtime.grammar.schema import close_objects

from .errors import bad_request

REASONING = "reasoning"
CONTENT = "content"


@attrs.frozen
class ReasoningFormat:
    """The tags a model's thinking sits between, and their token ids where the vocabulary has
    them as single (added) tokens, as Qwen3's and DeepSeek-R1's do: grammars must allow those
    tokens by id (llguidance treats added tokens as special, never as their text)."""

    open: str = "<think>"
    close: str = "</think>"
    open_id: int | None = None
    close_id: int | None = None


THINK = ReasoningFormat()


def detect_reasoning(chat_template: str | None, vocab: Mapping[str, int] | None = None) -> ReasoningFormat | None:
    """THINK when the chat template mentions `</think>` or the vocabulary has a `</think>` token
    (Qwen3, DeepSeek-R1 and their fine-tunes); None for models without thinking."""
    vocab = vocab or {}
    if (chat_template and THINK.close in chat_template) or THINK.close in vocab:
        return ReasoningFormat(open_id=vocab.get(THINK.open), close_id=vocab.get(THINK.close))
    return None


def opens_reasoning(prompt_text: str, fmt: ReasoningFormat | None) -> bool:
    """Whether the prompt's generation prefix ends inside an open thinking block (DeepSeek-R1's
    `<｜Assistant｜><think>\\n`), so the output starts as reasoning. Only the prompt's tail
    counts: a `<think>` quoted in a user message is not a generation prefix."""
    return fmt is not None and prompt_text.rstrip().endswith(fmt.open)


def template_kwargs(chat_template: str | None, enable_thinking: bool | None, reasoning_effort: str | None,
                    extra: Mapping | None = None) -> dict:
    """Keyword arguments for apply_chat_template: `chat_template_kwargs` as given, then the
    `enable_thinking` switch (Qwen3's name) and `reasoning_effort` (gpt-oss-style templates)
    where the template reads them — a template that never mentions a name ignores it anyway,
    so passing only what it reads keeps other templates' behaviour byte for byte."""
    out = dict(extra or {})
    tpl = chat_template or ""
    if enable_thinking is not None and "enable_thinking" in tpl:
        out["enable_thinking"] = bool(enable_thinking)
    if reasoning_effort is not None and "reasoning_effort" in tpl:
        out["reasoning_effort"] = reasoning_effort
    return out


# apply_chat_template's own arguments: a client's chat_template_kwargs must not override them
# (tokenize=False would hand the engine text; tools/messages have their own request fields).
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def request_template_kwargs(req, chat_template: str | None, server_args: Mapping | None = None) -> dict:
    """template_kwargs for a chat request (its enable_thinking, reasoning_effort and
    chat_template_kwargs fields, over the server's --chat-template-args); a reserved name in
    chat_template_kwargs is a 400."""
    extra = getattr(req, "chat_template_kwargs", None) or {}
    bad = sorted(RESERVED_TEMPLATE_KWARGS.intersection(extra))
    if bad:
        raise bad_request(f"chat_template_kwargs may not set {', '.join(bad)}: use the request's own fields",
                          "chat_template_kwargs")
    extra = {**(server_args or {}), **extra}
    thinking = getattr(req, "enable_thinking", None)
    if thinking is None and isinstance(extra.get("enable_thinking"), bool):
        thinking = extra["enable_thinking"]
    return template_kwargs(chat_template, thinking, getattr(req, "reasoning_effort", None), extra)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningStream:
    """Incremental splitter: feed output deltas, get ("reasoning" | "content", text) pieces."""

    def __init__(self, fmt: ReasoningFormat = THINK, *, started: bool = False):
        self.fmt = fmt
        # start: not yet known whether the reply thinks; think_lead: in thinking, nothing shown
        # yet (leading whitespace dropped); think; answer_lead: after the close tag, leading
        # whitespace dropped; answer.
        self.phase = "think_lead" if started else "start"
        self.entered = started  # the reply has (or the prompt opened) a thinking block
        self._buf = ""

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self._buf += delta
        out: list[tuple[str, str]] = []
        while True:
            before = (self.phase, len(self._buf))
            self._step(out)
            if (self.phase, len(self._buf)) == before:
                return out

    def _step(self, out: list) -> None:
        buf, fmt = self._buf, self.fmt
        if self.phase == "start":
            head = buf.lstrip()
            if head.startswith(fmt.open):
                self.phase, self.entered = "think_lead", True
                self._buf = head[len(fmt.open):]
            elif head and not fmt.open.startswith(head):
                self.phase = "answer"  # no thinking: the text is the answer untouched
            return
        if self.phase == "think_lead":
            self._buf = buf.lstrip()
            if self._buf:
                self.phase = "think"
            return
        if self.phase == "think":
            end = buf.find(fmt.close)
            if end >= 0:
                _emit(out, REASONING, buf[:end].rstrip())
                self.phase, self._buf = "answer_lead", buf[end + len(fmt.close):]
                return
            # Hold a possible partial close tag and the whitespace before it: both are decided
            # only by what comes next (whitespace before `</think>` is dropped).
            hold = len(buf) - _partial_suffix(buf, fmt.close)
            while hold > 0 and buf[hold - 1].isspace():
                hold -= 1
            _emit(out, REASONING, buf[:hold])
            self._buf = buf[hold:]
            return
        if self.phase == "answer_lead":
            self._buf = buf.lstrip()
            if self._buf:
                self.phase = "answer"
            return
        _emit(out, CONTENT, buf)  # answer
        self._buf = ""

    def flush(self) -> list[tuple[str, str]]:
        """What is still held when the output ends (a cut-short thinking stays reasoning)."""
        out: list[tuple[str, str]] = []
        buf, self._buf = self._buf, ""
        if self.phase == "start":
            _emit(out, CONTENT, buf)  # a bare prefix of `<think>` was text after all
        elif self.phase == "think":
            _emit(out, REASONING, buf.rstrip())
        elif self.phase == "answer":
            _emit(out, CONTENT, buf)
        return out


def _emit(out: list, kind: str, text: str) -> None:
    if text:
        out.append((kind, text))


def split_reasoning(text: str, fmt: ReasoningFormat | None = THINK, *,
                    started: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a whole reply; fmt None: (None, text)."""
    if fmt is None:
        return None, text
    s = ReasoningStream(fmt, started=started)
    parts = s.feed(text) + s.flush()
    reasoning = "".join(t for k, t in parts if k == REASONING)
    answer = "".join(t for k, t in parts if k == CONTENT)
    return (reasoning if s.entered else None), answer


# -- structured output after the thinking ---------------------------------------------------
def _not_containing(marker: str) -> str:
    escaped = re.escape(marker).replace("/", "\\/")  # a lark regex literal ends at an unescaped '/'
    return f"/(?s:.*)/ & ~/(?s:.*{escaped}.*)/"


def _answer_rules(g: Grammar) -> str:
    """`g` as lark rules whose start symbol is `answer`."""
    if g.kind == "json_schema":
        schema = close_objects(json.loads(g.source))
        schema.setdefault("x-guidance", {"whitespace_flexible": False})
        return f"answer: %json {json.dumps(schema)}\n"
    if g.kind == "json_object":
        return 'answer: %json {"type": "object", "x-guidance": {"whitespace_flexible": false}}\n'
    if g.kind == "regex":
        return "answer: /" + g.source.replace("/", "\\/") + "/\n"
    text, n = re.subn(r"(?m)^start\s*:", "answer:", g.source)
    if n != 1:
        raise ValueError("a lark grammar must have one `start:` rule to follow the thinking")
    return text if text.endswith("\n") else text + "\n"


def _tag(text: str, token_id: int | None) -> str:
    """A lark alternative for a tag: its text, or its added token by id."""
    return json.dumps(text) + (f" | <[{token_id}]>" if token_id is not None else "")


def answer_grammar(g: Grammar, fmt: ReasoningFormat, *, started: bool) -> Grammar:
    """A grammar that lets the model think freely, then holds what follows `</think>` to `g`.

    started: the prompt opened the thinking, so the output must close it first; otherwise the
    model may open a thinking block (`<think>`...`</think>`) or answer at once. The thinking
    is free text that cannot contain the close tag. Rule names carry an r_ prefix so they never collide with
    the wrapped grammar's (tools.py's body/calls/TEXT/LEAD)."""
    # The close tag as text ends one lexeme "text without the tag, then the tag" (no guessing
    # where the text ends); as its added token it follows a text lexeme.
    think = "R_THOUGHT" + (f" | R_TEXT? <[{fmt.close_id}]>" if fmt.close_id is not None else "")
    head = [
        "start: r_open r_think R_WS? answer | answer" if not started else "start: r_think R_WS? answer",
        f"r_think: {think}",
        f"R_THOUGHT: {_not_containing(fmt.close)} {json.dumps(fmt.close)}",
        f"R_TEXT: {_not_containing(fmt.close)}",
        "R_WS: /[ \\t\\r\\n]{1,4}/",  # bounded: a weak model cannot wander in blank space (cf. compact JSON)
    ]
    if not started:
        head.insert(1, f"r_open: {_tag(fmt.open, fmt.open_id)}")
    return Grammar.lark("\n".join(head) + "\n" + _answer_rules(g))
