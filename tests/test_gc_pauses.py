"""Python's garbage collector in the server (runtime/gc_pauses.py): every collection timed by
generation and exported in /metrics, read back per run by the serving bench; `graphc serve`
freezes startup's objects out of full collections once the model is loaded (`--gc-freeze`,
default on), and a multi-model server unfreezes before it unloads one."""

from __future__ import annotations

import argparse
import gc

import httpx
import pytest

from graphc.benchmarks.serving.engine_side import parse, run_quantiles
from graphc.runtime import Engine, gc_pauses
from graphc.runtime.server.cli import add_parser, config_from_args
from server_harness import live_server, wait_until


@pytest.fixture
def unfrozen():
    """Freezing is process-wide: each test leaves the collector as it found it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_collections_are_counted_and_timed_by_generation():
    p = gc_pauses.install()
    assert gc_pauses.install() is p and gc.callbacks.count(p.callback) == 1  # once per process
    before = p.snapshot()
    gc.collect(0)
    gc.collect(2)
    after = p.snapshot()
    assert after["collections"][0] >= before["collections"][0] + 1
    assert after["collections"][2] >= before["collections"][2] + 1
    assert after["seconds"][2] > before["seconds"][2] and after["longest"][2] > 0


def test_freeze_takes_startup_objects_out_of_full_collections(unfrozen):
    n = gc_pauses.freeze_startup()
    # Frozen objects can only go (another thread of this test process may free one), never come.
    assert n > 1000 and n - 100 < gc.get_freeze_count() <= n
    gc_pauses.unfreeze()
    assert gc.get_freeze_count() == 0


def test_the_flag_is_on_for_graphc_serve_and_off_for_an_embedded_server():
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    assert config_from_args(p.parse_args(["serve"])).gc_freeze is True
    assert config_from_args(p.parse_args(["serve", "--no-gc-freeze"])).gc_freeze is False
    from graphc.runtime.server.config import ServerConfig

    assert ServerConfig().gc_freeze is False  # process-wide: the process owner decides


def test_a_loaded_server_freezes_and_metrics_show_it(model_dir, unfrozen):
    d = model_dir("llama")
    with live_server(loader=lambda: Engine.load(d), gc_freeze=True, warmup=False) as srv:
        assert wait_until(lambda: srv.metric("graphc_model_loaded", model="tiny") == 1, timeout=60)
        assert wait_until(lambda: srv.metric("graphc_gc_frozen_objects") > 1000)
        before = parse(httpx.get(srv.url + "/metrics").text)
        gc.collect(2)  # a full collection while it serves: counted, timed
        text = httpx.get(srv.url + "/metrics").text
    assert '# TYPE graphc_gc_pause_seconds_total counter' in text
    after = parse(text)
    q = run_quantiles(before, after)
    assert q["engine_gc_full_collections"] >= 1 and q["engine_gc_pause_s"] > 0


def test_without_the_flag_nothing_is_frozen(model_dir, unfrozen):
    d = model_dir("llama")
    with live_server(loader=lambda: Engine.load(d), warmup=False) as srv:
        assert wait_until(lambda: srv.metric("graphc_model_loaded", model="tiny") == 1, timeout=60)
        assert srv.metric("graphc_gc_frozen_objects") == 0


def test_a_server_without_gc_lines_gives_the_bench_none():
    assert "gc" not in parse('graphc_request_ttft_seconds_bucket{model="m",le="+Inf"} 1\n')
    text = ('graphc_gc_collections_total{generation="0"} 5\ngraphc_gc_collections_total{generation="2"} 2\n'
            'graphc_gc_pause_seconds_total{generation="0"} 0.01\ngraphc_gc_pause_seconds_total{generation="2"} 0.2\n')
    assert parse(text)["gc"] == [2.0, pytest.approx(0.21)]
