"""Server-sent events and client disconnects.

A client that goes away must not keep its sequences running: `watch_disconnect` waits
on the ASGI receive channel (the body is already read, so the next message is the
disconnect) and aborts the request's group; the stream generators also abort in their
`finally`, which runs when the server cancels them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from fastapi import Request
from pydantic import BaseModel

from .errors import APIError

DONE = "data: [DONE]\n\n"


def sse(obj) -> str:
    if isinstance(obj, BaseModel):
        text = obj.model_dump_json()
    else:
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n"


async def _wait_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            on_disconnect()
            return


def watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> asyncio.Task:
    """A task that calls `on_disconnect` when the client leaves; cancel it when done."""
    return asyncio.get_running_loop().create_task(_wait_disconnect(request, on_disconnect))


async def drain(watcher, group, want_logprobs: bool) -> tuple[list[list], list[bool]]:
    """Run a non-streaming request group to the end: per choice, the logprob entries its deltas
    carried and whether they cover every token. Engine failures become a 500; the disconnect
    watcher stops and the group is aborted (a no-op once finished) whatever happens."""
    entries: list[list] = [[] for _ in group.results]
    complete = [True] * len(group.results)
    try:
        async for i, out in group:
            if want_logprobs:
                if out.new_logprobs is None:
                    complete[i] = complete[i] and not out.new_token_ids
                else:
                    entries[i].extend(out.new_logprobs)
    except Exception as e:
        raise APIError(500, f"the engine failed while generating: {type(e).__name__}: {e}", code="engine_error") from None
    finally:
        watcher.cancel()
        group.abort()
    return entries, complete


async def guarded(events, watcher, group):
    """A streaming response's events, made safe: an engine failure after the headers are out is
    reported in-band (an error event, then [DONE]), as OpenAI does; whatever happens — the end,
    an error, the client gone — the disconnect watcher stops and the group is aborted."""
    try:
        async for event in events:
            yield event
    except Exception as e:
        yield sse(APIError(500, f"the engine failed while generating: {type(e).__name__}: {e}",
                           code="engine_error").body())
        yield DONE
    finally:
        await events.aclose()
        watcher.cancel()
        group.abort()
