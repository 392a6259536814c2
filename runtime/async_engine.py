"""AsyncEngine: one Engine driven by its own background thread, fed from any thread or event loop.

    from graphc.runtime import AsyncEngine, Engine, SamplingParams
    aengine = AsyncEngine(Engine.load(model_dir))
    async for out in aengine.stream("Once upon a time", SamplingParams(max_tokens=32)):
        print(out.new_text, end="")
    aengine.shutdown()

Why a thread: `Engine` is plain Python state plus MLX arrays and is not thread-safe.
Every call that touches it runs on the engine thread; other threads only put
commands on a `queue.SimpleQueue` and receive deltas through sinks (for asyncio,
`loop.call_soon_threadsafe` into a per-request `asyncio.Queue`). When the engine
has nothing to do the thread blocks on the command queue: no busy spin.

Thread-safe (call from anywhere): `submit`, `abort`, `call`, `shutdown`, `add_request`,
`stream`, `generate`, `add_group`, `iter_blocking`, `generate_blocking`, the
`num_inflight`/`snapshot` reads. See docs/embedding.md.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import logging
import queue
import threading
import time
import weakref
from typing import AsyncIterator, Callable, Iterator

import attrs
import mlx.core as mx

from .engine import Engine
from .engine_closed import EngineClosed  # re-exported: the server and tests catch it here
from .grammar import GrammarState
from .params import SamplingParams
from .request import GenerationResult, RequestOutput

log = logging.getLogger("graphc.async_engine")

# on_output(out, result, error): called on the engine thread for every delta of one request;
# `result` is the GenerationResult with the final delta, `error` an exception if the engine failed.
Sink = Callable[[RequestOutput | None, GenerationResult | None, BaseException | None], None]


@attrs.frozen
class EngineSnapshot:
    """Engine state copied on the engine thread after each step, safe to read from any thread."""

    waiting: int = 0
    running: int = 0
    inflight: int = 0
    steps: int = 0
    stats: dict = attrs.field(factory=dict)
    kv_bytes: int = 0
    kv_live_bytes: int = 0  # of kv_bytes, the bytes holding the rows' own tokens (no padding, no spare capacity)
    kv_tokens: int = 0  # KV tokens the scheduler counts against its budget
    kv_budget: int | None = None  # the engine's kv_budget_tokens (None = unbounded)
    kv_peak: int = 0  # the most KV tokens counted against the budget after any step so far
    cache: dict = attrs.field(factory=dict)  # Engine.cache_stats(): prefix-cache pool and tree
    finished: dict = attrs.field(factory=dict)  # finish_reason -> requests finished that way
    generation_tps: float = 0.0  # generated tokens per second over the last few seconds
    time: float = 0.0


@attrs.define
class _Live:
    req: object  # the engine's Request (engine thread only)
    sink: Sink


_STOP = object()
_running: "weakref.WeakSet[AsyncEngine]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    """Stop engine threads the program forgot to shut down, so each clears its MLX streams."""
    for a in list(_running):
        a.shutdown(timeout=5)


class AsyncEngine:
    """Runs `engine` on a daemon thread named `name`. Construct, use, then `shutdown()`."""

    def __init__(self, engine: Engine, *, name: str = "graphc-engine", tps_window_s: float = 10.0):
        self.engine = engine
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}  # engine thread only
        self._outbox: list = []  # deliveries of this iteration, sent after the snapshot (engine thread only)
        self._lock = threading.Lock()
        self._inflight = 0
        self._closed = False
        self._tps_window_s = tps_window_s
        self._tps_samples: collections.deque = collections.deque()
        self._finished: collections.Counter = collections.Counter()  # engine thread only
        self._cache_stats: dict = {}
        self._cache_time = 0.0
        self.snapshot = EngineSnapshot(time=time.time())
        self.error: BaseException | None = None  # set when the engine thread died
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _running.add(self)

    # -- thread-safe primitives -------------------------------------------------------
    @property
    def num_inflight(self) -> int:
        """Requests submitted and not finished yet (waiting, prefilling or running)."""
        return self._inflight

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def submit(self, prompt: str | list[int], params: SamplingParams | None, on_output: Sink,
               request_id: str | None = None) -> concurrent.futures.Future:
        """Queue a request; the future resolves to (request_id, prompt_ids) once the engine took it,
        or raises the engine's ValueError for a bad prompt or params. `on_output` runs on the
        engine thread: keep it short and thread-safe (e.g. call_soon_threadsafe / queue.put)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is shut down")
            self._inflight += 1
        self._cmds.put(("add", prompt, params, request_id, on_output, fut))
        return fut

    def abort(self, request_id: str) -> None:
        """Stop a request from any thread; its stream ends with finish_reason 'abort'.
        Unknown or finished ids are ignored."""
        if not self._closed:
            self._cmds.put(("abort", request_id))

    def call(self, fn: Callable[[Engine], object]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between steps; a future of its return value."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed:
            fut.set_exception(EngineClosed("the engine is shut down"))
            return fut
        self._cmds.put(("call", fn, fut))
        return fut

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Abort every live request (their streams end with 'abort'), stop the thread, join it."""
        with self._lock:
            if self._closed:
                already = True
            else:
                already, self._closed = False, True
        if not already:
            self._cmds.put((_STOP,))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- asyncio API ---------------------------------------------------------------------
    async def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                          request_id: str | None = None) -> "RequestStream":
        """Submit and return a stream of deltas (an async iterator) once the engine accepted it."""
        group = await self.add_group([(prompt, params, request_id)])
        return RequestStream(group)

    async def add_group(self, items: list[tuple]) -> "StreamGroup":
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
                futs.append(self.submit(prompt, params, group._sink(i), rid))
        except BaseException:
            for f in futs:  # the rest never started; abort what did
                self._abort_when_accepted(f)
            raise
        try:
            accepted = [await asyncio.wrap_future(f) for f in futs]
        except BaseException:
            for f in futs:
                self._abort_when_accepted(f)
            raise
        group._accepted(accepted)
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
                      request_id: str | None = None, timeout: float | None = None) -> "BlockingStream":
        """A plain iterator of deltas for the calling thread; closing it early aborts the request."""
        return BlockingStream(self, prompt, params, request_id, timeout)

    def generate_blocking(self, prompt: str | list[int], params: SamplingParams | None = None,
                          timeout: float | None = None) -> GenerationResult:
        with self.iter_blocking(prompt, params, timeout=timeout) as it:
            for _ in it:
                pass
        return it.result

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            # MLX keeps per-thread streams; a thread that used MLX must destroy them before it ends,
            # or the process can abort at exit ("terminate called without an active exception").
            clear = getattr(mx, "clear_streams", None)
            if clear is not None:
                clear()

    def _loop(self) -> None:
        eng = self.engine
        try:
            while True:
                # Block only when idle; between steps just drain what arrived.
                block = not eng.has_unfinished()
                while True:
                    try:
                        cmd = self._cmds.get(block=block)
                    except queue.Empty:
                        break
                    block = False
                    if cmd[0] is _STOP:
                        self._stop_all()
                        return
                    self._handle(cmd)
                if eng.has_unfinished():
                    try:
                        self._dispatch(eng.step())
                    except Exception as e:  # one bad step must not kill the server
                        log.exception("engine step failed; failing its live requests")
                        self._fail_all(e)
                # Snapshot before delivering: a client that saw its request finish then sees
                # it gone from /metrics too.
                self._snap()
                self._flush()
        except BaseException as e:  # pragma: no cover - a bug in this loop itself
            log.exception("the engine thread died")
            self.error = e
            with self._lock:
                self._closed = True
            self._fail_all(e)
            self._drain_closed(e)
            self._flush()

    def _handle(self, cmd) -> None:
        kind = cmd[0]
        if kind == "add":
            _, prompt, params, rid, sink, fut = cmd
            if not fut.set_running_or_notify_cancel():
                self._done_one()
                return
            try:
                rid = self.engine.add_request(prompt, params, rid)
            except Exception as e:  # bad prompt / params: the caller sees the ValueError
                self._done_one()
                fut.set_exception(e)
                return
            req = self.engine.request(rid)
            self._live[rid] = _Live(req, sink)
            fut.set_result((rid, list(req.prompt_ids)))
        elif kind == "abort":
            live = self._live.get(cmd[1])
            if live is not None and self.engine.abort(cmd[1]):
                self._finish_aborted(cmd[1], live)
        elif kind == "call":
            _, fn, fut = cmd
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except BaseException as e:
                    fut.set_exception(e)

    def _dispatch(self, outs: list[RequestOutput]) -> None:
        for out in outs:
            live = self._live.get(out.request_id)
            if live is None:
                continue  # added straight to the Engine by someone else; not ours to route
            result = None
            if out.finished:
                del self._live[out.request_id]
                self._finished[out.finish_reason] += 1
                result = self.engine.result(live.req)
                self._done_one()
            self._deliver(live, out, result, None)

    def _finish_aborted(self, rid: str, live: _Live) -> None:
        self._live.pop(rid, None)
        self._done_one()
        self._finished["abort"] += 1
        out = RequestOutput(rid, [], live.req.detokenizer.flush() if live.req.detokenizer else "", True, "abort")
        self._deliver(live, out, self.engine.result(live.req), None)

    def _deliver(self, live: _Live, out, result, error) -> None:
        self._outbox.append((live, out, result, error))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for live, out, result, error in outbox:
            try:
                live.sink(out, result, error)
            except Exception:  # a consumer that went away (closed loop) must not stop the engine
                log.debug("dropping output for %s: its sink failed", getattr(out, "request_id", "?"), exc_info=True)
                if out is not None and not out.finished:
                    self.abort(out.request_id)

    def _done_one(self) -> None:
        with self._lock:
            self._inflight -= 1

    def _fail_all(self, err: BaseException) -> None:
        for rid, live in list(self._live.items()):
            try:
                self.engine.abort(rid)
            except Exception:
                log.exception("abort of %s after an engine error failed", rid)
            self._live.pop(rid, None)
            self._done_one()
            self._finished["error"] += 1
            self._deliver(live, None, None, err)

    def _stop_all(self) -> None:
        for rid, live in list(self._live.items()):
            self.engine.abort(rid)
            self._finish_aborted(rid, live)
        self._drain_closed(EngineClosed("the engine is shut down"))
        self._snap()
        self._flush()

    def _drain_closed(self, err: BaseException) -> None:
        """Fail commands that raced with shutdown so no caller waits forever."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                self._done_one()
                if cmd[5].set_running_or_notify_cancel():
                    cmd[5].set_exception(err)
            elif cmd[0] == "call" and cmd[2].set_running_or_notify_cancel():
                cmd[2].set_exception(err)

    def _cache(self, now: float) -> dict:
        """Prefix-cache stats, refreshed at most every 0.2 s while busy (they walk the radix
        tree) and always once idle, so a scrape after the work is done sees the final state."""
        fn = getattr(self.engine, "cache_stats", None)
        if fn is None:
            return {}
        if now - self._cache_time >= 0.2 or not self.engine.has_unfinished():
            self._cache_stats, self._cache_time = fn(), now
        return self._cache_stats

    def _snap(self) -> None:
        eng = self.engine
        now = time.time()
        stats = dict(eng.stats)
        gen = stats.get("generated_tokens", 0)
        samples = self._tps_samples
        if not samples or now - samples[-1][0] >= 0.25:
            samples.append((now, gen))
        while len(samples) > 2 and now - samples[0][0] > self._tps_window_s:
            samples.popleft()
        t0, g0 = samples[0]
        tps = (gen - g0) / (now - t0) if now > t0 else 0.0
        info = eng.load_info()
        self.snapshot = EngineSnapshot(
            kv_peak=max(self.snapshot.kv_peak, info["kv_tokens"]),
            waiting=info["waiting"], running=info["running"], inflight=self._inflight, steps=info["steps"],
            stats=stats, kv_bytes=info["kv_bytes"], kv_live_bytes=info["kv_live_bytes"], cache=self._cache(now), kv_tokens=info["kv_tokens"],
            kv_budget=info["kv_budget"], finished=dict(self._finished), generation_tps=tps, time=now)


class StreamGroup:
    """Deltas of several requests on one asyncio queue: `async for index, out in group`.

    Leaving early (`aclose()`, `async with` exit, cancellation) aborts what is unfinished.
    After the loop ends, `results[i]` holds each item's GenerationResult."""

    def __init__(self, aengine: AsyncEngine, loop: asyncio.AbstractEventLoop, n: int):
        self._aengine = aengine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.request_ids: list[str | None] = [None] * n
        self.prompt_ids: list[list[int] | None] = [None] * n
        self.results: list[GenerationResult | None] = [None] * n
        self._open = n

    def _sink(self, index: int) -> Sink:
        put, loop = self._queue.put_nowait, self._loop

        def sink(out, result, error):
            loop.call_soon_threadsafe(put, (index, out, result, error))

        return sink

    def _accepted(self, accepted: list[tuple[str, list[int]]]) -> None:
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
        index, out, result, error = await self._queue.get()
        if error is not None:
            self._open -= 1
            self.results[index] = result
            raise error
        if out.finished:
            self._open -= 1
            self.results[index] = result
        return index, out

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

    def __init__(self, aengine: AsyncEngine, prompt, params, request_id, timeout):
        self._aengine = aengine
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._timeout = timeout
        self.result: GenerationResult | None = None
        self._done = False
        fut = aengine.submit(prompt, params, lambda o, r, e: self._q.put((o, r, e)), request_id)
        self.request_id, self.prompt_ids = fut.result(timeout)

    def __iter__(self) -> Iterator[RequestOutput]:
        return self

    def __next__(self) -> RequestOutput:
        if self._done:
            raise StopIteration
        try:
            out, result, error = self._q.get(timeout=self._timeout)
        except queue.Empty:
            self.close()
            raise TimeoutError(f"no output from request {self.request_id} in {self._timeout}s") from None
        if error is not None:
            self._done = True
            raise error
        if out.finished:
            self._done, self.result = True, result
        return out

    def close(self) -> None:
        if not self._done:
            self._aengine.abort(self.request_id)
            self._done = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
