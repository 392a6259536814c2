"""A bench ended by a signal stops the servers it started (benchmarks/serving/servers.py).

The servers run in their own process groups, so SIGTERM to the bench (`timeout`, a scheduler)
does not reach them: without the handler they outlive it and keep their GPU memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

SERVE = textwrap.dedent("""
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

DRIVER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from graphc.benchmarks.serving.servers import Server, ServerSpec, free_port

    class Fake(ServerSpec):
        def argv(self, model, port, batch, extra):
            return [sys.executable, "-c", SERVE, str(port)]

    if sys.argv[2] == "own-handler":  # a handler the caller set is left alone
        signal.signal(signal.SIGTERM, lambda *a: os._exit(3))
    srv = Server(Fake("fake"), "unused", free_port(), 1, Path(sys.argv[1]) / "fake.log", ready_timeout=60)
    with srv:
        print(srv.proc.pid, flush=True)
        time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _drive(tmp_path, mode: str):
    script = tmp_path / "driver.py"
    script.write_text(f"SERVE = {SERVE!r}\n" + DRIVER)
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path), mode], stdout=subprocess.PIPE, text=True)
    server_pid = int(p.stdout.readline())
    assert _alive(server_pid)
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    return p.returncode, server_pid


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_the_bench_stops_its_servers(tmp_path):
    rc, server = _drive(tmp_path, "default")
    assert rc == 128 + signal.SIGTERM
    assert _gone_within(server, 10)


def test_a_handler_the_caller_set_is_kept_and_then_the_server_outlives_it(tmp_path):
    # what happens without the bench's handler: the server, in its own process group, survives
    rc, server = _drive(tmp_path, "own-handler")
    try:
        assert rc == 3
        assert not _gone_within(server, 1.0)
    finally:
        if _alive(server):
            os.killpg(server, signal.SIGKILL)
