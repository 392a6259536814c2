"""Start and stop the two servers under test as subprocesses on one model folder.

Each runs in its own process group (so a server's worker children die with it) and logs to a
file next to the results; readiness is GET /health answering 200 (both servers have it).

Its own process group also means a signal to the bench does not reach the servers: a bench
ended by SIGTERM or SIGHUP (`timeout`, a closed terminal, a job scheduler) would leave them
running, holding the model and its KV in GPU memory, so the next bench's servers run out of
it. While a server is up, those signals stop every live server first, then end the bench
with SystemExit (the `with` blocks and the partial JSON still run).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .http import httpx

# mlx_lm.server has no ignore_eos: an additive logit bias this negative keeps its EOS ids from
# ever being picked, so it too generates exactly max_tokens (one add on the logits per step).
_EOS_BIAS = -1e4


# Log lines that mean a server broke rather than refused one request: mlx_lm.server's generation
# thread dies on a CUDA allocation failure and its HTTP side then fails every later request.
_FATAL = re.compile(r"out of memory|thread died|Traceback \(most recent call last\)|Segmentation fault", re.I)


@dataclass(frozen=True)
class ServerSpec:
    name: str

    def argv(self, model: str, port: int, batch: int, extra: list[str], traced: bool = False) -> list[str]:
        if self.name == "graphc":  # traced: every engine step recorded (benchmarks/serving/traced_serve.py)
            serve = ([sys.executable, "-m", "graphc.benchmarks.serving.traced_serve"] if traced
                     else [sys.executable, "-m", "graphc.cli", "serve"])
            return [*serve, "--model", model, "--port", str(port),
                    "--max-batch", str(batch), *extra]
        # Batching on, its concurrency set to graphc's max batch (mlx_lm/server.py's own flag names).
        return [sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", str(port),
                "--decode-concurrency", str(batch), "--prompt-concurrency", str(batch), *extra]

    def fixed_length_body(self, eos_ids: list[int]) -> dict:
        """Request fields that make the server generate exactly max_tokens."""
        if self.name == "graphc":
            return {"ignore_eos": True}
        return {"logit_bias": {str(i): _EOS_BIAS for i in eos_ids}} if eos_ids else {}


SERVERS = (ServerSpec("graphc"), ServerSpec("mlx_lm"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it), for a server to take."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LIVE: set = set()  # the Servers started and not yet stopped
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop_live_and_exit(signum, frame) -> None:
    for srv in list(_LIVE):
        srv.stop(grace=10.0)
    raise SystemExit(128 + signum)


def _stop_servers_on_signal() -> None:
    """Route SIGTERM / SIGHUP to `_stop_live_and_exit`, where the default (end at once) holds;
    a handler someone else set is theirs. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _stop_live_and_exit)


class Server:
    """`with Server(spec, model, port, batch, log_path) as url:` a ready server at `url`."""

    def __init__(self, spec: ServerSpec, model: str, port: int, batch: int, log_path: Path,
                 extra: list[str] | None = None, ready_timeout: float = 900.0, trace: Path | None = None,
                 env: dict[str, str] | None = None):
        self.spec, self.port, self.log_path, self.ready_timeout = spec, port, Path(log_path), ready_timeout
        traced = {"traced": True} if trace is not None else {}  # (a spec without tracing takes no such argument)
        self.argv = spec.argv(model, port, batch, extra or [], **traced)
        extra_env = {**(env or {}), **({"GRAPHC_STEP_TRACE": str(trace)} if trace is not None else {})}
        self.env = {**os.environ, **extra_env} if extra_env else None
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        shown = " ".join(f"{k}={v}" for k, v in (self.env or {}).items() if os.environ.get(k) != v)
        log.write(("\n$ " + (shown + " " if shown else "") + " ".join(self.argv) + "\n").encode())
        log.flush()
        t0 = time.perf_counter()
        _stop_servers_on_signal()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=self.env)
        _LIVE.add(self)
        log.close()  # the child holds its own copy
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with {self.proc.returncode} before it was ready; "
                                   f"log {self.log_path}:\n{self._tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.5)
        raise RuntimeError(f"{self.spec.name} not ready after {self.ready_timeout:.0f} s; log {self.log_path}:\n"
                           f"{self._tail()}")

    def log_size(self) -> int:
        """Bytes in the server's log so far (where `failure_since` starts reading)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def failure_since(self, offset: int) -> str | None:
        """The first line of the log after `offset` that says the server broke (out of memory, a
        dead generation thread, an exit), or None. A run's errors are the client's view; this is
        the server's reason, for the bench to print next to them."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.spec.name} exited with {self.proc.returncode}"
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        return next((line.strip() for line in text.splitlines() if _FATAL.search(line)), None)

    def _tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 20.0) -> None:
        _LIVE.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass  # already gone
