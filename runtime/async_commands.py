"""The commands an AsyncEngine's engine thread takes from its queue (runtime/async_engine.py):
plain values, one class a kind, and the engine thread's record of each live request."""

from __future__ import annotations

import concurrent.futures
from typing import Callable

import attrs

from .engine import Engine
from .params import SamplingParams


@attrs.frozen
class Submit:
    prompt: object  # str or token ids
    params: SamplingParams | None
    request_id: str | None
    outbox: object  # where this request's StreamEvents go: anything with a thread-safe put(event)
    accepted: concurrent.futures.Future  # -> (request_id, prompt_ids), or the engine's ValueError


@attrs.frozen
class Abort:
    request_id: str


@attrs.frozen
class Call:
    fn: Callable[[Engine], object]
    result: concurrent.futures.Future


@attrs.frozen
class Stop:
    pass


@attrs.define
class LiveRequest:
    req: object  # the engine's Request (engine thread only)
    outbox: object
    last_delta: float | None = None  # perf_counter when its last delta with tokens was routed (the itl histogram)
