"""/v1/responses and /v1/messages on a server with several models (runtime/server/models.py):
the request's `model` picks one, an unknown name is a 404 and a model still loading a 503 with
Retry-After, each in its protocol's own error shape."""

from __future__ import annotations

import httpx
import pytest

from server_harness import wait_until
from test_multi_model import GatedLoader, _serve, _status


@pytest.fixture(scope="module")
def srv(model_dir):
    loader = GatedLoader()
    paths = {"a": str(model_dir("llama")), "b": str(model_dir("llama", seed=1))}
    gate = loader.close("b")
    s = _serve(paths, loader, max_loaded_models=2)
    assert wait_until(lambda: _status(s, "a") == "loaded", 60)
    try:
        yield s, gate
    finally:
        gate.set()
        s.stop()


def _responses(s, model):
    return httpx.post(s.url + "/v1/responses", timeout=60, json={"model": model, "input": "hi", "max_output_tokens": 2})


def _messages(s, model):
    return httpx.post(s.url + "/v1/messages", timeout=60, json={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


def test_routing_loading_and_unknown_models(srv):
    s, gate = srv
    r = _responses(s, "b")  # b's load starts now and waits on the gate
    assert r.status_code == 503 and r.headers.get("retry-after") and r.json()["error"]["message"]
    r = _messages(s, "b")
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
    assert _responses(s, "a").json()["model"] == "a"
    assert _messages(s, "a").json()["model"] == "a"
    gate.set()
    assert wait_until(lambda: _status(s, "b") == "loaded", 60)
    assert _responses(s, "b").json()["model"] == "b"
    assert _messages(s, "b").json()["model"] == "b"
    r = _responses(s, "zzz")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = _messages(s, "zzz")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(s.url + "/v1/messages/count_tokens", json={"model": "b", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
