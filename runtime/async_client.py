"""The client side of an AsyncEngine (runtime/async_engine.py): its asyncio API and its blocking
API for threads without an event loop, all built on the thread-safe `submit` and `abort`."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import AsyncIterator

import attrs

from .async_streams import BlockingStream, RequestStream, StreamGroup
from .grammar import GrammarState
from .params import SamplingParams
from .request import GenerationResult, RequestOutput


class ClientAPI:
    """Mixed into AsyncEngine, which supplies `submit`, `abort` and `engine`."""

    # -- asyncio API ---------------------------------------------------------------------
    async def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                          request_id: str | None = None) -> RequestStream:
        """Submit and return a stream of deltas (an async iterator) once the engine accepted it."""
        group = await self.add_group([(prompt, params, request_id)])
        return RequestStream(group)

    async def add_group(self, items: list[tuple]) -> StreamGroup:
        """Submit several (prompt, params, request_id) at once; their deltas arrive on one
        stream tagged with each item's index (for OpenAI `n` and prompt lists). If any item
        is rejected, the others are aborted and the error is raised."""
        loop = asyncio.get_running_loop()
        # Compile grammars here, in a worker thread: a large JSON schema can take a while, and
        # compiled on the engine thread it would stall every stream's decoding meanwhile.
        items = [(p, await self._precompiled(loop, sp), rid) for p, sp, rid in items]
        group = StreamGroup(self, loop, len(items))
        futs = []
        try:
            for i, (prompt, params, rid) in enumerate(items):
                futs.append(self.submit(prompt, params, group.outbox(i), rid))
            accepted = [await asyncio.wrap_future(f) for f in futs]
        except BaseException:
            for f in futs:  # abort what started; the rest never did
                self._abort_when_accepted(f)
            raise
        group.accepted(accepted)
        return group

    async def _precompiled(self, loop, params):
        if params is None or params.grammar is None or isinstance(params.grammar, GrammarState):
            return params
        state = await loop.run_in_executor(None, self.engine.grammar_compiler.compile, params.grammar)
        return attrs.evolve(params, grammar=state)  # one matcher per request (it is stateful)

    def _abort_when_accepted(self, fut: concurrent.futures.Future) -> None:
        def done(f):
            if not f.cancelled() and f.exception() is None:
                self.abort(f.result()[0])

        fut.add_done_callback(done)

    async def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
                     request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Deltas of one request. Leaving the loop early (break, cancel, exception) aborts it."""
        s = await self.add_request(prompt, params, request_id)
        async with s:
            async for out in s:
                yield out

    async def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                       request_id: str | None = None) -> GenerationResult:
        """Run one request to completion; cancelling the awaiting task aborts it."""
        s = await self.add_request(prompt, params, request_id)
        async with s:
            async for _ in s:
                pass
        return s.result

    # -- blocking API for threads that have no event loop (e.g. http.server handlers) ------
    def iter_blocking(self, prompt: str | list[int], params: SamplingParams | None = None,
                      request_id: str | None = None, timeout: float | None = None) -> BlockingStream:
        """A plain iterator of deltas for the calling thread; closing it early aborts the request."""
        return BlockingStream(self, prompt, params, request_id, timeout)

    def generate_blocking(self, prompt: str | list[int], params: SamplingParams | None = None,
                          timeout: float | None = None) -> GenerationResult:
        with self.iter_blocking(prompt, params, timeout=timeout) as it:
            for _ in it:
                pass
        return it.result

