"""Several models behind one server (runtime/server/models.py): /v1/models lists them, a
request's `model` picks one, unknown names are 404 model_not_found, a model loads on first use
(503 + Retry-After meanwhile) and the least recently used one unloads under the budget.

Loads go through a loader hook that waits on a per-model gate, so "while it loads" is a state
the test holds open, not a race against a sleep."""

from __future__ import annotations

import argparse
import shutil
import threading

import httpx
import openai
import pytest

from graphc.runtime import Engine
from graphc.runtime.server import ServerConfig, create_app
from graphc.runtime.server.cli import add_parser, config_from_args
from graphc.runtime.server.errors import APIError
from graphc.runtime.server.models import ModelRegistry, model_entries, scan_models_dir, weight_bytes

from server_harness import LiveServer, wait_until


class GatedLoader:
    """model_loader(name, path): records each load; a model with a closed gate waits for it."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.gates: dict[str, threading.Event] = {}

    def close(self, name: str) -> threading.Event:
        self.gates[name] = threading.Event()
        return self.gates[name]

    def __call__(self, name: str, path: str) -> Engine:
        self.calls.append((name, path))
        gate = self.gates.get(name)
        if gate is not None:
            assert gate.wait(60), f"the test never opened the gate of {name}"
        return Engine.load(path, max_batch=4, prefill_chunk=64)


@pytest.fixture(scope="module")
def paths(model_dir):
    return {"a": str(model_dir("llama")), "b": str(model_dir("llama", seed=1))}


def _serve(paths, loader, **config):
    cfg = ServerConfig(models=[f"{n}={p}" for n, p in paths.items()], warmup=False, **config)
    return LiveServer(create_app(cfg, model_loader=loader)).start()


def _status(srv, name):
    return httpx.get(srv.url + "/health", timeout=10).json()["models"][name]


def _chat(srv, model, **kw):
    return httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, **kw})


@pytest.fixture(scope="module")
def one_at_a_time(paths):
    """Both models, at most one loaded: the first loads at startup."""
    loader = GatedLoader()
    srv = _serve(paths, loader, max_loaded_models=1)
    assert wait_until(lambda: _status(srv, "a") == "loaded", 60)
    try:
        yield srv, loader
    finally:
        srv.stop()


def test_models_lists_every_name_loaded_or_not(one_at_a_time):
    srv, _ = one_at_a_time
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["a", "b"]
    assert client.models.retrieve("b").id == "b"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("c")


def test_unknown_model_is_404_and_no_path_is_ever_loaded(one_at_a_time, paths):
    srv, loader = one_at_a_time
    for name in ("c", paths["b"], "../b", "/etc/passwd"):
        r = _chat(srv, name)
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
    assert all(name in ("a", "b") for name, _ in loader.calls)


def test_pick_load_on_first_use_503_while_loading_and_lru_unload(one_at_a_time):
    srv, loader = one_at_a_time
    r = _chat(srv, "a")
    assert r.status_code == 200 and r.json()["model"] == "a"

    gate = loader.close("b")
    for _ in range(2):  # the first request starts the load; every request meanwhile is told to retry
        r = _chat(srv, "b")
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] and r.json()["error"]["code"] == "model_loading"
    assert [n for n, _ in loader.calls].count("b") == 1
    # budget 1: "a" (idle, least recently used) made room before "b" started loading
    assert _status(srv, "a") == "unloaded" and _status(srv, "b") == "loading"
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200  # a loading model is not a down server
    gate.set()
    assert wait_until(lambda: _status(srv, "b") == "loaded", 60)
    r = _chat(srv, "b")
    assert r.status_code == 200 and r.json()["model"] == "b"
    streamed = httpx.post(srv.url + "/v1/completions", timeout=60,
                          json={"model": "b", "prompt": "once", "max_tokens": 2, "stream": True})
    assert streamed.status_code == 200 and '"model":"b"' in streamed.text

    # and back: "a" reloads, "b" unloads
    r = _chat(srv, "a")
    assert r.status_code == 503
    assert wait_until(lambda: _status(srv, "a") == "loaded", 60)
    assert _status(srv, "b") == "unloaded"
    assert _chat(srv, "a").status_code == 200
    assert [n for n, _ in loader.calls] == ["a", "b", "a"]


def test_embeddings_route_through_the_registry(one_at_a_time):
    srv, _ = one_at_a_time
    assert wait_until(lambda: _status(srv, "a") == "loaded", 60)
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": "a", "input": "hello"}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "a"
    assert httpx.post(srv.url + "/v1/embeddings", json={"model": "zz", "input": "x"}, timeout=60).status_code == 404


# -- the registry itself: budget by bytes, busy models, names ---------------------------------
class _Busy:
    num_inflight = 1


def test_byte_budget_and_busy_models_are_never_unloaded(paths):
    size = weight_bytes(paths["a"])
    assert size > 0
    reg = ModelRegistry(ServerConfig(models=[f"{n}={p}" for n, p in paths.items()], max_loaded_bytes=size,
                                     warmup=False), loader=lambda n, p: pytest.fail("nothing may load here"))
    a = reg.states["a"]
    a.ready, a.aengine = True, _Busy()  # "a" loaded and running a request
    reg._lru["a"] = None
    with pytest.raises(APIError) as e:
        reg.route("b")
    assert e.value.status == 503 and e.value.code == "model_capacity"
    assert a.ready and reg.status("b") == "unloaded"
    assert reg.route("a") is a and reg.route(None) is a  # no name: the first model


def test_model_names_from_flags_and_folder(paths, tmp_path):
    for name, p in paths.items():
        shutil.copytree(p, tmp_path / f"m-{name}")
    (tmp_path / "notes").mkdir()  # no config.json: not a model
    assert [n for n, _ in scan_models_dir(str(tmp_path))] == ["m-a", "m-b"]
    cfg = ServerConfig(models=[paths["a"]], models_dir=str(tmp_path))
    assert [n for n, _ in model_entries(cfg)][1:] == ["m-a", "m-b"]
    with pytest.raises(ValueError, match="named 'x'"):
        model_entries(ServerConfig(models=[f"x={paths['a']}", f"x={paths['b']}"]))


def _args(*argv):
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return config_from_args(p.parse_args(["serve", *argv]))


def test_model_flags_take_one_or_several_models_and_reject_mixes(paths):
    one = _args("--model", paths["a"])
    assert one.model == paths["a"] and not one.several_models
    two = _args("--model", f"a={paths['a']}", "--model", f"b={paths['b']}", "--max-loaded-models", "1",
                "--max-loaded-bytes", "2G")
    assert two.models == [f"a={paths['a']}", f"b={paths['b']}"] and two.model is None
    assert (two.max_loaded_models, two.max_loaded_bytes) == (1, 2 * 1024 ** 3)
    with pytest.raises(SystemExit):
        _args("--model", paths["a"], "--model", paths["b"], "--served-model-name", "x")
    with pytest.raises(SystemExit):
        _args("--model", paths["a"], "--max-loaded-models", "1")
