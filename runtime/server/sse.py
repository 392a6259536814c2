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
