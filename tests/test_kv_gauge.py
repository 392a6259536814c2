"""KV bytes allocated vs bytes the live tokens need (runtime/kv_usage.py), and the /metrics gauges."""

from __future__ import annotations

import json

import mlx_lm

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.async_engine import EngineSnapshot
from graphc.runtime.server.metrics import ServerMetrics


def _engine(model_dir):
    model, tok = mlx_lm.load(str(model_dir("llama")))
    cfg = json.loads((model_dir("llama") / "config.json").read_text())
    return Engine(model, tok, cfg, max_batch=8, prefix_cache=False)


def _running(eng, lengths, new=12):
    ids = [eng.add_request([5 + i % 7] * n, SamplingParams(max_tokens=new, ignore_eos=True))
           for i, n in enumerate(lengths)]
    while eng.scheduler.waiting or len(eng.runner.rows) < len(lengths):
        eng.step()
    return ids


def test_live_bytes_are_the_rows_own_tokens(model_dir):
    eng = _engine(model_dir)
    assert eng.load_info()["kv_live_bytes"] == 0  # nothing decoding
    ids = _running(eng, [300, 9, 9, 9])
    caches = eng.runner.caches
    per_token = sum((c.keys.nbytes + c.values.nbytes) / (c.keys.shape[0] * c.keys.shape[2]) for c in caches)
    tokens = sum(caches[0].idx - p for p in caches[0].left_pad)  # columns after each row's padding
    rows = eng.runner.rows
    assert sum(len(r.prompt_ids) for r in rows) <= tokens <= sum(len(r.prompt_ids) + len(r.output_ids) for r in rows)
    info = eng.load_info()
    assert info["kv_live_bytes"] == int(per_token * tokens)
    # Left padding and doubled capacity: three short rows pay for the long one.
    assert info["kv_bytes"] > 3 * info["kv_live_bytes"]
    for i in ids:
        eng.abort(i)


def test_equal_rows_waste_only_spare_capacity(model_dir):
    eng = _engine(model_dir)
    _running(eng, [64, 64])
    info = eng.load_info()
    caches = eng.runner.caches
    cap, idx = caches[0].keys.shape[2], caches[0].idx
    assert not any(caches[0].left_pad)
    assert info["kv_bytes"] * idx == info["kv_live_bytes"] * cap  # no padding: waste is only cap - idx


def test_metrics_show_live_bytes_and_ratio():
    text = ServerMetrics().render(EngineSnapshot(kv_bytes=3000, kv_live_bytes=1000), ready=True,
                                  engine_alive=True, model="m")
    assert 'graphc_kv_cache_live_bytes{model="m"} 1000' in text
    assert 'graphc_kv_cache_bytes_per_live_byte{model="m"} 3.0' in text
    empty = ServerMetrics().render(EngineSnapshot(), ready=True, engine_alive=True, model="m")
    assert 'graphc_kv_cache_bytes_per_live_byte{model="m"} 0.0' in empty


def test_bench_kv_capacity_reads_both_engines_arrays():
    from graphc.benchmarks.kv_capacity import kv_table, parse_mix, run_kv_capacity
    from graphc.benchmarks.shapes import load_shape

    model, tok, cfg, _ = load_shape("tiny", "float32")
    long, short, n = parse_mix("1x200+3x10")
    r = run_kv_capacity(model, tok, cfg, long=long, short=short, n_short=n, new_tokens=4, budget_gib=0.01)
    assert r["graphc"]["rows"] == r["batchgen"]["rows"] == 4
    assert r["graphc"]["live_gauge"] == int(r["live_bytes"])  # the gauge agrees with the bench's count
    for side in ("graphc", "batchgen"):  # every row is as wide as the longest one
        assert r[side]["columns"] >= 204 and r[side]["ratio"] > 2
    assert r["fit"]["live_only"] > r["fit"]["graphc"] > 0
    assert "live tokens only" in kv_table(r)
    paged = r["graphc_paged"]  # graphs/dense_paged.yaml: rows hold their own tokens in 16-token pages
    assert paged["rows"] == 4 and paged["columns"] is None and paged["live_gauge"] == int(r["live_bytes"])
    pages = -(-(200 + 1) // 16) + 3 * -(-(10 + 1) // 16)  # each row's positions, rounded up to a page
    assert paged["allocated"] == pages * 16 * paged["per_token"] and paged["ratio"] < 1.5
    assert r["fit"]["graphc"] < r["fit"]["graphc_paged"] <= r["fit"]["live_only"]
