"""`Engine.stream`: stream one request's deltas while stepping the engine on the caller's event loop.

For scripts and notebooks that own one event loop and one engine. All streams of an
engine share one driver task that calls `engine.step()` and routes each delta to its
request's queue, yielding to the loop between steps. Each step runs on the loop's
thread (it blocks the loop for one step, a few ms on small models); a server that
must stay responsive runs the engine on its own thread with `AsyncEngine` instead.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import AsyncIterator

from .params import SamplingParams
from .request import RequestOutput

_drivers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _LoopDriver:
    def __init__(self, engine):
        self.engine = engine
        self.queues: dict[str, asyncio.Queue] = {}
        self.task: asyncio.Task | None = None

    def ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._drive(), name="graphc-engine-driver")

    async def _drive(self) -> None:
        eng = self.engine
        try:
            while eng.has_unfinished() and self.queues:
                for out in eng.step():
                    q = self.queues.get(out.request_id)
                    if q is not None:
                        q.put_nowait(out)
                await asyncio.sleep(0)  # let consumers (and new streams) run between steps
        except Exception as e:
            for q in self.queues.values():
                q.put_nowait(e)
            raise


async def stream_in_loop(engine, prompt, params: SamplingParams | None = None,
                         request_id: str | None = None) -> AsyncIterator[RequestOutput]:
    driver = _drivers.get(engine)
    if driver is None:
        driver = _drivers[engine] = _LoopDriver(engine)
    rid = engine.add_request(prompt, params, request_id)
    q: asyncio.Queue = asyncio.Queue()
    driver.queues[rid] = q
    finished = False
    try:
        driver.ensure_running()
        while not finished:
            out = await q.get()
            if isinstance(out, Exception):
                raise out
            finished = out.finished
            yield out
    finally:
        driver.queues.pop(rid, None)
        if not finished:
            engine.abort(rid)  # the consumer left early: free its slots now
