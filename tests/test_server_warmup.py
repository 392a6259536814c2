"""`graphc serve --warmup` (on by default): a greedy and a sampled request run before the server
reports ready, and /metrics counts only client traffic afterwards (runtime/warmup.py)."""

import threading

import httpx
import pytest

from graphc.cli.main import build_parser
from graphc.runtime.engine import Engine
from graphc.runtime.server.cli import config_from_args
from server_harness import MODEL, live_server, wait_until


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=60)


def completion(**kw):
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 2, **kw}


def _spied_loader(path, calls: list, fail: bool = False, threads: list | None = None):
    def loader():
        eng = Engine.load(path)
        real = eng.generate

        def generate(prompts, params=None, **kw):
            calls.append((len(prompts), params))
            if threads is not None:
                threads.append(threading.current_thread())
            if fail:
                raise ValueError("no kernel for this")
            return real(prompts, params, **kw)

        eng.generate = generate
        return eng

    return loader


def test_warmup_runs_greedy_and_sampled_before_ready_and_leaves_the_counters_at_zero(model_dir):
    calls = []
    with live_server(loader=_spied_loader(model_dir("llama"), calls)) as srv:
        assert wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, timeout=60)
        assert [n for n, _ in calls] == [1, 1]  # batch 1 each
        greedy, sampled = (p for _, p in calls)
        assert greedy.temperature == 0 and sampled.temperature > 0 and sampled.top_p < 1 and sampled.top_k > 0
        assert greedy.ignore_eos and sampled.ignore_eos  # decode steps run even if EOS comes first
        assert srv.state.warmup_s is not None and srv.state.warmup_s > 0
        # the warm-up's 2 x 8 tokens and 2 x 16 prompt tokens are not the clients'
        assert srv.metric("graphc_generation_tokens_total", model=MODEL) == 0
        assert srv.metric("graphc_prompt_tokens_total", model=MODEL) == 0
        r = post(srv, "/v1/completions", completion(max_tokens=3, temperature=0, ignore_eos=True))
        assert r.status_code == 200
        assert srv.metric("graphc_generation_tokens_total", model=MODEL) == 3


def test_the_warmup_runs_on_the_engine_thread_that_then_serves(model_dir):
    """MLX's CUDA backend keeps cuDNN attention plans, handles and encoders per thread: a warm-up on
    the loader thread built plans the engine thread never used (the door's first run paid them)."""
    threads = []
    with live_server(loader=_spied_loader(model_dir("llama"), [], threads=threads)) as srv:
        assert wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, timeout=60)
        engine_thread = srv.state.aengine._thread
        assert threads and all(t is engine_thread for t in threads)
        assert srv.state.engine.warmed_on_thread == engine_thread.ident
        served = []
        srv.state.aengine.call(lambda e: served.append(threading.current_thread())).result()
        assert served == [engine_thread]


def test_async_engine_warm_up_runs_on_its_thread_and_warns_for_another(model_dir, caplog, monkeypatch):
    from graphc.runtime import AsyncEngine
    from graphc.runtime import async_engine

    eng = Engine.load(model_dir("llama"))
    a = AsyncEngine(eng)
    try:
        assert a.warm_up(shapes=False) > 0
        assert eng.warmed_on_thread == a._thread.ident
    finally:
        a.shutdown()
    # warmed here, stepped there: on a GPU the engine thread says so once
    eng.warm_up(shapes=False)
    monkeypatch.setattr(async_engine.mx, "default_device", lambda: async_engine.mx.Device(async_engine.mx.gpu))
    with caplog.at_level("WARNING", logger="graphc.async_engine"):
        b = AsyncEngine(eng)
        b.call(lambda e: None).result()
        b.shutdown()
    assert "warmed up on another thread" in caplog.text


def test_no_warmup_serves_without_it(model_dir):
    calls = []
    with live_server(loader=_spied_loader(model_dir("llama"), calls), warmup=False) as srv:
        assert wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, timeout=60)
        assert calls == [] and srv.state.warmup_s is None
        assert post(srv, "/v1/completions", completion(max_tokens=2)).status_code == 200


def test_a_failing_warmup_is_a_load_error_that_says_so(model_dir):
    with live_server(loader=_spied_loader(model_dir("llama"), [], fail=True)) as srv:
        assert wait_until(lambda: srv.state.load_error is not None, timeout=60)
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "model_load_failed"
        assert "warm-up request" in err["message"] and "no kernel for this" in err["message"]
        assert "--no-warmup" in err["message"]
        assert not srv.state.aengine.alive  # the engine thread that ran the failed warm-up is stopped


def test_warmup_flag():
    p = build_parser()
    assert config_from_args(p.parse_args(["serve"])).warmup is True
    assert config_from_args(p.parse_args(["serve", "--no-warmup"])).warmup is False


def test_engine_warm_up_leaves_stats_as_they_were(model_dir):
    eng = Engine.load(model_dir("llama"))
    eng.generate(["Hello"], None)
    before = dict(eng.stats)
    assert before["generated_tokens"] > 0
    real, seen = eng.generate, []
    eng.generate = lambda prompts, params=None, **kw: seen.append(real(prompts, params, **kw)) or seen[-1]
    assert eng.warm_up() > 0
    assert [len(r[0].token_ids) for r in seen] == [8, 8]  # it ran (ignore_eos: all 8 tokens each)
    eng.generate = real
    assert eng.stats == before
    assert eng.generate(["Hello again"], None)[0].token_ids  # still serves


@pytest.mark.parametrize("budget", [20, 40])
def test_warm_up_fits_a_small_kv_budget(model_dir, budget):
    eng = Engine.load(model_dir("llama"), kv_budget_tokens=budget)
    assert eng.warm_up() > 0  # not refused: a shorter prompt within the budget
    assert eng.generate(["Hi"], None)[0].token_ids


def test_warm_up_refuses_while_requests_are_in_the_engine(model_dir):
    """Its steps would run the clients' requests too, and their tokens would go nowhere."""
    from graphc.runtime import SamplingParams

    eng = Engine.load(model_dir("llama"))
    rid = eng.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(RuntimeError, match="before traffic: 1 request"):
        eng.warm_up()
    while eng.has_unfinished():
        eng.step()
    assert eng.request(rid) is None and eng.warm_up() > 0
