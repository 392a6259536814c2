"""Streaming /v1/responses: the documented event sequence, each event numbered.

    response.created, response.in_progress
    per thinking:   response.output_item.added (a reasoning item), response.reasoning_text.delta...,
                    response.reasoning_text.done, response.output_item.done
    per text item:  response.output_item.added, response.content_part.added,
                    response.output_text.delta..., response.output_text.done,
                    response.content_part.done, response.output_item.done
    per tool call:  response.output_item.added, response.function_call_arguments.delta,
                    response.function_call_arguments.done, response.output_item.done
    response.completed (response.incomplete when max_output_tokens cut it short)

Every event is `event: <type>` + `data: <json with the same type and sequence_number>`, as
OpenAI sends them. Text before a tool call is its own message item, closed when the call
starts; tool markup never reaches the client as text (tool_output.ToolStream holds it back).
An engine failure after the headers are out is an `error` event, then response.failed.
"""

from __future__ import annotations

import json

from .chat_run import CALL, REASONING
from .responses_output import (call_item, message_item, new_id, reasoning_item, reasoning_tokens, status_of,
                               text_part, usage)


class _Events:
    def __init__(self):
        self.seq = 0

    def __call__(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


class _Builder:
    """The output items as they are generated; each method returns the events it implies."""

    def __init__(self, ev: _Events):
        self.ev = ev
        self.output: list[dict] = []
        self.msg: dict | None = None  # the open message item
        self.text = ""
        self.texts: list[str] = []  # every message's text, for the stored conversation
        self.calls: list[dict] = []
        self.thought: dict | None = None  # the open reasoning item
        self.reasoning = ""
        self.messages = 0

    def add_reasoning(self, piece: str) -> list[str]:
        out = []
        if self.thought is None:
            self.thought = reasoning_item(new_id("rs"), None, "in_progress")
            out.append(self.ev("response.output_item.added", output_index=len(self.output),
                               item=dict(self.thought)))
            self.output.append(self.thought)
        self.reasoning += piece
        out.append(self.ev("response.reasoning_text.delta", item_id=self.thought["id"],
                           output_index=self.output.index(self.thought), content_index=0, delta=piece))
        return out

    def close_reasoning(self) -> list[str]:
        if self.thought is None:
            return []
        idx, item = self.output.index(self.thought), self.thought
        item.update(status="completed", content=[{"type": "reasoning_text", "text": self.reasoning}])
        self.thought = None
        return [self.ev("response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0,
                        text=self.reasoning),
                self.ev("response.output_item.done", output_index=idx, item=dict(item))]

    def add_text(self, piece: str) -> list[str]:
        out = self.close_reasoning()
        if self.msg is None:
            self.messages += 1
            self.msg, self.text = message_item(new_id("msg"), None, "in_progress"), ""
            idx = len(self.output)
            self.output.append(self.msg)
            out.append(self.ev("response.output_item.added", output_index=idx, item=dict(self.msg, content=[])))
            out.append(self.ev("response.content_part.added", item_id=self.msg["id"], output_index=idx,
                               content_index=0, part=text_part("")))
        if piece:
            self.text += piece
            out.append(self.ev("response.output_text.delta", item_id=self.msg["id"], output_index=self._idx(),
                               content_index=0, delta=piece, logprobs=[]))
        return out

    def _idx(self) -> int:
        return self.output.index(self.msg)

    def close_text(self, status: str) -> list[str]:
        if self.msg is None:
            return []
        idx, item_id, part = self._idx(), self.msg["id"], text_part(self.text)
        self.msg.update(status=status, content=[part])
        out = [self.ev("response.output_text.done", item_id=item_id, output_index=idx, content_index=0,
                       text=self.text, logprobs=[]),
               self.ev("response.content_part.done", item_id=item_id, output_index=idx, content_index=0, part=part),
               self.ev("response.output_item.done", output_index=idx, item=dict(self.msg))]
        self.texts.append(self.text)
        self.msg = None
        return out

    def add_call(self, call: dict) -> list[str]:
        out = self.close_reasoning() + self.close_text("completed")
        idx, item = len(self.output), call_item(new_id("fc"), call, "in_progress", arguments="")
        self.output.append(item)
        self.calls.append(call)
        args = call["function"]["arguments"]
        out.append(self.ev("response.output_item.added", output_index=idx, item=dict(item)))
        out.append(self.ev("response.function_call_arguments.delta", item_id=item["id"], output_index=idx,
                           delta=args))
        out.append(self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                           name=item["name"], arguments=args))
        item.update(arguments=args, status="completed")
        out.append(self.ev("response.output_item.done", output_index=idx, item=dict(item)))
        return out


async def stream_events(state, run, shell, keep):
    """The SSE body; `keep(text, calls, response)` stores the finished response."""
    ev, group = _Events(), run.group
    b = _Builder(ev)
    parser = run.parser()
    handlers = {REASONING: b.add_reasoning, CALL: b.add_call}
    yield ev("response.created", response=shell.render("in_progress", []))
    yield ev("response.in_progress", response=shell.render("in_progress", []))
    try:
        async for _, out in group:
            for kind, value in parser.feed(out.new_text or "", final=out.finished):
                for e in handlers.get(kind, b.add_text)(value):
                    yield e
    except Exception as e:  # noqa: BLE001 - the headers are out: report in-band, as OpenAI does
        msg = f"the engine failed while generating: {type(e).__name__}: {e}"
        yield ev("error", code="engine_error", message=msg, param=None)
        yield ev("response.failed", response=shell.render(
            "failed", b.output, None, None, {"code": "server_error", "message": msg}))
        return
    finally:
        run.watcher.cancel()
        group.abort()
    res = group.results[0]
    status, incomplete, error = status_of(res.finish_reason)
    for e in b.close_reasoning():
        yield e
    if not (b.messages or b.calls or b.reasoning):  # a message, if empty, unless calls or reasoning are the reply
        for e in b.add_text(""):
            yield e
    for e in b.close_text("completed" if status == "completed" else "incomplete"):
        yield e
    thought = await state.run_cpu(reasoning_tokens, state, b.reasoning or None)
    body = shell.render(status, b.output, usage(len(run.prompt_ids), len(res.token_ids), res.cached_tokens, thought),
                        incomplete, error)
    keep("\n".join(b.texts) or None, b.calls, body)
    kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(status, "response.failed")
    yield ev(kind, response=body)
