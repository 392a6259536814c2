"""benchmarks/serving/traced_serve.py: the door's step trace, recorded from outside the runtime.

The wrappers must record every step and every request, come off again, and the summary must
give back what the engine did: each request's tokens, its arrival, its prompt's chunks.
"""

from __future__ import annotations

import json

import pytest

from graphc.benchmarks.serving import traced_serve
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.runner import ModelRunner
from helpers import random_prompts


def test_a_traced_engine_summarizes_to_what_it_generated(model_dir, tmp_path):
    path = tmp_path / "steps.jsonl"
    plain_step, plain_decode = Engine.step, ModelRunner.decode
    trace, uninstall = traced_serve.install(str(path))
    try:
        eng = Engine.load(model_dir("llama"), max_batch=4)
        prompts = random_prompts(6, eng.vocab_size, [40, 300, 7, 90, 12, 200], seed=3)
        out = eng.generate(prompts, SamplingParams(max_tokens=9, ignore_eos=True))
    finally:
        uninstall()
    assert Engine.step is plain_step and ModelRunner.decode is plain_decode  # the wrappers came off
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    adds, steps = [r for r in recs if "add" in r], [r for r in recs if "ms" in r]
    assert [a["prompt"] for a in adds] == [len(p) for p in prompts]
    assert sum(r["prefill"] for r in steps) == sum(len(p) for p in prompts)  # nothing cached: all computed
    assert all(set(r["phases_ms"]) <= set(traced_serve.PHASES) for r in steps)
    assert all("run_prefill" in r["phases_ms"] for r in steps if r["prefill"])
    assert sum("_join_rows" in r["phases_ms"] for r in steps) >= 2  # 6 prompts through a batch of 4
    [res] = traced_serve.runs(recs)
    assert sorted(len(ts) for ts in res["times"].values()) == [len(r.token_ids) for r in out]
    assert set(res["first_chunk"]) == set(res["arrival"]) and all(n >= 1 for n in res["chunk_steps"].values())
    [summary] = traced_serve.summarize_file(str(path), top=3)
    assert summary["requests"] == 6 and summary["steps"] == len(steps)
    assert summary["itl_ms_p99"] is not None and len(summary["slowest_steps"]) == 3
    classes = summary["step_classes"]
    assert sum(c["n"] for c in classes.values()) == len(steps) and "decode" in classes
    assert any(name.endswith("+join") for name in classes)  # prompts ended while rows decoded
    assert all(c["ms_p50"] <= c["ms_p90"] <= c["ms_max"] for c in classes.values())


def test_runs_split_by_request_count_or_idle_gap():
    def add(i, t):
        return {"add": i, "t": t, "prompt": 5}

    def step(t, ids, chunked=()):
        return {"t": t, "ms": 1.0, "prefill": 5 * len(chunked), "rows": 1, "tokens": list(ids), "chunked": list(chunked),
                "decode": True, "groups": [], "copies_mib": {}, "capacity": 0, "idle_ms": None, "budget": None}

    recs = [add(0, 0.0), step(0.001, [0], [0]),  # warm-up: one request
            add(1, 0.01), add(2, 0.01), step(0.02, [1, 2], [1, 2]), step(0.03, [1, 2]),  # run 1
            add(3, 0.04), add(4, 0.04), step(0.05, [3, 4], [3, 4]), step(0.06, [4])]  # run 2, right after
    by_count = traced_serve.runs(recs, requests=2, skip=1)
    assert [sorted(r["arrival"]) for r in by_count] == [[0], [1, 2], [3, 4]]
    assert traced_serve.runs(recs, requests=2) == by_count  # 5 requests in runs of 2: 1 before them
    assert [len(r["steps"]) for r in by_count] == [1, 2, 2]
    assert by_count[1]["times"] == {1: pytest.approx([0.011, 0.021]), 2: pytest.approx([0.011, 0.021])}
    # Without counts only an idle engine (no record for RUN_GAP_S) separates runs.
    assert len(traced_serve.runs(recs)) == 1
    later = [{**r, "t": r["t"] + 5.0} for r in recs[6:]]
    assert [sorted(r["arrival"]) for r in traced_serve.runs(recs[:6] + later)] == [[0, 1, 2], [3, 4]]
