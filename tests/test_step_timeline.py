"""benchmarks/step_timeline.py on a tiny model: every step's budget and the worst TTFTs' split into
queueing and prefill are in its JSON (no timing assertions)."""

from __future__ import annotations

import json

from graphc.benchmarks import step_timeline


def test_the_probe_records_budgets_and_explains_the_worst_ttfts(model_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    rc = step_timeline.main(["--model", str(model_dir("llama")), "--requests", "6", "--rate", "inf",
                             "--input", "8,64", "--output", "2,4", "--step-tokens", "auto", "--start", "serve",
                             "--top", "3", "--json", str(out)])
    assert rc == 0
    run = json.loads(out.read_text())["runs"][0]
    assert all("budget" in s for s in run["steps"])
    worst = run["summary"]["worst_ttft"]
    assert len(worst) == 3 and all(w["prefill_steps"] >= 1 and 8 <= w["prompt"] <= 64 for w in worst)
    assert all(w["queue_ms"] >= 0 and w["prefill_ms"] >= 0 for w in worst)
    assert run["summary"]["first_ttft_ms"] is not None
    assert '"warm_up_s"' in capsys.readouterr().out


def test_a_sweep_runs_each_budget_on_one_engine(model_dir, tmp_path):
    out = tmp_path / "s.json"
    rc = step_timeline.main(["--model", str(model_dir("llama")), "--requests", "8", "--rate", "inf",
                             "--input", "400,600", "--output", "6,8", "--sweep-step-tokens", "128,auto",
                             "--repeats", "2", "--start", "none", "--json", str(out)])
    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["step_tokens"], r["repeat"]) for r in runs] == [(128, 0), (128, 1), ("auto", 0), ("auto", 1)]
    fixed = [s["budget"] for s in runs[0]["steps"] if s["rows"] and s["budget"]]
    assert fixed and set(fixed) == {128}  # the fixed budget, while rows decode
