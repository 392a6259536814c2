"""Rank 0 stops when its launcher is told to: SIGTERM to `mlx.launch` ends the whole group.

mlx.launch forwards Ctrl-C (SIGINT) to its ranks, but SIGTERM kills only the launcher itself:
its ranks (each exec'd straight from the launcher, so the launcher is their parent) are
reparented and go on serving. Rank 0 therefore watches its parent; when the parent is gone it
sends itself SIGTERM, which `graphc serve` handles as a graceful drain (runtime/server/shutdown.py)
that ends with the shutdown plan every follower exits on. The followers need no watch of their
own: rank 0's shutdown plan, or its watchdog when rank 0 is gone, ends them."""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_S = 0.5  # how soon after the launcher dies rank 0 starts its drain


def stop_with_parent(poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that sends this process SIGTERM once its parent process has exited."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=watch, name="graphc-launcher-watch", daemon=True)
    t.start()
    return t
