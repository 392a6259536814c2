"""Budget pressure: the KV budget is a hard cap (never exceeded after any step, by admission,
decode growth or one long request alone) and the prefix pool never holds more than its slots;
requests under pressure still produce their solo tokens; nothing leaks."""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from helpers import random_prompts


@pytest.fixture(scope="module")
def mdir(model_dir):
    return model_dir("llama")


def _drive(eng, prompts, params):
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    reqs = [eng.scheduler.by_id[i] for i in ids]
    peak, steps = 0, 0
    budget = eng.scheduler.kv_budget
    while eng.has_unfinished():
        eng.step()
        steps += 1
        peak = max(peak, eng.scheduler.kv_tokens())
        assert eng.scheduler.kv_tokens() <= budget, (steps, eng.scheduler.kv_tokens(), budget)
        if eng.prefix is not None:
            assert eng.prefix.slots.used <= eng.prefix.slots.capacity
        assert steps < 20000
    return [eng.result(r) for r in reqs], peak


@pytest.mark.parametrize("n,budget", [(12, 300), pytest.param(48, 600, marks=pytest.mark.slow)])
def test_kv_budget_is_never_exceeded_and_outputs_match_solo(mdir, n, budget):
    eng = Engine.load(mdir, max_batch=16, kv_budget_tokens=budget, max_total_tokens=512)
    prompts = random_prompts(n, eng.vocab_size, [20 + (i * 37) % 150 for i in range(n)], seed=5)
    params = [SamplingParams(max_tokens=40 + i % 30, ignore_eos=True, temperature=0.7 * (i % 2), seed=i)
              for i in range(n)]
    results, peak = _drive(eng, prompts, params)
    assert eng.stats["preemptions"] > 0  # the budget did bind
    assert peak <= budget
    solo = Engine.load(mdir, max_batch=1)
    for p, sp, res in zip(prompts, params, results):
        assert res.finish_reason == "length"
        [ref] = solo.generate([p], sp)
        assert res.token_ids == ref.token_ids
    assert not eng.has_unfinished() and eng.runner.rows == []
    eng.prefix.check()
    assert eng.prefix.holds == {}


def test_one_request_alone_cannot_outgrow_the_budget(mdir):
    """Alone, nothing can be preempted for it: it ends with "length" where the budget is full."""
    eng = Engine.load(mdir, max_batch=4, kv_budget_tokens=200)
    [p] = random_prompts(1, eng.vocab_size, [150], seed=1)
    results, peak = _drive(eng, [p], [SamplingParams(max_tokens=500, ignore_eos=True)])
    assert results[0].finish_reason == "length"
    assert 150 + len(results[0].token_ids) <= 200
    assert peak <= 200


def test_default_prefix_pool_on_cpu_is_bounded(mdir):
    from graphc.runtime.prefix_sizing import DEFAULT_CPU_POOL_BYTES

    eng = Engine.load(mdir)
    stats = eng.cache_stats()
    assert stats["pool_capacity_bytes"] <= DEFAULT_CPU_POOL_BYTES
    assert stats["pool_slots"] == eng.prefix.slots.capacity


@pytest.mark.parametrize("clients", [16, pytest.param(64, marks=pytest.mark.slow)])
def test_kv_gauge_never_exceeds_the_budget_under_http_load(mdir, clients):
    """The issue's setup (--kv-budget-tokens 1500, long generations): /metrics' peak gauge stays
    within the budget, requests that ask for more than the budget could ever hold get 400."""
    import concurrent.futures

    import httpx

    from server_harness import live_server

    with live_server(mdir, max_batch=32, kv_budget_tokens=1500) as srv:
        def one(i):
            scale = 100 if clients > 16 else 50  # the fast run: shorter, still 3x over the budget
            body = {"prompt": "Tell me a story " * (1 + i % 20), "max_tokens": 2 * scale + (i % 5) * scale,
                    "ignore_eos": True, "stream": i % 2 == 0}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=300)
            return r.status_code

        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            codes = list(pool.map(one, range(clients)))
        assert codes == [200] * clients
        peak = srv.metric("graphc_kv_budget_peak_tokens", model="tiny")
        print(f"kv budget 1500, {clients} clients: peak {peak:.0f}, "
              f"preemptions {srv.metric('graphc_preemptions_total', model='tiny'):.0f}")
        assert 0 < peak <= 1500
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1500}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
