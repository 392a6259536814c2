"""The engine-side latency histograms: what a request contributes, the quantile read back, and
/metrics exporting them so that `graphc bench --serving` splits a client's TTFT into the engine's
share and the door's."""

from __future__ import annotations

import types

import httpx
import pytest

from graphc.benchmarks.serving.engine_side import parse, run_quantiles
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.latency_histograms import BUCKETS, Histogram, observations, observe, quantile

from server_harness import MODEL, live_server


def test_quantile_interpolates_inside_the_bucket():
    h = Histogram()
    for x in [0.01] * 98 + [2.0, 2.0]:
        h = h.observe(x)
    counts = list(h.counts)
    assert h.count == 100 and h.total == pytest.approx(0.98 + 4.0)
    assert 0.0075 < quantile(counts, 0.5) <= 0.01  # 0.01 sits in the bucket (0.0075, 0.01]
    assert 1.7 < quantile(counts, 0.99) <= 2.2  # the two slow ones
    assert quantile([0] * (len(BUCKETS) + 1), 0.5) is None
    assert quantile([0] * len(BUCKETS) + [3], 0.99) == BUCKETS[-1]  # past the last bound


def test_a_bound_is_inclusive_like_prometheus_le():
    i = BUCKETS.index(0.1)
    assert Histogram().observe(0.1).counts[i] == 1


def test_observations_of_a_finished_request():
    req = types.SimpleNamespace(arrival=10.0, scheduled_time=10.5, first_token_time=11.0, finish_time=13.0,
                                output_ids=[1, 2, 3, 4, 5])
    assert observations(req) == {"queue": 0.5, "ttft": 1.0, "tpot": 0.5, "latency": 3.0}
    never_ran = types.SimpleNamespace(arrival=10.0, scheduled_time=None, first_token_time=None, finish_time=10.2,
                                      output_ids=[])
    assert observations(never_ran) == {"latency": pytest.approx(0.2)}
    hists = observe({}, req)
    assert observe(hists, req)["ttft"].count == 2 and hists["ttft"].count == 1  # values: the old one unchanged


def test_engine_records_when_a_prompt_first_ran(model_dir):
    eng = Engine.load(model_dir("llama"))
    [res] = eng.generate(["Once upon a time"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert res.queue_s is not None and 0 <= res.queue_s <= res.ttft_s <= res.latency_s


def test_metrics_export_the_histograms_and_a_run_reads_them_back(model_dir):
    with live_server(model_dir("llama")) as srv:
        before = parse(httpx.get(srv.url + "/metrics").text)
        assert srv.metric("graphc_request_ttft_seconds_count", model=MODEL) == 0
        for _ in range(3):
            r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hello there", "max_tokens": 6,
                                                               "ignore_eos": True, "temperature": 0}, timeout=60)
            assert r.status_code == 200
        text = httpx.get(srv.url + "/metrics").text
        after = parse(text)
    assert 'graphc_request_ttft_seconds_bucket{model="tiny",le="+Inf"} 3' in text
    assert "# TYPE graphc_request_latency_seconds histogram" in text
    assert sum(after["ttft"]) == sum(after["latency"]) == sum(after["tpot"]) == sum(after["queue"]) == 3
    q = run_quantiles(before, after)
    assert 0 <= q["engine_queue_p99"] <= q["engine_ttft_p99"]
    assert q["engine_ttft_p50"] <= q["engine_ttft_p99"] < 60
    assert run_quantiles(None, after) == {}
