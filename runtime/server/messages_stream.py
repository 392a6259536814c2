"""Streaming /v1/messages: Anthropic's event sequence.

    message_start                      (the message with empty content, input usage)
    per block: content_block_start     (a `thinking`, `text` or `tool_use` block, empty)
               ping                    (once, after the first block starts)
               content_block_delta...  (thinking_delta, text_delta, or input_json_delta with the arguments)
               content_block_stop
    message_delta                      (stop_reason, stop_sequence, final usage)
    message_stop

Each event is `event: <type>` + `data: <json with the same type>`. Text before a tool call is
its own block, stopped when the call starts; tool markup never reaches the client as text
(tool_output.ToolStream holds it back). An engine failure after the headers are out is an
`error` event in Anthropic's shape.
"""

from __future__ import annotations

import json

from .chat_run import CALL, REASONING
from .messages_output import matched_stop, stop_reason, tool_use_block, usage


def _event(kind: str, **fields) -> str:
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"), ensure_ascii=False)
    return f"event: {kind}\ndata: {data}\n\n"


class _Blocks:
    def __init__(self):
        self.count = 0
        self.text_open = False
        self.thinking_open = False
        self.pinged = False
        self.calls = 0
        self.texts = 0
        self.thoughts = 0

    def _start(self, block: dict) -> list[str]:
        out = [_event("content_block_start", index=self.count, content_block=block)]
        if not self.pinged:
            out.append(_event("ping"))
            self.pinged = True
        return out

    def thinking(self, piece: str) -> list[str]:
        out = []
        if not self.thinking_open:
            out += self._start({"type": "thinking", "thinking": "", "signature": ""})
            self.thinking_open = True
            self.thoughts += 1
        out.append(_event("content_block_delta", index=self.count, delta={"type": "thinking_delta",
                                                                          "thinking": piece}))
        return out

    def close_thinking(self) -> list[str]:
        if not self.thinking_open:
            return []
        self.thinking_open = False
        self.count += 1
        return [_event("content_block_stop", index=self.count - 1)]

    def text(self, piece: str) -> list[str]:
        out = self.close_thinking()
        if not self.text_open:
            out += self._start({"type": "text", "text": ""})
            self.text_open = True
            self.texts += 1
        if piece:
            out.append(_event("content_block_delta", index=self.count, delta={"type": "text_delta", "text": piece}))
        return out

    def close_text(self) -> list[str]:
        if not self.text_open:
            return []
        self.text_open = False
        self.count += 1
        return [_event("content_block_stop", index=self.count - 1)]

    def call(self, call: dict) -> list[str]:
        out = self.close_thinking() + self.close_text()
        block = tool_use_block(call)
        out += self._start(dict(block, input={}))
        out.append(_event("content_block_delta", index=self.count,
                          delta={"type": "input_json_delta", "partial_json": call["function"]["arguments"]}))
        out.append(_event("content_block_stop", index=self.count))
        self.count += 1
        self.calls += 1
        return out


async def stream_events(state, req, run, mid: str):
    group = run.group
    parser = run.parser()
    start = {"id": mid, "type": "message", "role": "assistant", "model": state.model_name, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": usage(len(run.prompt_ids), 0, 0)}
    yield _event("message_start", message=start)
    b = _Blocks()
    handlers = {REASONING: b.thinking, CALL: b.call}
    try:
        async for _, out in group:
            for kind, value in parser.feed(out.new_text or "", final=out.finished):
                for e in handlers.get(kind, b.text)(value):
                    yield e
    except Exception as e:  # noqa: BLE001 - the headers are out: report in-band
        yield _event("error", error={"type": "api_error",
                                     "message": f"the engine failed while generating: {type(e).__name__}: {e}"})
        return
    finally:
        run.watcher.cancel()
        group.abort()
    res = group.results[0]
    for e in b.close_thinking():
        yield e
    if not (b.texts or b.calls or b.thoughts):  # a text block, if empty, unless calls or thinking are the reply
        for e in b.text(""):
            yield e
    for e in b.close_text():
        yield e
    seq = await state.run_cpu(matched_stop, state, res, req.stop_sequences)
    final = usage(len(run.prompt_ids), len(res.token_ids), res.cached_tokens)
    yield _event("message_delta", delta={"stop_reason": stop_reason(res.finish_reason, b.calls > 0, seq),
                                         "stop_sequence": seq}, usage=final)
    yield _event("message_stop")
