"""Graceful shutdown for `graphc serve`: SIGTERM / SIGINT drain the server, then exit 0.

uvicorn's own handling stops accepting connections, waits a fixed time, then cuts every
open stream mid-body (no final chunk, no `[DONE]`) and re-raises the signal, so the
process dies by it. Here the first signal instead:

1. stops admitting: new requests (and /health) get 503 with `Retry-After`;
2. lets running requests finish for up to `shutdown_timeout` seconds;
3. aborts the rest through the engine, so each stream ends with a final chunk whose
   finish_reason is "abort" and `data: [DONE]`, and each non-streaming request gets its
   JSON response (finish_reason "abort", the text so far);
4. then lets uvicorn close the (now finished) connections and exits with status 0.

A second signal skips the rest of the drain (step 3 at once); a third forces uvicorn out.
"""

from __future__ import annotations

import asyncio
import logging
import time

import uvicorn

log = logging.getLogger("graphc.server")

FLUSH_S = 5.0  # after the abort: time for streams to write their final chunk


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state, shutdown_timeout: float):
        super().__init__(config)
        self.state = state
        self.shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0
        self._hurry: asyncio.Event | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        self._hurry = asyncio.Event()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:  # runs in the main thread, between event-loop callbacks
        self._signals += 1
        if self._loop is None or not self._loop.is_running():
            self.should_exit = True  # not started yet: nothing to drain
            return
        if self._signals == 1:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))
        elif self._signals == 2:
            self._loop.call_soon_threadsafe(self._hurry.set)
        else:
            self.force_exit = self.should_exit = True
        # Never recorded in _captured_signals: uvicorn would re-raise it after exit and the
        # process would die by the signal instead of returning 0.

    async def _drain(self) -> None:
        state = self.state
        state.begin_drain()
        a = state.aengine
        live = a.num_inflight if a is not None else 0
        log.info("shutting down: refusing new requests, %d running may finish within %.0f s",
                 live, self.shutdown_timeout)
        deadline = time.monotonic() + self.shutdown_timeout
        while a is not None and a.num_inflight > 0 and time.monotonic() < deadline and not self._hurry.is_set():
            try:
                await asyncio.wait_for(self._hurry.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
        if a is not None and a.num_inflight > 0:
            log.info("shutdown timeout: aborting %d request(s) still running", a.num_inflight)
        if a is not None:
            # Aborts every live request (their streams get finish_reason "abort"), stops the thread.
            await asyncio.get_running_loop().run_in_executor(None, a.shutdown)
        # Let the aborted responses write their last chunk before uvicorn closes connections.
        end = time.monotonic() + FLUSH_S
        while self.server_state.tasks and time.monotonic() < end:
            await asyncio.sleep(0.02)
        self.should_exit = True
