"""Many concurrent streams give the same greedy outputs as one-by-one runs; clients that leave
mid-request abort it and the engine returns to its baseline (no running rows, no KV, no pool slots held)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest

from helpers import random_prompts
from server_harness import MODEL, live_server, wait_until

N_STREAMS = 32
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama"), prefill_chunk=32) as s:
        yield s


def requests_under_test():
    """24 completions (token ids of varied lengths) and 8 chats."""
    reqs = [("completion", p) for p in random_prompts(24, 1024, [3, 17, 40, 1, 64, 9], seed=7)]
    reqs += [("chat", [{"role": "user", "content": f"Story number {i}, please."}]) for i in range(8)]
    return reqs


async def run_stream(client, kind, prompt):
    common = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, stream=True, extra_body={"ignore_eos": True})
    text = ""
    if kind == "completion":
        async for c in await client.completions.create(prompt=prompt, **common):
            text += c.choices[0].text
    else:
        async for c in await client.chat.completions.create(messages=prompt, **common):
            if c.choices:
                text += c.choices[0].delta.content or ""
    return text


def run_one(client, kind, prompt):
    common = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    if kind == "completion":
        return client.completions.create(prompt=prompt, **common).choices[0].text
    return client.chat.completions.create(messages=prompt, **common).choices[0].message.content


def test_32_concurrent_streams_equal_one_by_one(server):
    reqs = requests_under_test()
    assert len(reqs) == N_STREAMS
    sync = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    one_by_one = [run_one(sync, k, p) for k, p in reqs]

    async def all_at_once():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                    http_client=openai.DefaultAsyncHttpxClient(
                                        limits=httpx.Limits(max_connections=64)))
        async with client:
            return await asyncio.gather(*[run_stream(client, k, p) for k, p in reqs])

    steps_before = server.state.engine.runner.steps
    together = asyncio.run(all_at_once())
    assert together == one_by_one
    # They really shared batches: far fewer decode steps than 32 x 12.
    assert server.state.engine.runner.steps - steps_before < N_STREAMS * MAX_TOKENS // 2


def baseline(server):
    """What a finished request must give back. The prefix cache may keep a prompt's KV in its
    tree (that is caching, not a leak), so pool slots are counted outside the tree, with tree locks."""
    snap = server.state.aengine.snapshot
    c = snap.cache
    pool_outside_tree = c.get("pool_used", 0) - c.get("tree_tokens", 0)
    return snap.inflight, snap.running, snap.waiting, snap.kv_bytes, c.get("held_requests", 0), pool_outside_tree


def back_to_baseline(server, base) -> bool:
    a = server.state.aengine
    return a.num_inflight == 0 and baseline(server) == base


def test_stream_disconnect_aborts_and_frees(server):
    assert wait_until(lambda: server.state.aengine.num_inflight == 0)
    base = baseline(server)
    assert base[:3] == (0, 0, 0) and base[4:] == (0, 0)
    aborted = server.metric("graphc_requests_finished_total", reason="abort")
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert server.state.aengine.snapshot.running + server.state.aengine.num_inflight >= 1
    # The client is gone: the request must be aborted long before its 4000 tokens.
    assert wait_until(lambda: back_to_baseline(server, base), timeout=3)
    assert server.metric("graphc_requests_finished_total", reason="abort") == aborted + 1
    assert server.metric("graphc_requests_running") == 0
    assert server.metric("graphc_kv_cache_bytes") == base[3]
    if server.state.aengine.snapshot.cache.get("enabled"):
        assert server.metric("graphc_kv_pool_used_slots") == server.metric("graphc_prefix_cache_tree_tokens")
        assert server.metric("graphc_prefix_cache_held_requests") == 0


def test_non_stream_disconnect_aborts(server):
    assert wait_until(lambda: server.state.aengine.num_inflight == 0)
    base = baseline(server)
    aborted = server.metric("graphc_requests_finished_total", reason="abort")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    assert wait_until(lambda: back_to_baseline(server, base), timeout=3)
    assert server.metric("graphc_requests_finished_total", reason="abort") == aborted + 1


def test_many_disconnects_then_outputs_unchanged(server):
    sync = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    kind, prompt = requests_under_test()[0]
    before = run_one(sync, kind, prompt)
    base = baseline(server)

    def leave_early(i):
        body = {"model": MODEL, "prompt": f"Tale {i}", "max_tokens": 3000, "n": 2, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            for j, _ in enumerate(r.iter_lines()):
                if j >= 4 + i:
                    break

    threads = [threading.Thread(target=leave_early, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert wait_until(lambda: back_to_baseline(server, base), timeout=5), (base, baseline(server),
                                                                           server.state.aengine.num_inflight)
    assert run_one(sync, kind, prompt) == before



def test_tight_kv_budget_preempts_but_outputs_stay_exact(model_dir):
    """Streams that cannot all fit the KV budget: the scheduler preempts and recomputes, the
    greedy outputs still equal one-by-one runs, and a prompt that can never fit is a clean 400."""
    reqs = [("completion", p) for p in random_prompts(8, 1024, [30, 24, 36, 28], seed=3)]
    with live_server(model_dir("llama"), kv_budget_tokens=160, max_batch=8) as srv:
        sync = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        one_by_one = [run_one(sync, k, p) for k, p in reqs]

        async def all_at_once():
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
                return await asyncio.gather(*[run_stream(client, k, p) for k, p in reqs])

        assert asyncio.run(all_at_once()) == one_by_one
        assert srv.metric("graphc_preemptions_total") > 0
        assert srv.metric("graphc_kv_budget_tokens") == 160
        with pytest.raises(openai.BadRequestError) as e:
            sync.completions.create(model=MODEL, prompt=[5] * 150, max_tokens=2)
        assert e.value.body["code"] == "context_length_exceeded"
        assert wait_until(lambda: srv.state.aengine.num_inflight == 0)
