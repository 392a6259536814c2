"""`graphc bench --serving` end to end on a tiny model: both servers started, driven, stopped."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest

from graphc.benchmarks.serving.client import arrival_times
from graphc.benchmarks.serving.run import aggregate, rate_table
from graphc.benchmarks.serving.workload import make_workload
from graphc.cli import main


def test_workload_is_seeded_and_within_bounds(model_dir):
    m = model_dir("llama")
    a = make_workload(m, 16, 16, 200, 8, 40, seed=3)
    assert a == make_workload(m, 16, 16, 200, 8, 40, seed=3)
    assert a != make_workload(m, 16, 16, 200, 8, 40, seed=4)
    assert all(8 <= r.max_tokens <= 40 for r in a)
    # re-encoding a decoded slice may merge a token or two at the edges
    assert all(12 <= r.prompt_tokens <= 204 for r in a)
    assert len({r.prompt_tokens for r in a}) > 3  # mixed lengths, not one


def test_a_workload_variant_keeps_the_lengths_and_shares_no_prompt(model_dir):
    """Each rate gets a variant: the same output lengths (and prompt lengths, up to re-encoding at the
    edges) with prompts cut elsewhere, so a rate is no prefix-cache hit of the rate before."""
    m = model_dir("llama")
    a = make_workload(m, 16, 16, 200, 8, 40, seed=3)
    b = make_workload(m, 16, 16, 200, 8, 40, seed=3, variant=1)
    assert b == make_workload(m, 16, 16, 200, 8, 40, seed=3, variant=1)
    assert [r.max_tokens for r in a] == [r.max_tokens for r in b]
    assert all(abs(x.prompt_tokens - y.prompt_tokens) <= 4 for x, y in zip(a, b))
    firsts = {r.prompt[:40] for r in a}
    assert sum(r.prompt[:40] in firsts for r in b) <= 1  # a prompt from the same place is chance, not the rule


def test_arrivals_are_sorted_seeded_and_all_at_once_at_infinite_rate():
    assert arrival_times(5, math.inf, 0) == [0.0] * 5
    t = arrival_times(200, 10.0, 1)
    assert t == sorted(t) and t[0] == 0.0 and t == arrival_times(200, 10.0, 1)


def _run(server, repeat, tok_s, ttft_p99, errors):
    return {"server": server, "rate": math.inf, "repeat": repeat,
            "metrics": {"req_per_s": 1.0, "output_tok_per_s": tok_s, "ttft_p50": 0.1, "ttft_p99": ttft_p99,
                        "itl_p50": 0.01, "itl_p99": 0.05, "tpot_p50": 0.02, "errors": errors}}


def test_itl_p99_is_also_given_in_graphcs_own_decode_steps():
    """The ITL goal (p99 within 1.5x the engine's decode step) as one number per run: the client's
    ITL p99 over the same run's decode-step p50 from graphc's /metrics, then its spread."""
    runs = [_run("graphc", 1, 1000.0, 1.0, 0), _run("graphc", 2, 1000.0, 1.0, 0)]
    runs[0]["metrics"].update(itl_p99=0.030, engine_step_decode_p50=0.005, engine_ttft_p50=0.1, engine_ttft_p99=0.9)
    runs[1]["metrics"].update(itl_p99=0.040, engine_step_decode_p50=0.005, engine_ttft_p50=0.1, engine_ttft_p99=0.9)
    per = aggregate(runs, ("graphc",), [math.inf])["inf"]
    assert per["graphc"]["itl_p99_over_decode_step"] == {"median": pytest.approx(7.0), "min": pytest.approx(6.0),
                                                         "max": pytest.approx(8.0)}
    assert "ITL p99 / decode step" in rate_table("inf", per, ("graphc",))


def test_a_repeat_where_a_server_failed_requests_gives_no_ratio():
    """A server that dies in a run answers few requests fast: its TTFT p99 and tok/s over those are
    not the same work as the other side's, so that repeat's ratios are left out and counted."""
    runs = [_run("graphc", 1, 1000.0, 1.0, 0), _run("mlx_lm", 1, 50.0, 0.2, 53),
            _run("graphc", 2, 1100.0, 1.2, 0), _run("mlx_lm", 2, 500.0, 4.0, 0)]
    per = aggregate(runs, ("graphc", "mlx_lm"), [math.inf])["inf"]
    r = per["graphc_over_mlx_lm"]
    assert r["output_tok_per_s"] == {"median": 2.2, "min": 2.2, "max": 2.2}  # repeat 2 alone
    assert r["ttft_p99"]["median"] == pytest.approx(0.3) and r["repeats_with_errors"] == 1
    assert "1 repeats with errors left out" in rate_table("inf", per, ("graphc", "mlx_lm"))
    per = aggregate(runs[:2], ("graphc", "mlx_lm"), [math.inf])["inf"]  # no clean repeat: no ratio at all
    assert per["graphc_over_mlx_lm"]["output_tok_per_s"] is None
    line = [x for x in rate_table("inf", per, ("graphc", "mlx_lm")).splitlines() if x.startswith("graphc/")][0]
    assert "20.00" not in line and "-" in line  # 1000 / 50 would be 20.00


def test_serving_bench_both_servers(model_dir, tmp_path, capsys):
    m = model_dir("llama")
    out = tmp_path / "serving.json"
    rc = main(["bench", "--serving", "--model", str(m), "--requests", "8", "--rates", "16,inf",
               "--serving-repeats", "1", "--max-batch", "8", "--min-input", "16", "--max-input", "64",
               "--min-output", "8", "--max-output", "16", "--json", str(out), "--plot", str(tmp_path / "serving.png"),
               "--log-dir", str(tmp_path / "logs"), "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["summary"]) == {"16", "inf"}
    runs = {(r["server"], r["rate"]): r["metrics"] for r in res["runs"]}
    assert set(runs) == {(s, r) for s in ("graphc", "mlx_lm") for r in ("16", "inf")}
    targets = sum(r["max_tokens"] for r in res["workload"]["requests_list"])
    for (server, rate), mt in runs.items():
        assert mt["errors"] == 0, (server, rate, mt["error_samples"])
        assert mt["target_tokens"] == targets
        assert mt["ttft_p50"] is not None and mt["itl_p99"] is not None and mt["output_tok_per_s"] > 0
        if server == "graphc":  # ignore_eos: exactly the asked lengths
            assert mt["exact_length"] == 8 and mt["output_tokens"] == targets
    for rate, per in res["summary"].items():
        for s in ("graphc", "mlx_lm"):
            assert per[s]["repeats"] == 1 and per[s]["output_tok_per_s"]["median"] > 0
        assert per["graphc_over_mlx_lm"]["output_tok_per_s"]["median"] > 0
    assert (tmp_path / "logs" / "graphc.log").exists() and (tmp_path / "logs" / "mlx_lm.log").exists()
    if importlib.util.find_spec("matplotlib"):  # the optional `bench` extra draws the plot
        assert (tmp_path / "serving.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "rate inf (saturation)" in printed and "graphc/mlx_lm" in printed


def test_serving_bench_32_requests_on_the_cpu_defaults(model_dir, tmp_path):
    """The issue's CI line, `graphc bench --serving --model DIR --requests 32`, on the tiny model with
    the CPU's default mix and rates (one repeat instead of three, to stay fast): every request of
    every rate completes on both servers, at its exact length on graphc. No timing is asserted."""
    m = model_dir("llama")
    out = tmp_path / "serving.json"
    rc = main(["bench", "--serving", "--model", str(m), "--requests", "32", "--serving-repeats", "1",
               "--json", str(out), "--log-dir", str(tmp_path / "logs"), "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert len(res["workload"]["requests_list"]) == 32
    targets = sum(r["max_tokens"] for r in res["workload"]["requests_list"])
    rates = {r["rate"] for r in res["runs"]}
    assert rates == set(res["summary"]) and len(rates) >= 2  # the CPU defaults: a Poisson rate and saturation
    for r in res["runs"]:
        mt = r["metrics"]
        assert mt["errors"] == 0, (r["server"], r["rate"], mt["error_samples"])
        assert mt["target_tokens"] == targets
        if r["server"] == "graphc":
            assert mt["exact_length"] == 32 and mt["output_tokens"] == targets


def test_keep_servers_starts_each_server_once_over_the_repeats(model_dir, tmp_path):
    """--keep-servers: two repeats on one graphc start (one startup recorded, one `serve` line in
    its log), and each repeat still measures every rate with every request answered."""
    m = model_dir("llama")
    out = tmp_path / "serving.json"
    rc = main(["bench", "--serving", "--model", str(m), "--requests", "4", "--rates", "inf",
               "--serving-repeats", "2", "--keep-servers", "--settle", "0.2", "--servers", "graphc", "--max-batch", "4",
               "--min-input", "16", "--max-input", "32", "--min-output", "4", "--max-output", "8",
               "--json", str(out), "--log-dir", str(tmp_path / "logs"), "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [s["server"] for s in res["startup"]] == ["graphc"]
    assert res["config"]["settle"] == 0.2  # it idled that long after ready, once (one start)
    assert sorted(r["repeat"] for r in res["runs"]) == [0, 1]
    assert all(r["metrics"]["errors"] == 0 and r["metrics"]["exact_length"] == 4 for r in res["runs"])
    assert (tmp_path / "logs" / "graphc.log").read_text().count("$ ") == 1


def test_a_server_that_broke_is_started_again_for_the_runs_left(model_dir, tmp_path, monkeypatch, capsys):
    """--keep-servers runs a server's repeats on one start; when a run leaves it broken (its log says
    so), the runs after it would only count errors, so the server is started again for them. The
    first run here is made to fail as a dead server's would; the second runs on a fresh start."""
    from graphc.benchmarks.serving import run as serving_run

    real, calls = serving_run._measure, []

    def broken_once(srv, *a, **kw):
        calls.append(srv.proc.pid)
        m = real(srv, *a, **kw)
        if len(calls) == 1:
            m.update(errors=4, server_failure="mlx_lm.server generation thread died: out of memory")
        return m

    monkeypatch.setattr(serving_run, "_measure", broken_once)
    m = model_dir("llama")
    out = tmp_path / "serving.json"
    rc = main(["bench", "--serving", "--model", str(m), "--requests", "2", "--rates", "inf",
               "--serving-repeats", "2", "--keep-servers", "--servers", "graphc", "--max-batch", "2",
               "--min-input", "16", "--max-input", "32", "--min-output", "4", "--max-output", "6",
               "--json", str(out), "--log-dir", str(tmp_path / "logs"), "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [(s["server"], s["repeat"]) for s in res["startup"]] == [("graphc", 0), ("graphc", 1)]
    assert len(calls) == 2 and calls[0] != calls[1]  # the second run met another process
    by_rep = {r["repeat"]: r["metrics"] for r in res["runs"]}
    assert by_rep[0]["server_failure"] and by_rep[1]["errors"] == 0 and "server_failure" not in by_rep[1]
    err = capsys.readouterr().err
    assert "restarting graphc for the 1 runs left" in err
    assert "warning: graphc broke during this run" in err and "--kv-budget-tokens" in err  # the out-of-memory hint


def test_a_broken_server_is_named_with_its_log_line(tmp_path):
    """A run with errors looks in the server's log from where the run began: a CUDA out-of-memory
    or a dead generation thread is printed next to the errors (with what to try), and a plain log
    says nothing."""
    from graphc.benchmarks.serving.run import FAILURE_HINTS
    from graphc.benchmarks.serving.servers import SERVERS, Server

    spec = next(s for s in SERVERS if s.name == "mlx_lm")
    log = tmp_path / "mlx_lm.log"
    log.write_text("INFO: an earlier run ran out of memory\n")  # before the run: not this run's failure
    srv = Server(spec, str(tmp_path), 1, 4, log)
    start = srv.log_size()
    with open(log, "a") as f:
        f.write('INFO: 127.0.0.1 - "POST /v1/completions HTTP/1.1" 200 OK\n')
    assert srv.failure_since(start) is None
    with open(log, "a") as f:
        f.write("2026-12-05 22:44:00,350 - ERROR - mlx_lm.server generation thread died: "
                "cudaMallocAsync(&data, size, stream) failed: out of memory\n")
    why = srv.failure_since(start)
    assert why is not None and "generation thread died" in why
    assert "--prompt-concurrency" in FAILURE_HINTS["mlx_lm"]


def test_mlx_env_reaches_mlx_lm_server_only_and_bad_pairs_are_named(tmp_path):
    """--mlx-env KEY=VALUE: the variable is in mlx_lm.server's environment (and its log's command
    line), not graphc's; a pair without '=' is refused with the flag named."""

    from graphc.benchmarks.serving.run import _env_pairs
    from graphc.benchmarks.serving.servers import SERVERS, Server

    assert _env_pairs(["MLX_USE_CUDA_GRAPHS=0", "A=b=c"]) == {"MLX_USE_CUDA_GRAPHS": "0", "A": "b=c"}
    with pytest.raises(SystemExit, match="--mlx-env takes KEY=VALUE"):
        _env_pairs(["MLX_USE_CUDA_GRAPHS"])
    spec = {s.name: s for s in SERVERS}
    mlx = Server(spec["mlx_lm"], str(tmp_path), 1, 4, tmp_path / "m.log", env={"MLX_USE_CUDA_GRAPHS": "0"})
    assert mlx.env["MLX_USE_CUDA_GRAPHS"] == "0" and mlx.env["PATH"] == os.environ["PATH"]
    assert Server(spec["graphc"], str(tmp_path), 2, 4, tmp_path / "g.log").env is None  # graphc: inherited
