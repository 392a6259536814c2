"""The consumer's side of AsyncEngine: where a request's events arrive, as plain values.

The engine thread puts one `StreamEvent` per delta (and one for a failure) on the outbox each
submission names: anything with a thread-safe `put(event)`. A thread without an event loop
hands a `queue.SimpleQueue` (BlockingStream); an event loop hands a `LoopOutbox`, which moves
the event into that loop's `asyncio.Queue` with `call_soon_threadsafe` (StreamGroup). Nothing
of the consumer's runs on the engine thread but that `put`. The engine hands all of one
iteration's events for one loop over in a single `call_soon_threadsafe` (`deliver_all`): each
such call writes to the loop's wake-up pipe and is a handle the loop runs, so a step of 64
streams cost the engine thread 64 of them. On this project's 2-core CPU, 64 streams, 300 steps
2 ms apart (`python benchmarks/probes/loop_handoff.py`, 3 repeats): the engine thread's time to
hand over a step's events 0.44-1.05 ms one call an event, 0.03-0.04 ms one call a step; the
loop's CPU per event 11-14 us against 6.4-6.8 us.
"""

from __future__ import annotations

import asyncio
import queue
import time
from typing import TYPE_CHECKING, Iterator

import attrs

from .latency_histograms import SharedHistogram
from .request import GenerationResult, RequestOutput

if TYPE_CHECKING:
    from .async_engine import AsyncEngine


@attrs.frozen
class StreamEvent:
    """One event of one request: a delta (`out`; with `result` once it finished), or `error`
    (the engine failed; the request is over)."""

    out: RequestOutput | None
    result: GenerationResult | None = None
    error: BaseException | None = None


@attrs.frozen
class LoopOutbox:
    """An outbox for an event loop: `put` (on the engine thread) queues (index, event) on `queue`
    in `loop`'s own thread."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    index: int = 0

    def put(self, event: StreamEvent) -> None:
        self.loop.call_soon_threadsafe(self.deliver, event)

    def deliver(self, event: StreamEvent) -> None:
        """On `loop`'s thread: queue the event (AsyncEngine hands a step's events for one loop
        over in one call_soon_threadsafe, `deliver_all`)."""
        self.queue.put_nowait((self.index, event))


def deliver_all(items: list, sent_at: float | None = None, waits: SharedHistogram | None = None) -> None:
    """On an event loop's thread: each (LoopOutbox, event) of one engine iteration, in order.
    `waits` observes how long the hand-over waited for the loop since `sent_at` (perf_counter)."""
    if waits is not None and sent_at is not None:
        waits.observe(time.perf_counter() - sent_at)
    for outbox, event in items:
        outbox.deliver(event)


def hand_over(outgoing: list, waits: SharedHistogram | None, undeliverable) -> None:
    """Each (outbox, event) of one engine iteration to its outbox, in order: an event loop's
    LoopOutboxes in one call_soon_threadsafe (`deliver_all`, timed into `waits`), any other
    outbox by its `put`. A consumer that went away (a closed loop, a failing put) gets
    `undeliverable(event)`: it must not stop the engine."""
    by_loop: dict = {}
    for outbox, ev in outgoing:
        if isinstance(outbox, LoopOutbox):
            by_loop.setdefault(outbox.loop, []).append((outbox, ev))
            continue
        try:
            outbox.put(ev)
        except Exception:
            undeliverable(ev)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(deliver_all, items, time.perf_counter(), waits)
        except Exception:  # its loop closed
            for _, ev in items:
                undeliverable(ev)


class StreamGroup:
    """Deltas of several requests on one asyncio queue: `async for index, out in group`.

    Leaving early (`aclose()`, `async with` exit, cancellation) aborts what is unfinished.
    After the loop ends, `results[i]` holds each item's GenerationResult."""

    def __init__(self, aengine: "AsyncEngine", loop: asyncio.AbstractEventLoop, n: int):
        self._aengine = aengine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.request_ids: list[str | None] = [None] * n
        self.prompt_ids: list[list[int] | None] = [None] * n
        self.results: list[GenerationResult | None] = [None] * n
        self._open = n

    def outbox(self, index: int) -> LoopOutbox:
        """Where item `index`'s events go (AsyncEngine.submit's `outbox`)."""
        return LoopOutbox(self._loop, self._queue, index)

    def accepted(self, accepted: list[tuple[str, list[int]]]) -> None:
        """The engine took every item: (request id, prompt ids) of each, in order."""
        for i, (rid, ids) in enumerate(accepted):
            self.request_ids[i], self.prompt_ids[i] = rid, ids

    @property
    def finished(self) -> bool:
        return self._open == 0

    def abort(self) -> None:
        """Abort every unfinished request of the group (safe to call more than once)."""
        for i, rid in enumerate(self.request_ids):
            if rid is not None and self.results[i] is None:
                self._aengine.abort(rid)

    def __aiter__(self):
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        if self._open == 0:
            raise StopAsyncIteration
        index, ev = await self._queue.get()
        if ev.error is not None:
            self._open -= 1
            self.results[index] = ev.result
            raise ev.error
        if ev.out.finished:
            self._open -= 1
            self.results[index] = ev.result
        return index, ev.out

    async def aclose(self) -> None:
        if self._open:
            self.abort()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


class RequestStream:
    """Deltas of one request (`async for out in stream`); `result` once it finished."""

    def __init__(self, group: StreamGroup):
        self._group = group

    @property
    def request_id(self) -> str:
        return self._group.request_ids[0]

    @property
    def prompt_ids(self) -> list[int]:
        return self._group.prompt_ids[0]

    @property
    def result(self) -> GenerationResult | None:
        return self._group.results[0]

    @property
    def finished(self) -> bool:
        return self._group.finished

    def abort(self) -> None:
        self._group.abort()

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        return (await self._group.__anext__())[1]

    async def aclose(self) -> None:
        await self._group.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


class BlockingStream:
    """A plain iterator of deltas for a thread without an event loop."""

    def __init__(self, aengine: "AsyncEngine", prompt, params, request_id, timeout):
        self._aengine = aengine
        self._q: queue.SimpleQueue = queue.SimpleQueue()  # the outbox: its put is thread-safe
        self._timeout = timeout
        self.result: GenerationResult | None = None
        self._done = False
        fut = aengine.submit(prompt, params, self._q, request_id)
        self.request_id, self.prompt_ids = fut.result(timeout)

    def __iter__(self) -> Iterator[RequestOutput]:
        return self

    def __next__(self) -> RequestOutput:
        if self._done:
            raise StopIteration
        try:
            ev = self._q.get(timeout=self._timeout)
        except queue.Empty:
            self.close()
            raise TimeoutError(f"no output from request {self.request_id} in {self._timeout}s") from None
        if ev.error is not None:
            self._done = True
            raise ev.error
        if ev.out.finished:
            self._done, self.result = True, ev.result
        return ev.out

    def close(self) -> None:
        if not self._done:
            self._aengine.abort(self.request_id)
            self._done = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
