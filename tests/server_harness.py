"""A live graphc server on loopback for tests: uvicorn on a thread, on a port the OS picked."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time

import httpx
import uvicorn

from graphc.runtime import Engine
from graphc.runtime.server import ServerConfig, create_app

MODEL = "tiny"  # served model name in every test server
_http = httpx.Client(timeout=30)  # reused: a new client per call costs ~30 ms (TLS context)


class LiveServer:
    def __init__(self, app):
        self.app = app
        # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only then, and without it
        # every response pays a 40 ms Nagle / delayed-ACK stall (headers and body are two writes).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def state(self):
        return self.app.state.graphc

    def start(self) -> "LiveServer":
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def metric(self, name: str, **labels) -> float:
        """One sample of /metrics (labels must match exactly those given, in any order)."""
        text = _http.get(self.url + "/metrics").text
        for line in text.splitlines():
            m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == str(v) for k, v in labels.items()):
                return float(m.group(3))
        raise KeyError(f"{name}{labels} not in /metrics")


@contextlib.contextmanager
def live_server(model_path=None, *, engine: Engine | None = None, loader=None, **config):
    """Serve `engine` (or Engine.load(model_path), or what `loader` returns) until the block ends."""
    config.setdefault("served_model_name", MODEL)
    cfg = ServerConfig(**config)
    if engine is None and loader is None:
        extra = {"kv_budget_tokens": cfg.kv_budget_tokens} if cfg.kv_budget_tokens is not None else {}
        engine = Engine.load(model_path, max_batch=cfg.max_batch, prefill_chunk=cfg.prefill_chunk, **extra)
    srv = LiveServer(create_app(cfg, engine=engine, loader=loader)).start()
    try:
        yield srv
    finally:
        srv.stop()


def wait_until(cond, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()
