"""The scheduler: plain Python state (queues, counters); it decides, the runner does.

Each engine step: spend up to `prefill_chunk` prompt tokens on waiting requests
(chunked, so a long prompt never stalls the decode batch for more than one chunk),
then run one decode step for every running request.
"""

from __future__ import annotations

from collections import deque

import attrs

from .request import Request, Status


@attrs.define
class Schedule:
    prefill: list  # (request, n_tokens) chunks to run this step, in order
    decode: bool


class Scheduler:
    def __init__(self, *, max_batch: int = 64, prefill_chunk: int = 512, admit=None, defer=None):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        # admit(req): match a waiting request against the prefix cache before its first
        # chunk is sized (it sets req.prefilled to the cached length). Idempotent.
        self.admit = admit
        # defer(req, ahead): True when `req` shares a longer prefix with requests scheduled
        # ahead of it this step than the cache holds: it waits a step and then hits.
        self.defer = defer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.by_id: dict[str, Request] = {}

    def add(self, req: Request) -> None:
        if req.id in self.by_id:
            raise ValueError(f"request id '{req.id}' is already in use")
        self.waiting.append(req)
        self.by_id[req.id] = req

    def schedule(self) -> Schedule:
        budget = self.prefill_chunk
        chunks = []
        slots = self.max_batch - len(self.running)
        for req in self.waiting:
            if budget <= 0 or slots <= 0:
                break
            if self.admit is not None and req.status is Status.WAITING:
                if self.defer is not None and self.defer(req, [r for r, _ in chunks]):
                    break
                self.admit(req)
            n = min(budget, len(req.prompt_ids) - req.prefilled)
            chunks.append((req, n))
            budget -= n
            if req.prefilled + n == len(req.prompt_ids):
                slots -= 1
            else:
                break  # a request mid-prompt goes first next step too (FIFO, no starvation)
        return Schedule(chunks, decode=bool(self.running))

    def started(self, req: Request) -> None:
        """The request's prompt is in the cache and it joined the decode batch."""
        self.waiting.remove(req)
        req.status = Status.RUNNING
        self.running.append(req)

    def finish(self, req: Request, reason: str) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self.by_id.pop(req.id, None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
