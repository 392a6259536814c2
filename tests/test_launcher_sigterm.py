"""SIGTERM to `mlx.launch` stops every rank of a served group (runtime/distributed/launcher_watch.py):
the launcher dies by the signal, rank 0 sees its parent gone, drains and sends the shutdown plan,
and the follower exits with it. Subprocesses: the real launcher, two ranks, the ring backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from test_distributed import GRAPHC, LAUNCH, _free_ports


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_to_the_launcher_stops_every_rank(model_dir):
    port, ring = _free_ports(2)
    launcher = subprocess.Popen([*LAUNCH, "-n", "2", "--backend", "ring", "-p", str(ring), "--", GRAPHC, "serve",
                                 "--model", str(model_dir("llama")), "--port", str(port), "--log-level", "warning",
                                 "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.PIPE, start_new_session=True)
    ranks: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert launcher.poll() is None, "the launch ended while starting"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        ranks = _children(launcher.pid)
        assert len(ranks) == 2, ranks
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
        deadline = time.time() + 60
        while time.time() < deadline and any(_alive(r) for r in ranks):
            time.sleep(0.2)
        assert not any(_alive(r) for r in ranks), "ranks still running after SIGTERM to their launcher"
    finally:
        for pid in [launcher.pid, *ranks]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=10)
