"""`graphc bench` on the tiny shape with tiny settings: every workload row is there, ratios are sane.

No timing assertions: on shared CI cores only the structure and finiteness can be checked.
"""

from __future__ import annotations

import json
import math

import pytest

from graphc.compiler.cli import main as graphc_main
from graphc.runtime.bench.run import WORKLOADS

TINY = ["--model", "tiny", "--prompt-len", "8", "--warmup", "1", "--steps", "2", "--repeats", "2",
        "--batches", "1,3", "--sampling-batches", "1,2", "--chain-batches", "2", "--host-batches", "2",
        "--grammar-batches", "2", "--burst-requests", "3", "--admission-batch", "2", "--admission-len", "40", "--admission-chunk", "16",
        "--matmul-batches", "1,2", "--prefix-len", "24", "--prefix-requests", "3", "--suffix-len", "3",
        "--prefix-max-tokens", "2", "--prefix-repeats", "1", "--no-progress"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out.json"
    assert graphc_main(["bench", *TINY, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _rows(result, workload):
    return [r for r in result["rows"] if r["workload"] == workload]


def _skipped(result, workload) -> bool:
    return any(n.startswith(f"{workload}:") and "skipped" in n for n in result["notes"])


def test_environment_is_reported(result):
    env = result["environment"]
    for key in ("device", "backend", "blas", "platform", "mlx", "mlx_lm"):
        assert env[key]
    assert result["model"]["weight_bytes"] > 0


def test_every_workload_has_rows_or_a_skip_note(result):
    for w in WORKLOADS:
        assert _rows(result, w) or _skipped(result, w), w


def test_decode_rows_cover_every_batch_and_contestant(result):
    rows = _rows(result, "decode")
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert {"graphc", "graphc_compiled", "batchgen", "plain"} <= set(r["values"])
        assert {"graphc/batchgen", "graphc/plain", "compiled/batchgen", "compiled/plain"} <= set(r["ratios"])


def test_host_and_chain_rows(result):
    assert [r["batch"] for r in _rows(result, "host")] == [2]
    assert "chained/unchained" in _rows(result, "chain")[0]["ratios"]


def test_burst_rows(result):
    rows = _rows(result, "burst")
    assert {r["unit"] for r in rows} == {"TTFT ms (median)", "generated tok/s"}
    for r in rows:
        assert {"graphc_batched", "graphc_single", "batchgen"} <= set(r["values"])


def test_grammar_and_admission_rows(result):
    [g] = _rows(result, "grammar")
    assert {"greedy", "grammar"} <= set(g["values"]) and g["ratios"]["grammar/greedy"] > 0
    [a] = _rows(result, "admission")
    assert a["values"]["steps"] >= 40 // 16 and math.isfinite(a["ratios"]["during/steady"])


def test_matmul_rows_when_asked(tmp_path):
    # By default the CPU skips it (it measures MLX's GPU matmul); asked for, it runs anywhere.
    out = tmp_path / "m.json"
    assert graphc_main(["bench", *TINY, "--workloads", "matmul", "--json", str(out)]) == 0
    mm = _rows(json.loads(out.read_text()), "matmul")
    assert mm and {r["batch"] for r in mm} == {1, 2}
    assert {r["case"].rsplit(" ", 1)[1] for r in mm} == {"x@W.T", "W@x.T"}


def test_ratios_and_values_are_positive_and_finite(result):
    for r in result["rows"]:
        assert r["ratios"], r["case"]
        for v in list(r["ratios"].values()) + list(r["values"].values()):
            assert v is not None and math.isfinite(v) and v > 0, (r["workload"], r["case"], v)


def test_prefix_and_sampling_run_when_the_engine_has_them(result):
    # Both features are detected by probing the engine; absent ones leave a note, present ones rows.
    for w in ("prefix", "sampling"):
        assert bool(_rows(result, w)) != _skipped(result, w), w


def test_forced_prefix_graph_produces_rows(tmp_path):
    out = tmp_path / "p.json"
    args = [a for a in TINY]
    assert graphc_main(["bench", *args, "--workloads", "prefix", "--prefix-graph", "dense", "--json", str(out)]) == 0
    rows = _rows(json.loads(out.read_text()), "prefix")
    assert {r["unit"] for r in rows} == {"TTFT ms (median)", "TTFT ms (mean)", "generated tok/s"}
    for r in rows:
        assert {"graphc_on", "graphc_off", "batchgen"} <= set(r["values"])


def test_table_and_plot(tmp_path, result, capsys):
    pytest.importorskip("matplotlib")
    from graphc.runtime.bench.report import plot, tables

    text = tables(result)
    assert "### decode" in text and "mlx-lm BatchGen" in text and result["environment"]["mlx"] in text
    plot(result, str(tmp_path / "b.png"))
    assert (tmp_path / "b.png").stat().st_size > 0
