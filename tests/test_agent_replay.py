"""benchmarks/agent_replay.py without servers: the replayed conversation grows by prefixes, its
cold twin has the same lengths and shares nothing, and the summary's ratios are per repeat."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")
pytest.importorskip("tokenizers")

from graphc.benchmarks.agent_replay import ReplayConfig, conversation, summarize, table  # noqa: E402


def test_turns_grow_by_prefix_and_cold_turns_share_nothing(model_dir):
    replay, cold = conversation(str(model_dir("llama")), context=512, turns=4, seed=1)
    assert [r.prompt_tokens for r in replay] == sorted(r.prompt_tokens for r in replay)
    assert abs(replay[-1].prompt_tokens - 512) <= 8  # a text cut from token ids re-tokenizes about as long
    for a, b in zip(replay, replay[1:]):
        assert b.prompt.startswith(a.prompt)
    assert [abs(c.prompt_tokens - r.prompt_tokens) <= 8 for c, r in zip(cold, replay)] == [True] * 4
    assert not any(c.prompt[:200] == replay[-1].prompt[:200] for c in cold[1:])


def test_summary_ratios_are_to_the_same_repeats_cold_pass():
    cfg = ReplayConfig(model="m", turns=3, repeats=2, servers=("graphc",))
    runs = [{"server": "graphc", "repeat": 0, "pass": "cold", "ttft": [1.0, 2.0, 4.0]},
            {"server": "graphc", "repeat": 1, "pass": "cold", "ttft": [1.0, 2.0, 8.0]},
            {"server": "graphc", "repeat": 0, "pass": "warm", "ttft": [1.0, 0.2, 0.4]},
            {"server": "graphc", "repeat": 1, "pass": "warm", "ttft": [1.0, 0.2, 0.4]},
            {"server": "graphc", "repeat": 0, "pass": "restart", "ttft": [0.8]},
            {"server": "graphc", "repeat": 1, "pass": "restart", "ttft": [0.8]}]
    s = summarize(runs, cfg)
    warm = s["graphc/warm"]
    assert warm["vs_cold_last_turn"]["min"] == pytest.approx(0.05) and warm["vs_cold_last_turn"]["max"] == 0.1
    assert warm["vs_cold_turns_2_on"]["median"] == pytest.approx((0.6 / 6 + 0.6 / 10) / 2)
    assert s["graphc/restart"]["per_turn"][:2] == [None, None]
    assert s["graphc/restart"]["vs_cold_turns_2_on"] is None
    text = table({"summary": s, "turn_tokens": [10, 20, 30]})
    assert "| graphc/restart | - | - | 800 (800-800) | 0.150 (0.100-0.200) | - |" in text


@pytest.mark.parametrize("passes, started, recorded", [
    (("cold", "warm", "disk", "restart"), ["graphc", "graphc+disk", "graphc+disk", "graphc+disk"],
     ["cold", "warm", "disk", "restart"]),
    (("cold", "warm", "restart"), ["graphc", "graphc+disk", "graphc+disk"], ["cold", "warm", "restart"]),
    (("cold",), ["graphc"], ["cold"]),
])
def test_replay_passes_choose_which_servers_start_and_what_is_timed(monkeypatch, model_dir, passes, started, recorded):
    """--replay-passes: a pass left out starts no server process and times nothing; cold always runs."""
    from contextlib import contextmanager

    from graphc.benchmarks import agent_replay as ar

    starts = []

    @contextmanager
    def fake_server(spec, model, port, n, log, extra):
        starts.append(spec.name + ("+disk" if "--kv-cache-dir" in extra else ""))
        yield "http://fake"

    monkeypatch.setattr(ar, "Server", fake_server)
    gaps = set()

    def fake_replay(url, reqs, max_tokens, body, engine=None, gap=0.0):
        if engine is not None:
            engine.extend([0.05] * len(reqs))
            gaps.add(gap)
        return [0.1] * len(reqs)

    monkeypatch.setattr(ar, "replay", fake_replay)
    monkeypatch.setattr(ar, "disk_counters", lambda url: {"graphc_prefix_cache_disk_choices_total{choice=\"read\"}": 1.0})
    cfg = ReplayConfig(model=str(model_dir("llama")), context=256, turns=2, repeats=1, servers=("graphc",),
                       passes=passes, log_dir="/tmp/graphc-test-replay-logs", gap=1.5)
    out = ar.run_replay(cfg, log=lambda line: None)
    assert starts == started
    assert gaps == {1.5}  # --replay-gap: every timed pass waits it between turns
    assert [r["pass"] for r in out["runs"]] == recorded
    assert all(r["engine_ttft"] == [0.05] * len(r["ttft"]) for r in out["runs"])  # graphc's engine side, per turn
    if "restart" in passes:  # what the restarted server did with its disk hit rides with its turn
        assert out["runs"][-1]["disk"] == {'graphc_prefix_cache_disk_choices_total{choice="read"}': 1.0}


def test_the_restart_records_what_the_disk_tier_chose():
    from graphc.benchmarks.agent_replay import parse_disk_counters

    text = "\n".join([
        '# TYPE graphc_prefix_cache_disk_choices_total counter',
        'graphc_prefix_cache_disk_choices_total{model="llama-3.1-8b",choice="read"} 0',
        'graphc_prefix_cache_disk_choices_total{model="llama-3.1-8b",choice="recompute"} 1',
        'graphc_prefix_cache_disk_recomputed_tokens_total{model="llama-3.1-8b"} 31488',
        'graphc_prefix_cache_hit_tokens_total{model="llama-3.1-8b"} 5'])
    assert parse_disk_counters(text) == {
        'graphc_prefix_cache_disk_choices_total{choice="read"}': 0.0,
        'graphc_prefix_cache_disk_choices_total{choice="recompute"}': 1.0,
        "graphc_prefix_cache_disk_recomputed_tokens_total": 31488.0}


def test_a_live_replay_splits_each_turn_into_engine_and_door(model_dir, tmp_path):
    """On a real `graphc serve`: each timed turn has its TTFT on the engine's clock (from /metrics,
    scraped between turns) beside the client's, and the engine's part is no longer than the whole."""
    from graphc.benchmarks.agent_replay import run_replay

    cfg = ReplayConfig(model=str(model_dir("llama")), context=256, turns=2, repeats=1, servers=("graphc",),
                       passes=("cold", "warm"), log_dir=str(tmp_path / "logs"))
    lines = []
    out = run_replay(cfg, log=lines.append)
    assert [r["pass"] for r in out["runs"]] == ["cold", "warm"]
    for r in out["runs"]:
        assert len(r["engine_ttft"]) == len(r["ttft"]) == 2
        assert all(0 < e <= t for e, t in zip(r["engine_ttft"], r["ttft"]))
    assert any("in the engine" in line for line in lines)


def test_the_gap_is_waited_between_turns_not_timed(monkeypatch):
    """--replay-gap sleeps before every turn but the first, outside the timed request."""
    from graphc.benchmarks import agent_replay as ar
    from graphc.benchmarks.serving.workload import Request

    events = []

    class FakeResponse:
        status_code = 200

    class FakeClient:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def post(self, url, json):
            events.append(("post", json["prompt"]))
            return FakeResponse()

    monkeypatch.setattr(ar.httpx, "Client", FakeClient)
    monkeypatch.setattr(ar.time, "sleep", lambda s: events.append(("sleep", s)))
    reqs = [Request(t, 1, 0) for t in ("a", "ab", "abc")]
    assert len(ar.replay("http://fake", reqs, 1, {}, gap=2.0)) == 3
    assert events == [("post", "a"), ("sleep", 2.0), ("post", "ab"), ("sleep", 2.0), ("post", "abc")]
    events.clear()
    ar.replay("http://fake", reqs, 1, {})
    assert [e for e, _ in events] == ["post"] * 3  # no gap by default


def test_a_negative_gap_is_refused(model_dir, capsys):
    from graphc.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--agent-replay", "--model", str(model_dir("llama")), "--replay-gap", "-1"])
    assert "--replay-gap must be >= 0" in str(e.value)
