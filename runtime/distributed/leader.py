"""Rank 0's engine: the Engine the server and scheduler talk to, plus the step plans it sends.

It is a plain Engine (the class Engine.load was called on: `leader_class`, so this module need
not import the engine that loads it) that records what changes the other ranks cannot see (requests added,
aborted) and, at the top of every `step()`, broadcasts them as one plan (plan.py), so every
rank then runs the same step on its shard. While idle it sends a heartbeat plan every
`heartbeat_s`, so the followers can tell an idle rank 0 from a hung one, and rank 0 learns
of a dead follower within a second even when no request is running.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import time
import weakref

import mlx.core as mx

from ..grammar import Grammar
from .group import GroupFailed, broadcast_bytes, broadcast_ints, is_group_error
from .plan import (HEADER_WORDS, IDLE, KIND_NAMES, NO_STEP_YET, SHUTDOWN, STEP, Plan, encode_params, error_digest,
                   step_digest)
from .watchdog import EXIT_GROUP_FAILED, Watchdog

log = logging.getLogger("graphc.distributed")

# Seconds a failed rank 0 keeps running after failing its requests, so the server can send
# the clients their errors before the process exits.
FAIL_GRACE_S = 2.0


class _SpecKeepingCompiler:
    """The engine's grammar compiler, remembering each compiled grammar's spec on its state:
    the followers compile the same spec themselves (a matcher cannot be sent)."""

    def __init__(self, base):
        self._base = base

    def compile(self, grammar):
        state = self._base.compile(grammar)
        state.spec = Grammar.coerce(grammar)
        return state

    def __getattr__(self, name):
        return getattr(self._base, name)


class LeaderEngine:
    """Rank 0's part of the engine `Engine.load(..., distributed=True)` returns there; use that like
    any Engine. Mixed in front of the engine class by `leader_class`, so every engine rank 0 runs
    is an instance of this class."""

    def start_group(self, group, watchdog: Watchdog, *, timeout: float, heartbeat_s: float = 1.0) -> None:
        """Become rank 0 of `group`: called once, right after construction, by the distributed
        loader (load.py), which built the engine and the watchdog. Starts the heartbeat thread."""
        self.group = group
        self.world_size = group.size()
        self._watchdog = watchdog
        self._timeout = timeout
        self._heartbeat_s = heartbeat_s
        self._lock = threading.Lock()  # one plan (and its step) at a time, from any thread
        self._events: list = []
        self._seq = 0
        self._last_digest = NO_STEP_YET
        self._last_sent = time.monotonic()
        self._closed = False
        self.failed: str | None = None
        ref = weakref.ref(self)
        atexit.register(lambda: (e := ref()) is not None and e.close())
        threading.Thread(target=_heartbeat_thread, args=(ref, heartbeat_s), name="graphc-heartbeat",
                         daemon=True).start()

    # -- what the followers must replay ----------------------------------------------------
    def add_request(self, prompt, params=None, request_id=None) -> str:
        self._check_open()
        if params is not None:
            encode_params(params)  # refuse what cannot cross processes before anything changes
        rid = super().add_request(prompt, params, request_id)
        req = self.scheduler.by_id[rid]
        self._events.append(["add", rid, list(req.prompt_ids), encode_params(req.params)])
        return rid

    def abort(self, request_id: str) -> bool:
        done = super().abort(request_id)
        if done:
            self._events.append(["abort", request_id])
        return done

    @property
    def grammar_compiler(self):
        return _SpecKeepingCompiler(super().grammar_compiler)

    # -- the step ------------------------------------------------------------------------------
    def step(self):
        self._check_open()
        with self._lock:
            events, self._events = self._events, []
            self._send(Plan(STEP, self._seq, self._last_digest, events))
            try:
                with self._watchdog.armed(f"rank 0: step {self._seq - 1}", self._timeout):
                    outs = super().step()
            except Exception as e:
                self._last_digest = error_digest(e)
                if is_group_error(e):
                    self._fail(f"step {self._seq - 1} failed in a collective: {e}")
                raise
            self._last_digest = step_digest(outs)
            return outs

    def _send(self, plan: Plan) -> None:
        body = plan.body()
        what = f"rank 0: sending {KIND_NAMES[plan.kind]} plan {plan.seq}"
        try:
            with self._watchdog.armed(what, self._timeout):
                broadcast_ints(self.group, plan.header(len(body)), HEADER_WORDS)
                if body:
                    broadcast_bytes(self.group, body, len(body))
        except RuntimeError as e:
            self._fail(f"sending plan {plan.seq} to the other ranks failed: {e}")
        self._seq += 1
        self._last_sent = time.monotonic()

    def heartbeat(self) -> bool:
        """Called by the heartbeat thread every heartbeat_s / 2: an idle plan goes out when no
        step ran for heartbeat_s and nothing is in flight on the device. False once the engine is
        closed or failed: the thread stops."""
        if self._closed or self.failed:
            return False
        if self.runner.pending is not None or not self._lock.acquire(blocking=False):
            return True
        try:
            if time.monotonic() - self._last_sent >= self._heartbeat_s and self.runner.pending is None:
                self._send(Plan(IDLE, self._seq, self._last_digest))
        finally:
            self._lock.release()
        return True

    # -- ending ------------------------------------------------------------------------------
    def close(self) -> None:
        """Tell the followers to exit (code 0). Called at exit; later steps raise GroupFailed."""
        if self._closed:
            return
        # A step stuck in a collective holds the lock; the watchdog ends the process then.
        if not self._lock.acquire(timeout=5.0):
            log.warning("closing while a step is still running: the followers are not told")
            self._closed = True
            return
        try:
            if self._closed:
                return
            self._closed = True
            if self.failed is None:
                try:
                    self._send(Plan(SHUTDOWN, self._seq, self._last_digest))
                except GroupFailed:
                    pass
        finally:
            self._lock.release()

    def _check_open(self) -> None:
        if self.failed is not None:
            raise GroupFailed(self.failed)
        if self._closed:
            raise GroupFailed("the distributed engine was closed (its followers have exited)")

    def _fail(self, why: str) -> None:
        """The group is broken: say so, fail this step (the server fails its requests), exit soon."""
        if self.failed is None:
            self.failed = (f"the distributed group of {self.world_size} ranks failed: {why} — a rank died, "
                           "hung or lost its connection; rank 0 exits")
            log.error("%s", self.failed)
            sys.stderr.write(f"graphc rank 0: {self.failed} (exit {EXIT_GROUP_FAILED})\n")
            sys.stderr.flush()
            t = threading.Timer(FAIL_GRACE_S, _exit_failed)
            t.daemon = True
            t.start()
        raise GroupFailed(self.failed)


@functools.cache
def leader_class(engine_cls: type) -> type:
    """`engine_cls` with rank 0's part in front (one class per engine class)."""
    return type("LeaderEngine", (LeaderEngine, engine_cls), {"__doc__": LeaderEngine.__doc__,
                                                             "__module__": __name__})


def _exit_failed() -> None:
    os._exit(EXIT_GROUP_FAILED)


def _heartbeat_thread(ref, period: float) -> None:
    try:
        _beat(ref, period)
    finally:
        clear = getattr(mx, "clear_streams", None)  # this thread's MLX streams (see AsyncEngine._run)
        if clear is not None:
            clear()


def _beat(ref, period: float) -> None:
    while True:
        time.sleep(period / 2)
        engine = ref()
        if engine is None:
            return
        try:
            if not engine.heartbeat():
                return
        except GroupFailed:
            return  # _fail() reported it and will end the process
        except Exception:  # pragma: no cover - a bug here must not leave the group silent
            log.exception("heartbeat failed")
        del engine
