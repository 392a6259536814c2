"""A watchdog around collectives: a rank that hangs must end the group, not stall it forever.

A collective on a rank whose peer is stopped, deadlocked or unreachable blocks inside MLX and
cannot be interrupted from Python; a dead peer usually surfaces as an error ("connection to a
peer was lost"), a hung one never does. So every blocking phase (sending or waiting for a step
plan, running a step) is armed with a deadline, and a daemon thread ends the process with a
clear message and exit code 1 when one passes. The other ranks then see the connection drop
and end too.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

EXIT_GROUP_FAILED = 1
# The longest a step, or a wait for the next plan, may take. A wait for a plan includes the step
# still running on the device (chained decode), so this bounds the slowest step too. It is also
# how long a dead rank can go unnoticed when the backend hangs instead of failing (the ring
# backend does when a peer dies in the middle of a collective).
DEFAULT_TIMEOUT_S = 60.0
TIMEOUT_ENV = "GRAPHC_DIST_TIMEOUT"


def default_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        t = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if t <= 0:
        raise ValueError(f"{TIMEOUT_ENV} must be positive, got {raw!r}")
    return t


def die(rank: int, message: str) -> None:
    """Print why this rank ends and exit now (no cleanup: a thread may be stuck inside MLX)."""
    try:
        sys.stderr.write(f"graphc rank {rank}: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_GROUP_FAILED)


class Watchdog:
    def __init__(self, rank: int, *, poll_s: float = 0.2):
        # `kill -USR1 <pid>` prints every thread's Python stack: where a stuck rank waits.
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        self.rank = rank
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, float, str]] = {}  # thread id -> (deadline, timeout, what)
        self._thread = threading.Thread(target=self._run, name=f"graphc-watchdog-{rank}", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def armed(self, what: str, timeout: float):
        """Within the block, this thread must make progress in `timeout` seconds or the rank ends."""
        tid = threading.get_ident()
        with self._lock:
            prev = self._armed.get(tid)
            self._armed[tid] = (time.monotonic() + timeout, timeout, what)
        try:
            yield
        finally:
            with self._lock:
                if prev is None:
                    self._armed.pop(tid, None)
                else:
                    self._armed[tid] = prev

    def _run(self) -> None:
        while True:
            time.sleep(self._poll_s)
            now = time.monotonic()
            with self._lock:
                late = [(t, w) for d, t, w in self._armed.values() if now > d]
            if late:
                timeout, what = late[0]
                die(self.rank, f"{what} did not finish in {timeout:g} s: another rank is hung, dead or "
                               f"unreachable, so the group cannot go on; ending this rank (exit "
                               f"{EXIT_GROUP_FAILED}). Slow steps on purpose? raise {TIMEOUT_ENV}.")
