"""Bad input gets OpenAI-style error bodies with the right status, and never hurts the server."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from graphc.runtime import Engine
from server_harness import MODEL, live_server, wait_until

CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def small(model_dir):
    """Tight limits: context 64, prompts <= 40 tokens, 2 KB bodies, n <= 4, one row and no queue."""
    with live_server(model_dir("llama"), max_model_len=64, max_prompt_tokens=40, max_body_bytes=2048, max_n=4,
                     max_batch=1, max_queued=0, max_prompts=3) as s:
        yield s


_http = httpx.Client(timeout=30)  # one client: building one per call costs ~30 ms (TLS context)


def post(srv, path, body=None, *, content=None, headers=None):
    return _http.post(srv.url + path, json=body, content=content, headers=headers)


def assert_error(resp, status, *, param="?", code="?"):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param != "?":
        assert err["param"] == param, err
    if code != "?":
        assert err["code"] == code, err
    return err


def completion(**kw):
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 2, **kw}


def chat(**kw):
    return {"model": MODEL, "messages": CHAT, "max_tokens": 2, **kw}


BAD_COMPLETION_FIELDS = [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 1e300}, "repetition_penalty"),
    ({"temperature": 1e300}, "temperature"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"logprobs": 21}, "logprobs"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 200}}, "logit_bias"),
    ({"stop_token_ids": [99999]}, "stop_token_ids"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"seed": "abc"}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"logprobs": True}, "logprobs"),
    ({"echo": 1}, "echo"),
    ({"temperature": "hot"}, "temperature"),
    ({"stop": 5}, "stop"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [5, 99999]}, "prompt"),
    ({"prompt": [[1, 2], [1.5]]}, "prompt"),
    ({"prompt": {"text": "x"}}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"suffix": "end"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"echo": True, "logprobs": 1, "stream": True}, "echo"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
]


@pytest.mark.parametrize("fields,param", BAD_COMPLETION_FIELDS, ids=[p + str(i) for i, (_, p) in
                                                                     enumerate(BAD_COMPLETION_FIELDS)])
def test_bad_completion_fields_are_400_naming_the_field(server, fields, param):
    assert_error(post(server, "/v1/completions", completion(**fields)), 400, param=param)


BAD_CHAT_FIELDS = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),  # tools are function tools only (docs/server.md#tool-calling)
    ({"temperature": -0.5}, "temperature"),
    # wrong JSON types are refused, not coerced (true is not 1, "yes" is not true)
    ({"max_tokens": True}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"n": "2"}, "n"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages"),
]


@pytest.mark.parametrize("fields,param", BAD_CHAT_FIELDS, ids=[p + str(i) for i, (_, p) in enumerate(BAD_CHAT_FIELDS)])
def test_bad_chat_fields_are_400_naming_the_field(server, fields, param):
    assert_error(post(server, "/v1/chat/completions", chat(**fields)), 400, param=param)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"", b'{"model": "tiny", "prompt": "x", "temperature": NaN}',
                                     b"\xff\xfe", b'"a string"'])
def test_malformed_json_is_a_400_openai_body(server, content):
    assert_error(post(server, "/v1/completions", content=content, headers={"content-type": "application/json"}), 400,
                 code="invalid_json")


def test_missing_required_fields_are_400(server):
    assert_error(post(server, "/v1/completions", {"model": MODEL}), 400, param="prompt")
    assert_error(post(server, "/v1/chat/completions", {"model": MODEL}), 400, param="messages")


def test_unknown_model_is_404(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    assert_error(post(server, "/v1/chat/completions", chat(model="nope")), 404, param="model", code="model_not_found")


def test_unknown_route_and_method_are_openai_bodies(server):
    assert_error(httpx.get(server.url + "/v1/nothing"), 404, code="not_found")
    assert_error(httpx.get(server.url + "/v1/completions"), 405)


def test_context_length_exceeded(server):
    too_long = [7] * 5000  # the model's context is 4096
    assert_error(post(server, "/v1/completions", completion(prompt=too_long)), 400, param="prompt",
                 code="context_length_exceeded")
    assert_error(post(server, "/v1/completions", completion(prompt=[7] * 4000, max_tokens=200)), 400,
                 param="max_tokens", code="context_length_exceeded")
    assert_error(post(server, "/v1/chat/completions", chat(max_completion_tokens=5000)), 400,
                 param="max_completion_tokens", code="context_length_exceeded")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 5000}])
    assert e.value.body["code"] == "context_length_exceeded"


def test_max_prompt_tokens_limit(small):
    assert_error(post(small, "/v1/completions", completion(prompt=[7] * 41)), 400, param="prompt",
                 code="context_length_exceeded")
    assert post(small, "/v1/completions", completion(prompt=[7] * 40, max_tokens=2)).status_code == 200


def test_chat_without_max_tokens_gets_the_rest_of_the_context(small):
    r = post(small, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "temperature": 0, "ignore_eos": True})
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 64


def test_body_size_limit_is_413(small):
    assert_error(post(small, "/v1/completions", completion(prompt="x" * 5000)), 413, code="request_too_large")

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}'

    assert_error(post(small, "/v1/completions", content=chunked(), headers={"content-type": "application/json"}),
                 413, code="request_too_large")


def test_limits_on_n_and_prompt_count(small):
    assert_error(post(small, "/v1/completions", completion(n=5)), 400, param="n")
    assert_error(post(small, "/v1/completions", completion(prompt=["a", "b", "c", "d"])), 400, param="prompt")
    # 2 sequences > 1 batch row + 0 queued: can never run, so 400 rather than 503.
    assert_error(post(small, "/v1/completions", completion(n=2)), 400, param="n")


def test_overloaded_is_503_then_recovers(small, monkeypatch):
    started, release = threading.Event(), threading.Event()
    engine, real_step = small.state.engine, small.state.engine.step

    def slow_step():  # ~0.4 s for the long request below: time enough to be refused beside it
        time.sleep(0.007)
        return real_step()

    monkeypatch.setattr(engine, "step", slow_step)

    def long_stream():
        body = completion(prompt="Hi", max_tokens=55, stream=True, ignore_eos=True)
        with httpx.stream("POST", small.url + "/v1/completions", json=body, timeout=30) as r:
            for _ in r.iter_lines():
                started.set()
                if release.is_set():
                    break

    t = threading.Thread(target=long_stream)
    t.start()
    try:
        assert started.wait(10)
        err = assert_error(post(small, "/v1/completions", completion()), 503, code="overloaded")
        assert "retry" in err["message"]
        assert small.metric("graphc_requests_rejected_total", cause="overloaded") >= 1
    finally:
        release.set()
        t.join(30)
    assert wait_until(lambda: small.state.aengine.num_inflight == 0)
    assert post(small, "/v1/completions", completion()).status_code == 200


def test_api_key_guards_v1_but_not_health(model_dir):
    with live_server(model_dir("llama"), api_key="sekrit") as srv:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert e.value.body["code"] == "invalid_api_key"
        assert_error(httpx.get(srv.url + "/v1/models"), 401, code="invalid_api_key")
        assert_error(post(srv, "/v1/chat/completions", chat()), 401)
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=1).usage.completion_tokens == 1
        assert httpx.get(srv.url + "/health").status_code == 200  # probes need no key


def test_503_while_loading_then_ready(model_dir):
    gate = threading.Event()
    path = model_dir("llama")

    def loader():
        gate.wait(30)
        return Engine.load(path)

    with live_server(loader=loader) as srv:
        assert_error(httpx.get(srv.url + "/health"), 503, code="model_loading")
        assert_error(post(srv, "/v1/completions", completion()), 503, code="model_loading")
        assert srv.metric("graphc_model_loaded") == 0
        gate.set()
        assert wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, timeout=30)
        assert post(srv, "/v1/completions", completion()).status_code == 200


def test_503_when_the_model_fails_to_load(tmp_path):
    def loader():
        return Engine.load(tmp_path / "missing")

    with live_server(loader=loader) as srv:
        assert wait_until(lambda: srv.state.load_error is not None)
        err = assert_error(httpx.get(srv.url + "/health"), 503, code="model_load_failed")
        assert "missing" in err["message"]
        assert_error(post(srv, "/v1/completions", completion()), 503, code="model_load_failed")


def test_errors_leave_no_state_behind(server):
    """After every bad request above, nothing is in flight and normal requests still work."""
    assert wait_until(lambda: server.state.aengine.num_inflight == 0)
    snap = server.state.aengine.snapshot
    assert snap.running == 0 and snap.waiting == 0
    r = post(server, "/v1/completions", completion(max_tokens=3, temperature=0))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


FUZZ_FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p",
               "top_k", "min_p", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
               "logprobs", "top_logprobs", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "stream",
               "stream_options", "response_format", "echo", "user", "tools", "add_generation_prompt"]
FUZZ_VALUES = [None, True, False, -1, 0, 1, 3, 2 ** 70, -(2 ** 70), 1e308, -1e308, 1e-308, 0.5, "", "x", "tiny",
               [], [1], [[1]], [-5], [None], ["a", 1], {}, {"a": 1}, {"type": "json_object"}, {"1": 1e9},
               {"include_usage": True}, [{"role": "user", "content": None}], [{"role": "user"}]]


def test_fuzzed_bodies_never_500_and_leave_nothing_behind(small):
    import random

    server = small  # context 64: a fuzzed body that runs cannot run long

    rng = random.Random(1234)
    statuses = set()
    for i in range(300):
        path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
        body = completion(max_tokens=2) if path == "/v1/completions" else chat(max_tokens=2)
        if path == "/tokenize" and rng.random() < 0.5:
            body = completion()
        elif path == "/detokenize":
            body = {"model": MODEL, "tokens": [1, 2, 3]}
        for field in rng.sample(FUZZ_FIELDS + ["tokens", "add_special_tokens", "return_token_strs"],
                                rng.randint(1, 3)):
            body[field] = rng.choice(FUZZ_VALUES)
        r = post(server, path, body)
        statuses.add(r.status_code)
        assert r.status_code in (200, 400, 404, 413), (body, r.status_code, r.text)
        if r.status_code != 200:
            assert_error(r, r.status_code)
    assert 200 in statuses and 400 in statuses
    assert wait_until(lambda: server.state.aengine.num_inflight == 0)
    assert httpx.get(server.url + "/health").status_code == 200


def test_engine_failure_is_reported_and_the_server_keeps_serving(model_dir):
    engine = Engine.load(model_dir("llama"))
    real_step, fail = engine.step, threading.Event()

    def step():
        if fail.is_set():
            fail.clear()
            raise RuntimeError("injected step failure")
        return real_step()

    engine.step = step
    with live_server(engine=engine) as srv:
        fail.set()
        err = assert_error(post(srv, "/v1/completions", completion(max_tokens=5)), 500, code="engine_error")
        assert "injected" in err["message"]
        fail.set()
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat(max_tokens=5, stream=True)) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["error"]["code"] == "engine_error"
        assert srv.metric("graphc_requests_finished_total", reason="error") == 2
        assert wait_until(lambda: srv.state.aengine.num_inflight == 0)
        r = post(srv, "/v1/completions", completion(max_tokens=3, temperature=0))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
