"""The examples/ scripts run: the stdlib http.server embedding, the asyncio embedding, the openai client."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import httpx
import pytest

from graphc.runtime import AsyncEngine, Engine
from server_harness import live_server, wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.load(model_dir("llama"))


def test_http_server_embedding(engine):
    mod = load_example("embed_http_server")
    aengine = AsyncEngine(engine)
    server = mod.make_server(aengine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        [ref] = engine.generate(["Once upon a time"], mod.SamplingParams(max_tokens=10))
        r = httpx.post(url + "/generate", json={"prompt": "Once upon a time", "max_tokens": 10})
        assert r.status_code == 200 and r.json()["text"] == ref.text
        with httpx.stream("POST", url + "/stream", json={"prompt": "Once upon a time", "max_tokens": 10}) as r:
            assert "".join(r.iter_text()) == ref.text
        assert httpx.post(url + "/generate", json={"prompt": "x", "temperature": -1}).status_code == 400
        assert httpx.post(url + "/generate", content=b"{nope").status_code == 400
        # Hang up mid-stream: the request is aborted, the engine goes idle.
        with httpx.stream("POST", url + "/stream", json={"prompt": "Hi", "max_tokens": 3000}) as r:
            next(r.iter_bytes())
        assert wait_until(lambda: aengine.num_inflight == 0 and aengine.snapshot.running == 0)
        assert httpx.get(url + "/health").json()["ok"] is True
    finally:
        server.shutdown()
        server.server_close()
        aengine.shutdown()


def test_asyncio_embedding_example(model_dir, monkeypatch, capsys):
    mod = load_example("embed_asyncio")
    monkeypatch.setattr(sys, "argv", ["embed_asyncio.py", "--model", str(model_dir("llama"))])
    mod.main()
    out = capsys.readouterr().out
    assert "Engine.stream:" in out and "AsyncEngine #3" in out and "generate():" in out


def test_openai_client_example(model_dir, monkeypatch, capsys):
    mod = load_example("client_openai")
    with live_server(model_dir("llama")) as srv:
        monkeypatch.setattr(sys, "argv", ["client_openai.py", "--base-url", srv.url + "/v1"])
        mod.main()
    out = capsys.readouterr().out
    assert "completion (" in out and "choice 2:" in out and "error 400" in out
    rating = json.loads(out.split("json_schema: ")[1].splitlines()[0])
    assert rating["mood"] in ("happy", "sad")
