"""`graphc bench` without the `bench` extra: its workloads still import and run; --serving and
--agent-replay, which drive servers over httpx, stop with the install command."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
sys.modules["httpx"] = None  # as if the extra were not installed: `import httpx` raises ImportError
from graphc.benchmarks import commands
from graphc.benchmarks.serving import http
assert http.httpx is None
try:
    http.require("--serving")
except SystemExit as e:
    print(e)
"""


def test_bench_imports_without_httpx_and_the_server_benches_say_what_to_install():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "graphc bench --serving needs httpx" in out.stdout and "pip install -e '.[bench]'" in out.stdout
