"""/metrics (Prometheus text), /health, and usage.prompt_tokens_details.cached_tokens."""

from __future__ import annotations

import re

import httpx

from server_harness import MODEL, wait_until


def test_health_reports_ok_and_the_served_model(server):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["model"] == MODEL


def test_metrics_is_prometheus_text(server, client):
    client.completions.create(model=MODEL, prompt="Hello there", max_tokens=5, temperature=0)
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    declared = {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            declared[name] = kind
        elif line and not line.startswith("#"):
            assert re.match(r"^[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+$|^[a-z_]+(\{[^}]*\})? NaN$", line), line
            name = line.split("{")[0].split()[0]
            base = re.sub(r"_(bucket|sum|count)$", "", name)  # a histogram's series
            assert name in declared or declared.get(base) == "histogram", line
    for name in ("graphc_requests_running", "graphc_requests_waiting", "graphc_generation_tokens_per_second",
                 "graphc_prefix_cache_hit_rate", "graphc_kv_cache_bytes", "graphc_generation_tokens_total",
                 "graphc_prompt_tokens_total", "graphc_requests_finished_total", "graphc_http_requests_total"):
        assert name in declared, name
    if server.state.aengine.snapshot.cache.get("enabled"):
        for name in ("graphc_kv_pool_used_slots", "graphc_kv_pool_total_slots", "graphc_kv_pool_usage_ratio",
                     "graphc_prefix_cache_tree_tokens", "graphc_prefix_cache_hits_total",
                     "graphc_prefix_cache_declined_hits_total"):
            assert name in declared, name
    assert declared["graphc_generation_tokens_total"] == "counter"
    assert declared["graphc_requests_running"] == "gauge"


def test_metrics_count_tokens_and_requests(server, client):
    gen0 = server.metric("graphc_generation_tokens_total")
    prompt0 = server.metric("graphc_prompt_tokens_total")
    http0 = server.metric("graphc_http_requests_total", path="/v1/completions", status="200")
    length0 = server.metric("graphc_requests_finished_total", reason="length")
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert wait_until(lambda: server.metric("graphc_generation_tokens_total") >= gen0 + 7)
    assert server.metric("graphc_prompt_tokens_total") == prompt0 + r.usage.prompt_tokens
    assert server.metric("graphc_http_requests_total", path="/v1/completions", status="200") == http0 + 1
    assert server.metric("graphc_requests_finished_total", reason="length") == length0 + 1
    assert server.metric("graphc_generation_tokens_per_second") > 0
    assert server.metric("graphc_requests_running") == 0 and server.metric("graphc_requests_waiting") == 0
    assert server.metric("graphc_model_loaded") == 1


def test_error_statuses_are_counted(server):
    before = _or0(server, "graphc_http_requests_total", path="/v1/completions", status="400")
    httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "top_p": 0})
    assert server.metric("graphc_http_requests_total", path="/v1/completions", status="400") == before + 1
    httpx.get(server.url + "/wp-admin")  # unknown paths share one label
    assert server.metric("graphc_http_requests_total", path="other", status="404") >= 1


def test_repeated_prompt_reports_cached_tokens(server, client):
    prompt = list(range(10, 110))  # 100 tokens
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    chat = [{"role": "user", "content": "the same long question " * 10}]
    client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)
    r = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    assert server.metric("graphc_prefix_cache_hit_rate") > 0


def _or0(server, name, **labels):
    try:
        return server.metric(name, **labels)
    except KeyError:
        return 0
