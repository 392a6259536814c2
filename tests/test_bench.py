"""`graphc bench` on the tiny shape with tiny settings: every workload row is there, ratios are sane.

No timing assertions: on shared CI cores only the structure and finiteness can be checked.
"""

from __future__ import annotations

import json
import math

import pytest

from graphc.cli import main as graphc_main
from graphc.benchmarks.run import WORKLOADS

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


def test_no_contestant_fails(result):
    assert not [n for n in result["notes"] if "FAILED" in n]


def test_host_and_chain_rows(result):
    assert [r["batch"] for r in _rows(result, "host")] == [2]
    assert {"graphc", "graphc_compiled", "plain"} <= set(_rows(result, "host")[0]["values"])
    assert "chained/unchained" in _rows(result, "chain")[0]["ratios"]


def test_burst_rows_carry_both_units_for_every_contestant(result):
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
    from graphc.benchmarks.report import plot, tables

    text = tables(result)
    assert "### decode" in text and "mlx-lm BatchGen" in text and result["environment"]["mlx"] in text
    plot(result, str(tmp_path / "b.png"))
    assert (tmp_path / "b.png").stat().st_size > 0


USER = ["--model", "tiny", "--user-api", "--batches", "1,2", "--prompt-len", "8", "--short-new", "2",
        "--long-new", "5", "--prefill-cases", "2x24,1x40", "--no-progress"]


@pytest.fixture(scope="module")
def user_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("user") / "user.json"
    assert graphc_main(["bench", *USER, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_user_api_compile_measured_contestant(tmp_path):
    out = tmp_path / "m.json"
    assert graphc_main(["bench", "--user-api", "--model", "tiny", "--batches", "2", "--prompt-len", "8",
                        "--short-new", "2", "--long-new", "12", "--user-repeats", "3", "--user-workloads", "decode",
                        "--compile-measured", "--no-progress", "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())["rows"]
    assert "graphc_measured" in row["values"] and "graphc_measured/batch_generate" in row["ratios"]


USER_SKINNY = ["bench", "--user-api", "--model", "tiny", "--batches", "2", "--prompt-len", "8", "--short-new", "2",
               "--long-new", "12", "--user-repeats", "3", "--user-workloads", "decode", "--user-skinny", "--no-progress"]


def test_user_api_skinny_contestant_says_why_not_where_the_kernel_is_off(tmp_path):
    out = tmp_path / "s.json"
    assert graphc_main([*USER_SKINNY, "--json", str(out)]) == 0  # the CPU: no CUDA kernel
    res = json.loads(out.read_text())
    [row] = res["rows"]
    assert "graphc_skinny" not in row["values"]
    assert any(n.startswith("graphc_skinny not measured") and "not a CUDA device" in n for n in res["notes"])


def test_user_api_skinny_contestant_runs_the_kernel_where_it_checks(tmp_path, monkeypatch):
    from graphc.runtime.kernels import skinny_matmul

    calls = []

    def stand_in(x, w):  # MLX's own product, counted: stands in for the CUDA kernel on the CPU
        calls.append(x.shape)
        return x @ w.T

    monkeypatch.setattr(skinny_matmul, "check", lambda seed=0: None)
    monkeypatch.setattr(skinny_matmul, "matmul", stand_in)
    out = tmp_path / "s.json"
    assert graphc_main([*USER_SKINNY, "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())["rows"]
    assert "graphc_skinny" in row["values"] and "graphc_skinny/batch_generate" in row["ratios"]
    assert calls  # the contestant's compiled step went through the skinny matmul


def test_user_api_rows_cover_every_workload_batch_and_contestant(user_result):
    rows = user_result["rows"]
    decode = [r for r in rows if r["workload"] == "decode"]
    assert [r["batch"] for r in decode] == [1, 2]
    for r in decode:
        assert set(r["values"]) == {"graphc", "graphc_compiled", "graphc_auto", "batch_generate", "plain"}
        for s in r["values"].values():  # min <= median <= max over three repeats
            assert len(s["runs"]) == 3 and s["min"] <= s["median"] <= s["max"]
        assert {"graphc/batch_generate", "graphc/plain", "graphc_compiled/graphc"} <= set(r["ratios"])
        assert all(isinstance(c["noise"], bool) for c in r["ratios"].values())
    sampled = [r for r in rows if r["workload"] == "sampled"]
    assert [r["batch"] for r in sampled] == [1, 2] and all(set(r["overhead"]) == {"graphc", "batch_generate"}
                                                           for r in sampled)
    for r in sampled:  # graphc greedy runs paired with every sampled repeat; one ratio per repeat
        assert set(r["values"]) == {"graphc", "graphc_greedy", "batch_generate"}
        runs = zip(r["values"]["graphc"]["runs"], r["values"]["graphc_greedy"]["runs"])
        want = [s / g for s, g in runs if s > 0 and g > 0]
        assert r["sampled_over_greedy"]["graphc"].get("runs", []) == want
        # and one ratio of the long calls' median decode steps per repeat
        per_step = r["sampled_over_greedy_per_step"]["graphc"]
        assert len(per_step["runs"]) == 3 and all(x > 0 for x in per_step["runs"])
    prefill = [r for r in rows if r["workload"] == "prefill"]
    assert {(r["case"], r["unit"]) for r in prefill} == {(c, u) for c in ("2x24", "1x40")
                                                          for u in ("TTFT ms (median)", "prompt tok/s")}
    assert user_result["environment"]["mlx"] and user_result["command"]


def test_user_api_flags_a_ratio_the_spread_swamps():
    from graphc.benchmarks.user_api import compare, spread

    tight, wide = spread([10.0, 10.1, 10.2]), spread([5.0, 12.0, 20.0])
    assert compare(spread([5.0, 5.1, 5.2]), tight)["noise"] is False  # 2x apart, spreads 0.2
    c = compare(tight, wide)
    assert c["noise"] is True and c["ratio"] == pytest.approx(12.0 / 10.1)
    assert compare(spread([-3.0, -1.0, -0.5]), tight)["noise"] is True  # a non-positive median is noise
    assert compare(spread([100.0, 101.0, 102.0]), spread([50.0, 50.5, 51.0]), lower_is_better=False)["ratio"] == 2.0


def test_user_api_rejects_too_few_repeats():
    with pytest.raises(SystemExit, match="at least 3"):
        graphc_main(["bench", *USER, "--user-repeats", "2"])
