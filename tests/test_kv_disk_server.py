"""The disk tier through the server: `--kv-cache-dir` / `--kv-cache-disk-gb` reach the engine, a
restarted server (a new engine on the same folder) hits on disk, and /metrics shows hits by
tier and bytes on disk."""

from __future__ import annotations

import httpx
import numpy as np

from graphc.runtime.server.cli import config_from_args
from graphc.runtime.server.config import ServerConfig
from graphc.runtime.server.state import load_engine
from server_harness import MODEL, live_server, wait_until


def test_flags_reach_the_config():
    import argparse

    from graphc.runtime.server.cli import add_parser

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    c = config_from_args(p.parse_args(["serve", "--kv-cache-dir", "/tmp/kv", "--kv-cache-disk-gb", "2.5"]))
    assert c.kv_cache_dir == "/tmp/kv" and c.kv_cache_disk_gb == 2.5
    assert config_from_args(p.parse_args(["serve"])).kv_cache_dir is None
    assert config_from_args(p.parse_args(["serve"])).kv_cache_disk_read == "auto"
    c = config_from_args(p.parse_args(["serve", "--kv-cache-dir", "/tmp/kv", "--kv-cache-disk-read", "never"]))
    assert c.kv_cache_disk_read == "never"


def complete(srv, prompt: list[int]) -> dict:
    r = httpx.post(srv.url + "/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_restarted_server_hits_on_disk(model_dir, tmp_path):
    cfg = ServerConfig(model=str(model_dir("llama")), prefill_chunk=64, kv_cache_dir=str(tmp_path),
                       kv_cache_disk_gb=1.0, served_model_name=MODEL, warmup=False)
    prompt = np.random.default_rng(0).integers(3, 1000, 300).tolist()  # one 256-token block and a tail
    with live_server(engine=load_engine(cfg), served_model_name=MODEL) as srv:
        first = complete(srv, prompt)
        srv.state.engine.disk_tier.flush()
        complete(srv, [5, 6, 7])  # /metrics reads a snapshot taken after an engine step: take one now
        assert wait_until(lambda: srv.metric("graphc_prefix_cache_disk_bytes") > 0)
        assert srv.metric("graphc_prefix_cache_disk_files") == 3  # the block, its tail, the tail of [5, 6, 7]
    with live_server(engine=load_engine(cfg), served_model_name=MODEL) as srv:
        again = complete(srv, prompt)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 299  # all but the last token
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert wait_until(lambda: srv.metric("graphc_prefix_cache_tier_hits_total", tier="disk") == 1)
        assert srv.metric("graphc_prefix_cache_tier_hits_total", tier="memory") == 0
        assert srv.metric("graphc_prefix_cache_disk_hit_tokens_total") == 299
        assert srv.metric("graphc_prefix_cache_disk_tails_total", op="read") == 1
        # the restarted server has no read rate yet (the stopped one never read): it reads
        assert srv.metric("graphc_prefix_cache_disk_choices_total", choice="read") == 1
        assert srv.metric("graphc_prefix_cache_disk_choices_total", choice="recompute") == 0
        assert srv.metric("graphc_prefix_cache_disk_read_bytes_per_second") > 0
