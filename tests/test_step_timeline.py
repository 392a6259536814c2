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
