"""How long /health takes while huge prompts are posted (figures for docs/reliability.md).

    python tests/chaos/measure_health.py            # tiny llama built in a temp folder

Posts, in background threads, a 4 MB prompt (refused before tokenizing) and, repeatedly, the
longest prompt text the server still tokenizes (max_prompt_chars), and polls /health meanwhile.
Prints the slowest /health answer. Not a test: timings are for the record, not asserted.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from server_harness import live_server  # noqa: E402

from graphc.compiler.modelgen import make_model  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model("llama", tmp)
        with live_server(model, max_body_bytes=8 * 1024 * 1024) as srv:  # the 4 MB prompt is read, then refused
            limit = srv.state.max_prompt_chars
            bodies = [("4 MB", "word " * (4 * 1024 * 1024 // 5))] + [(f"{limit} chars", "a b " * (limit // 4))] * 3
            done = threading.Event()
            codes = []

            def post():
                with httpx.Client(timeout=120) as c:
                    for name, text in bodies:
                        r = c.post(srv.url + "/v1/completions", json={"prompt": text, "max_tokens": 1})
                        codes.append((name, r.status_code, r.json()["error"]["code"] if r.status_code >= 400 else ""))
                done.set()

            t = threading.Thread(target=post)
            lat = []
            with httpx.Client(timeout=30) as c:
                t.start()
                while not done.is_set():
                    t0 = time.perf_counter()
                    assert c.get(srv.url + "/health").status_code == 200
                    lat.append(time.perf_counter() - t0)
                    time.sleep(0.01)
            t.join()
            print("posted:", codes)
            print(f"/health: {len(lat)} polls, max {max(lat) * 1000:.1f} ms, "
                  f"median {sorted(lat)[len(lat) // 2] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
