"""AsyncEngine: one Engine driven by its own background thread, fed from any thread or event loop.

    from graphc.runtime import AsyncEngine, Engine, SamplingParams
    aengine = AsyncEngine.load(lambda: Engine.load(model_dir))  # built on its own thread
    async for out in aengine.stream("Once upon a time", SamplingParams(max_tokens=32)):
        print(out.new_text, end="")
    aengine.shutdown()

Why a thread: `Engine` is plain Python state plus MLX arrays and is not thread-safe.
Every call that touches it runs on the engine thread. Values cross one queue each way:
in, the command queue (`Submit` a request, `Abort`, `Call`, `Stop`: plain values on a
`queue.SimpleQueue`); out, the outbox each submission names, which receives that request's
`StreamEvent`s (runtime/async_streams.py: for asyncio, into the submitting loop's
`asyncio.Queue`). When the engine has nothing to do the thread blocks on the command
queue: no busy spin.

`AsyncEngine(engine)` takes an engine built elsewhere (its lazy arrays are evaluated first, on
the calling thread); `AsyncEngine.load(build)` builds it on the engine thread, which keeps everything
MLX holds per thread together (what `graphc serve` does).

Thread-safe (call from anywhere): `submit`, `abort`, `call`, `warm_up`, `shutdown`, `add_request`, `stream`,
`generate`, `add_group`, `iter_blocking`, `generate_blocking`, the `num_inflight`/`snapshot` reads.
See docs/embedding.md.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import logging
import queue
import threading
import time
import weakref
from typing import Callable

import mlx.core as mx

from .async_client import ClientAPI
from .async_commands import Abort, Call, LiveRequest, Stop, Submit
from .async_streams import BlockingStream, LoopOutbox, RequestStream, StreamEvent, StreamGroup, hand_over  # noqa: F401 (re-exported)
from .engine import Engine
from .engine_closed import EngineClosed  # re-exported: the server and tests catch it here
from .engine_snapshot import EngineSnapshot, Snapshots
from .latency_histograms import SharedHistogram, observe, observe_all, step_kind
from .params import SamplingParams
from .request import RequestOutput
from .thread_handoff import settle

__all__ = ["AsyncEngine", "BlockingStream", "EngineClosed", "EngineSnapshot", "LoopOutbox", "RequestStream",
           "StreamEvent", "StreamGroup"]

log = logging.getLogger("graphc.async_engine")


_running: "weakref.WeakSet[AsyncEngine]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    """Stop engine threads the program forgot to shut down, so each clears its MLX streams."""
    for a in list(_running):
        a.shutdown(timeout=5)


class AsyncEngine(ClientAPI):
    """Runs `engine` on a daemon thread named `name`. Construct, use, then `shutdown()`."""

    # Idle this long before building the warm-up shapes the time caps left (Engine.idle_warm).
    IDLE_WARM_AFTER_S = 0.5

    def __init__(self, engine: Engine | None, *, name: str = "graphc-engine", tps_window_s: float = 10.0,
                 _build: Callable[[], Engine] | None = None):
        """`engine`: one built on this thread (None only with `_build`, which `load` passes)."""
        if _build is None:
            # Built on this thread, stepped on the engine thread: MLX evaluates a lazy array only on
            # the thread whose stream made it, so anything the load left lazy is evaluated here.
            settle(engine)
        self.engine = engine
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, LiveRequest] = {}  # engine thread only
        self._outgoing: list = []  # (outbox, event) of this iteration, sent after the snapshot (engine thread only)
        self._lock = threading.Lock()
        self._inflight = 0
        self._closed = False
        self._finished: collections.Counter = collections.Counter()  # engine thread only
        self._latency: dict = {}  # name -> Histogram of finished requests (engine thread; values, for snapshots)
        self._handover = SharedHistogram()  # engine -> event loop waits, observed on the loops' threads
        self._snapshots = Snapshots(tps_window_s)
        self.snapshot = EngineSnapshot(time=time.time())
        self.error: BaseException | None = None  # set when the engine thread died
        self._built: concurrent.futures.Future = concurrent.futures.Future()
        self._busy_at = time.perf_counter()  # the last step or command (engine thread only)
        self._thread = threading.Thread(target=self._run, args=(_build,), name=name, daemon=True)
        _running.add(self)  # before the thread starts: a failed build takes it out again
        self._thread.start()

    @classmethod
    def load(cls, build: Callable[[], Engine], *, name: str = "graphc-engine",
             tps_window_s: float = 10.0) -> "AsyncEngine":
        """An AsyncEngine whose engine `build()` makes on the engine thread itself, e.g.
        `AsyncEngine.load(lambda: Engine.load(model_dir))`; blocks until it is built and raises
        what `build` raised. Loading, compiling, the self-check, the warm-up and every step then run
        on one thread, which keeps what MLX holds per thread: its streams (an array left lazy by
        a load on another thread can only be evaluated there) and, on CUDA, its cuDNN plans."""
        self = cls(None, name=name, tps_window_s=tps_window_s, _build=build)
        try:
            self._built.result()
        except BaseException:
            self._thread.join()
            raise
        return self

    # -- thread-safe primitives -------------------------------------------------------
    @property
    def num_inflight(self) -> int:
        """Requests submitted and not finished yet (waiting, prefilling or running)."""
        return self._inflight

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def submit(self, prompt: str | list[int], params: SamplingParams | None, outbox,
               request_id: str | None = None) -> concurrent.futures.Future:
        """Queue a request; the future resolves to (request_id, prompt_ids) once the engine took it,
        or raises the engine's ValueError for a bad prompt or params. Its deltas arrive on `outbox`
        as StreamEvents: `outbox.put(event)` is called on the engine thread, so it must be
        thread-safe and quick (a `queue.SimpleQueue`, or async_streams.LoopOutbox for a loop)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is shut down")
            self._inflight += 1
        self._cmds.put(Submit(prompt, params, request_id, outbox, fut))
        return fut

    def abort(self, request_id: str) -> None:
        """Stop a request from any thread; its stream ends with finish_reason 'abort'.
        Unknown or finished ids are ignored."""
        if not self._closed:
            self._cmds.put(Abort(request_id))

    def call(self, fn: Callable[[Engine], object]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between steps; a future of its return value. For
        work outside the request walk (embeddings, inspection); requests go through `submit`."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed:
            fut.set_exception(EngineClosed("the engine is shut down"))
            return fut
        self._cmds.put(Call(fn, fut))
        return fut

    def warm_up(self, shapes: bool | None = None, agent: bool | None = None) -> float:
        """`Engine.warm_up()` on the engine thread, before traffic; blocks, returns its seconds.

        Why on this thread: MLX's CUDA backend keeps its command encoders, cuBLAS and cuDNN
        handles and its cuDNN attention plans per thread, so a warm-up run on another thread
        builds plans the engine thread never sees, and the first requests build them again, one
        ~40 ms plan per new shape inside every running stream's step (docs/scheduling.md)."""
        return self.call(lambda engine: engine.warm_up(shapes, agent)).result()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Abort every live request (their streams end with 'abort'), stop the thread, join it."""
        with self._lock:
            if self._closed:
                already = True
            else:
                already, self._closed = False, True
        if not already:
            self._cmds.put(Stop())
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the engine thread -----------------------------------------------------------------
    def _run(self, build: Callable[[], Engine] | None) -> None:
        try:
            if build is not None:
                try:
                    self.engine = build()
                except BaseException as e:
                    with self._lock:
                        self._closed = True
                    _running.discard(self)
                    self._built.set_exception(e)
                    return
            self._built.set_result(self.engine)
            self._loop()
        finally:
            # MLX keeps per-thread streams; a thread that used MLX must destroy them before it ends,
            # or the process can abort at exit ("terminate called without an active exception").
            clear = getattr(mx, "clear_streams", None)
            if clear is not None:
                clear()

    def _loop(self) -> None:
        eng = self.engine
        warmed = eng.warmed_on_thread
        if warmed is not None and warmed != threading.get_ident() and mx.default_device().type == mx.DeviceType.gpu:
            log.warning("the engine was warmed up on another thread: MLX's CUDA backend keeps attention plans "
                        "per thread, so the first requests build them again; call AsyncEngine.warm_up() instead")
        try:
            while True:
                # Block only when idle; between steps just drain what arrived. Idle with warm-up
                # shapes left (Engine.warm_idle): wait out the quiet period, then build one and
                # look at the queue again.
                block = not eng.has_unfinished()
                wait = self._quiet_left() if block and eng.idle_warm else None
                while True:
                    try:
                        cmd = self._cmds.get(block=block and wait != 0, timeout=wait or None)
                    except queue.Empty:
                        break
                    block, wait = False, None
                    self._busy_at = time.perf_counter()
                    if isinstance(cmd, Stop):
                        self._stop_all()
                        return
                    self._handle(cmd)
                if eng.has_unfinished():
                    self._busy_at = time.perf_counter()
                    try:
                        self._route(self._timed_step())
                    except Exception as e:  # one bad step must not kill the server
                        log.exception("engine step failed; failing its live requests")
                        self._fail_all(e)
                elif eng.idle_warm and not self._quiet_left():
                    eng.warm_idle()
                    continue  # nothing changed for clients: no snapshot to take
                # Snapshot before sending: a client that saw its request finish sees it gone from /metrics.
                self._snap()
                self._send()
        except BaseException as e:  # pragma: no cover - a bug in this loop itself
            log.exception("the engine thread died")
            self.error = e
            with self._lock:
                self._closed = True
            self._fail_all(e)
            self._drain_closed(e)
            self._send()

    def _quiet_left(self) -> float:
        """Seconds until the engine has been idle for IDLE_WARM_AFTER_S (0 once it has): a client
        that sends its next request as soon as an answer ends (an agent's loop, a chat's follow-up)
        finds the engine free, not inside a warm-up shape it cannot interrupt."""
        return max(0.0, self._busy_at + self.IDLE_WARM_AFTER_S - time.perf_counter())

    def _timed_step(self) -> list[RequestOutput]:
        """engine.step(), its wall time observed by what it did (latency_histograms.step_kind)."""
        eng = self.engine
        prompt, rows, t0 = eng.stats.get("computed_prompt_tokens", 0), len(eng.scheduler.running), time.perf_counter()
        outs = eng.step()
        kind = step_kind(eng.stats.get("computed_prompt_tokens", 0) - prompt, rows)
        self._latency = observe_all(self._latency, kind, [time.perf_counter() - t0])
        return outs

    def _handle(self, cmd) -> None:
        if isinstance(cmd, Submit):
            if not cmd.accepted.set_running_or_notify_cancel():
                self._done_one()
                return
            try:
                rid = self.engine.add_request(cmd.prompt, cmd.params, cmd.request_id)
            except Exception as e:  # bad prompt / params: the caller sees the ValueError
                self._done_one()
                cmd.accepted.set_exception(e)
                return
            req = self.engine.request(rid)
            self._live[rid] = LiveRequest(req, cmd.outbox)
            cmd.accepted.set_result((rid, list(req.prompt_ids)))
        elif isinstance(cmd, Abort):
            live = self._live.get(cmd.request_id)
            if live is not None and self.engine.abort(cmd.request_id):
                self._finish_aborted(cmd.request_id, live)
        elif isinstance(cmd, Call):
            if cmd.result.set_running_or_notify_cancel():
                try:
                    cmd.result.set_result(cmd.fn(self.engine))
                except BaseException as e:
                    cmd.result.set_exception(e)

    def _route(self, outs: list[RequestOutput]) -> None:
        """Each delta of the step to its request's outbox (sent after the snapshot)."""
        now, gaps = time.perf_counter(), []
        for out in outs:
            live = self._live.get(out.request_id)
            if live is None:
                continue  # added straight to the Engine by someone else; not ours to route
            if out.new_token_ids:  # the itl histogram: each gap between a stream's deltas
                gaps += [] if live.last_delta is None else [now - live.last_delta]
                live.last_delta = now
            result = None
            if out.finished:
                del self._live[out.request_id]
                self._finished[out.finish_reason] += 1
                self._latency = observe(self._latency, live.req)
                result = self.engine.result(live.req)
                self._done_one()
            self._outgoing.append((live.outbox, StreamEvent(out, result)))
        self._latency = observe_all(self._latency, "itl", gaps)

    def _finish_aborted(self, rid: str, live: LiveRequest) -> None:
        self._live.pop(rid, None)
        self._done_one()
        self._finished["abort"] += 1
        out = RequestOutput(rid, [], live.req.detokenizer.flush() if live.req.detokenizer else "", True, "abort")
        self._outgoing.append((live.outbox, StreamEvent(out, self.engine.result(live.req))))

    def _send(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        hand_over(outgoing, self._handover, self._undeliverable)  # one hand-over per event loop

    def _undeliverable(self, ev: StreamEvent) -> None:
        rid = getattr(ev.out, "request_id", "?")
        log.debug("dropping output for %s: its outbox failed", rid, exc_info=True)
        if ev.out is not None and not ev.out.finished:
            self.abort(ev.out.request_id)

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
            self._outgoing.append((live.outbox, StreamEvent(None, None, err)))

    def _stop_all(self) -> None:
        for rid, live in list(self._live.items()):
            self.engine.abort(rid)
            self._finish_aborted(rid, live)
        self._drain_closed(EngineClosed("the engine is shut down"))
        self._snap()
        self._send()

    def _drain_closed(self, err: BaseException) -> None:
        """Fail commands that raced with shutdown so no caller waits forever."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, Submit):
                self._done_one()
                if cmd.accepted.set_running_or_notify_cancel():
                    cmd.accepted.set_exception(err)
            elif isinstance(cmd, Call) and cmd.result.set_running_or_notify_cancel():
                cmd.result.set_exception(err)

    def _snap(self) -> None:
        latency = {**self._latency, "handover": self._handover.value} if self._handover.value.count else self._latency
        self.snapshot = self._snapshots.take(self.engine, self.snapshot, self._inflight, self._finished, latency)
