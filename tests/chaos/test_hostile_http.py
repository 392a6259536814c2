"""Hostile input against a live server on loopback: fuzzed bodies, cross-site requests, disconnect
storms at every stage, a huge prompt. Each asserts no 5xx, no reset connection, and that the
engine ends idle with no slot or lock held."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import httpx
import pytest

from fuzz import hostile_bodies
from server_harness import live_server, wait_until


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama"), max_batch=16, max_body_bytes=1 << 20) as s:
        yield s


def assert_idle(srv):
    a = srv.state.aengine
    assert wait_until(lambda: a.num_inflight == 0 and a.snapshot.running == 0 and a.snapshot.waiting == 0, 20)

    def check(eng):
        assert not eng.has_unfinished() and eng.runner.rows == []
        if eng.prefix is not None:
            eng.prefix.check()
            return len(eng.prefix.holds)
        return 0

    assert a.call(check).result(10) == 0  # no request holds a prefix-cache lock
    text = httpx.get(srv.url + "/metrics").text
    assert 'status="500"' not in text, [ln for ln in text.splitlines() if 'status="5' in ln]


def fuzz(srv, count: int, seed: int) -> dict:
    statuses: dict[int, int] = {}
    # One pooled keep-alive connection for all: a 5xx that drops the connection without
    # `Connection: close` would show up as a reset on the next request.
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=1)) as c:
        for path, raw in hostile_bodies(count, seed):
            r = c.post(srv.url + path, content=raw, headers={"content-type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (r.status_code, raw[:200], r.text[:300])
            if r.status_code >= 400:
                assert r.json()["error"]["message"]
    return statuses


def test_fuzzed_bodies_get_no_5xx(server):
    statuses = fuzz(server, 150, seed=1)
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0
    assert_idle(server)


@pytest.mark.slow
def test_1200_fuzzed_bodies_get_no_5xx(server):
    statuses = fuzz(server, 1200, seed=2)
    print("fuzz statuses", sorted(statuses.items()))
    assert_idle(server)


def test_the_issue_reproducers(server):
    post = lambda body, **kw: httpx.post(server.url + "/v1/completions", content=body, timeout=30,
                                        headers={"content-type": "application/json", **kw})
    # min_tokens >= 2**31 once crashed the engine step and every live request with it
    r = post(b'{"prompt":"hi","max_tokens":2,"min_tokens":2147483648}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "min_tokens": 2**31})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    r = post(b'{"prompt":' + b"[" * 957 + b"]" * 957 + b"}")
    assert r.status_code == 400 and "levels deep" in r.json()["error"]["message"]
    r = post(b'{"prompt":"\\ud800"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = post(b'{"prompt":"hi","model":"\\ud800"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = post(b'{"prompt":"hi","stop":["' + b"x" * 5000 + b'"]}')  # matched after every token: bounded
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    r = post(b'{"prompt":"hi","stop":["\\udfff"]}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    # per-token / per-batch host work on the engine thread is bounded per request
    r = httpx.post(server.url + "/v1/completions", timeout=30,
                   json={"prompt": "hi", "logit_bias": {str(i): 1 for i in range(1025)}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": ""}] * (server.state.max_prompt_tokens + 1)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert_idle(server)


def test_cross_site_requests_are_refused(server):
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt":"hi","max_tokens":1}',
                   headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(server.url + "/v1/completions", data={"prompt": "hi"})
    assert r.status_code == 415
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                   headers={"host": "evil.example:8000"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(server.url + "/health", headers={"host": "rebind.attacker.test"}).status_code == 403
    for ok_host in ("localhost", "127.0.0.1:1234", "[::1]:8000", "localhost:9"):
        assert httpx.get(server.url + "/health", headers={"host": ok_host}).status_code == 200, ok_host
    # CORS is off: a preflight gets no Access-Control-Allow-Origin, nor does a plain response
    r = httpx.options(server.url + "/v1/completions",
                      headers={"origin": "https://evil.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/health", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_and_hosts_opt_in():
    from starlette.testclient import TestClient

    from graphc.runtime.server import ServerConfig, create_app

    app = create_app(ServerConfig(cors_origins=["https://app.example"], allowed_hosts=["testserver"]),
                     loader=lambda: (_ for _ in ()).throw(RuntimeError("not loaded in this test")))
    c = TestClient(app)
    r = c.options("/v1/completions", headers={"origin": "https://app.example", "access-control-request-method": "POST"})
    assert r.headers.get("access-control-allow-origin") == "https://app.example"
    r = c.options("/v1/completions", headers={"origin": "https://evil.example", "access-control-request-method": "POST"})
    assert r.headers.get("access-control-allow-origin") is None
    assert c.get("/metrics", headers={"host": "other"}).status_code == 403
    assert c.get("/metrics").status_code == 200


def _raw(srv, data: bytes, *, read: bool = False, hold: float = 0.0) -> None:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(data)
        if hold:
            time.sleep(hold)
        if read:
            s.recv(256)
    finally:
        s.close()


def _request(body: bytes, length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(n).encode() + b"\r\n\r\n" + body)


def storm(srv, clients: int) -> None:
    long = b'{"prompt":"Once upon a time","max_tokens":400,"ignore_eos":true'
    stages = [
        lambda i: _raw(srv, _request(b'{"prompt": "hi', 5000)),  # gone while uploading the body
        lambda i: _raw(srv, _request(long + b"}"), hold=0.05),  # gone before the (non-stream) answer
        lambda i: _raw(srv, _request(long + b',"stream":true}'), read=True),  # gone mid-stream
        lambda i: _raw(srv, _request(long + b',"n":3,"stream":true}')[: 60 + i % 40]),  # gone mid-headers
    ]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: stages[i % len(stages)](i), range(clients)))


def test_disconnect_storm_at_every_stage(server):
    storm(server, 48)
    assert_idle(server)
    assert server.metric("graphc_http_requests_total", path="/v1/completions", status=499) > 0
    # the server still answers normally
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200


@pytest.mark.slow
def test_three_disconnect_storms_of_200(server):
    for _ in range(3):
        storm(server, 200)
        assert_idle(server)


def test_huge_prompt_is_refused_before_tokenizing_and_health_stays_up(server):
    state = server.state
    huge = "word " * (4 * 1024 * 1024 // 5)  # 4 MB: far more than any prompt that fits
    results = {}

    def send():
        results["r"] = httpx.post(server.url + "/v1/completions", json={"prompt": huge, "max_tokens": 1},
                                  timeout=60)

    t = threading.Thread(target=send)
    t.start()
    health = [httpx.get(server.url + "/health", timeout=30).status_code for _ in range(5)]
    t.join()
    assert health == [200] * 5
    r = results["r"]
    assert r.status_code in (400, 413) and r.json()["error"]["code"] in ("context_length_exceeded", "request_too_large")
    # just under the character bound: tokenized on the worker thread, then refused by token count
    big = "a b " * (state.max_prompt_chars // 4)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": big, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert_idle(server)
