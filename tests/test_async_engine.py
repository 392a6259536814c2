"""The embedding API: Engine.stream on the caller's loop, AsyncEngine on its own thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from graphc.runtime.latency_histograms import Histogram
from graphc.runtime import AsyncEngine, Engine, SamplingParams
from graphc.runtime.async_engine import EngineClosed
from helpers import random_prompts

P = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.load(model_dir("llama"))


@pytest.fixture(scope="module")
def prompts(engine):
    return random_prompts(6, engine.vocab_size, [4, 19, 1, 33], seed=2)


@pytest.fixture(scope="module")
def reference(engine, prompts):
    return [r.token_ids for r in engine.generate(prompts, P)]


@pytest.fixture
def aengine(engine):
    a = AsyncEngine(engine)
    yield a
    a.shutdown()


async def collect(stream):
    ids, text, last = [], "", None
    async for out in stream:
        ids += out.new_token_ids
        text += out.new_text
        last = out
    return ids, text, last


def test_engine_stream_on_the_callers_loop(engine, prompts, reference):
    async def main():
        return await asyncio.gather(*[collect(engine.stream(p, P)) for p in prompts])

    got = asyncio.run(main())
    assert [ids for ids, _, _ in got] == reference
    assert all(last.finished and last.finish_reason == "length" for _, _, last in got)
    assert not engine.has_unfinished()


def test_engine_stream_break_aborts(engine, prompts):
    async def main():
        async for _ in engine.stream(prompts[0], SamplingParams(max_tokens=500, ignore_eos=True)):
            break

    asyncio.run(main())
    assert not engine.has_unfinished() and engine.runner.kv_bytes == 0


def test_async_engine_streams_match_generate(aengine, prompts, reference):
    async def main():
        return await asyncio.gather(*[collect(aengine.stream(p, P)) for p in prompts])

    got = asyncio.run(main())
    assert [ids for ids, _, _ in got] == reference


def test_generate_result_and_text(aengine, engine, prompts, reference):
    res = asyncio.run(aengine.generate(prompts[1], P))
    assert res.token_ids == reference[1] and res.finish_reason == "length"
    assert res.text == engine.tokenizer.decode(res.token_ids)


def test_submissions_from_many_threads_and_loops(aengine, prompts, reference):
    results = [None] * len(prompts)

    def in_own_loop(i):  # each thread runs its own event loop
        results[i] = asyncio.run(collect(aengine.stream(prompts[i], P)))[0]

    def blocking(i):  # no event loop at all
        results[i] = aengine.generate_blocking(prompts[i], P, timeout=30).token_ids

    threads = [threading.Thread(target=in_own_loop if i % 2 else blocking, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == reference


def test_iter_blocking_yields_deltas(aengine, prompts, reference):
    with aengine.iter_blocking(prompts[2], P, timeout=30) as it:
        ids = [t for out in it for t in out.new_token_ids]
    assert ids == reference[2] and it.result.token_ids == ids


def test_abort_from_another_thread(aengine):
    async def main():
        stream = await aengine.add_request([5, 6, 7], SamplingParams(max_tokens=3000, ignore_eos=True))
        first = await stream.__anext__()
        threading.Thread(target=aengine.abort, args=(stream.request_id,)).start()
        ids, _, last = await collect(stream)
        return first, ids, last, stream

    first, ids, last, stream = asyncio.run(main())
    assert last.finished and last.finish_reason == "abort"
    assert len(first.new_token_ids) + len(ids) < 3000
    assert stream.result.finish_reason == "abort"
    _wait(lambda: aengine.num_inflight == 0 and aengine.snapshot.running == 0)
    assert aengine.engine.runner.kv_bytes == 0


def test_cancelled_task_aborts(aengine):
    async def main():
        task = asyncio.create_task(aengine.generate([9, 9, 9], SamplingParams(max_tokens=3000, ignore_eos=True)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _wait(lambda: aengine.num_inflight == 0 and aengine.snapshot.running == 0)
    assert aengine.snapshot.finished.get("abort", 0) >= 1


def test_bad_params_raise_value_error(aengine):
    with pytest.raises(ValueError, match="top_p"):
        asyncio.run(aengine.generate("hi", SamplingParams(top_p=0)))
    with pytest.raises(ValueError, match="out of range"):
        asyncio.run(aengine.generate([10 ** 6], P))
    assert aengine.num_inflight == 0


def test_group_tags_outputs_by_index(aengine, prompts, reference):
    async def main():
        group = await aengine.add_group([(p, P, None) for p in prompts[:3]])
        ids = {i: [] for i in range(3)}
        async for i, out in group:
            ids[i] += out.new_token_ids
        return ids, group

    ids, group = asyncio.run(main())
    assert [ids[i] for i in range(3)] == reference[:3]
    assert [r.token_ids for r in group.results] == reference[:3]


def test_idle_thread_sleeps(aengine):
    asyncio.run(aengine.generate("warm", SamplingParams(max_tokens=2)))
    cpu0 = time.process_time()
    time.sleep(0.3)
    # The engine thread blocks on its queue: the process burns (almost) no CPU while idle.
    assert time.process_time() - cpu0 < 0.1


def test_idle_warm_up_runs_on_the_engine_thread_between_commands_then_sleeps(engine, prompts, reference):
    """Warm-up shapes left by the time caps (Engine.idle_warm) run one at a time while no request is
    in the engine, on the engine thread; a request that arrives meanwhile is served with its answer
    unchanged; with the queue empty the thread blocks again."""
    ran, gate = [], threading.Event()

    def shape():
        ran.append(threading.current_thread())
        gate.wait(0.05)

    engine.idle_warm.extend([shape] * 40)
    a = AsyncEngine(engine)
    try:
        assert [a.generate_blocking(p, P).token_ids for p in prompts[:2]] == reference[:2]
        deadline = time.monotonic() + 30
        while engine.idle_warm and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.idle_warm and len(ran) == 40 and set(ran) == {a._thread}
        cpu0 = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - cpu0 < 0.1  # idle again: blocked on its queue
    finally:
        a.shutdown()
        engine.idle_warm.clear()


def test_idle_warm_up_waits_for_a_quiet_engine(engine, prompts, reference, monkeypatch):
    """A client that sends its next request as soon as the last one ended (an agent's loop) must
    not find the engine inside a warm-up shape: shapes wait until the engine has been idle for
    AsyncEngine.IDLE_WARM_AFTER_S."""
    ran = []
    monkeypatch.setattr(AsyncEngine, "IDLE_WARM_AFTER_S", 60.0)
    engine.idle_warm.extend([lambda: ran.append(1)] * 5)
    a = AsyncEngine(engine)
    try:
        assert [a.generate_blocking(p, P).token_ids for p in prompts[:3]] == reference[:3]
        a.call(lambda e: None).result()
        assert ran == [] and len(engine.idle_warm) == 5  # never quiet for 60 s: nothing built
        monkeypatch.setattr(AsyncEngine, "IDLE_WARM_AFTER_S", 0.0)
        a.call(lambda e: None).result()  # wakes the thread, which finds the engine quiet now
        deadline = time.monotonic() + 30
        while engine.idle_warm and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ran) == 5 and not engine.idle_warm
    finally:
        a.shutdown()
        engine.idle_warm.clear()


def test_shutdown_ends_streams_with_abort(engine):
    a = AsyncEngine(engine)

    async def main():
        stream = await a.add_request([3, 4], SamplingParams(max_tokens=3000, ignore_eos=True))
        await stream.__anext__()
        threading.Thread(target=a.shutdown).start()
        return await collect(stream)

    _, _, last = asyncio.run(main())
    assert last.finish_reason == "abort"
    a.shutdown()
    assert not a.alive
    with pytest.raises(EngineClosed):
        a.submit("x", P, lambda *_: None)
    assert not engine.has_unfinished()


def test_call_runs_on_the_engine_thread(aengine):
    name = aengine.call(lambda eng: threading.current_thread().name).result(10)
    assert name == "graphc-engine"


def _wait(cond, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_grammars_compile_off_the_engine_thread(engine, aengine):
    import json

    from graphc.runtime.grammar import Grammar, GrammarError

    compiled_on = []
    real = engine.grammar_compiler.compile

    def spy(g):
        compiled_on.append(threading.current_thread())
        return real(g)

    engine.grammar_compiler.compile = spy
    try:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                  "required": ["n"], "additionalProperties": False}
        params = SamplingParams(max_tokens=30, grammar=Grammar.json_schema(schema))

        async def main():
            a, b = await asyncio.gather(collect(await aengine.add_request([5, 6, 7], params)),
                                        collect(await aengine.add_request([8, 9], params)))
            with pytest.raises(GrammarError):
                await aengine.add_request([5], SamplingParams(grammar=Grammar.lark("start: (")))
            return a, b

        (ids_a, text_a, _), (ids_b, text_b, _) = asyncio.run(main())
    finally:
        del engine.grammar_compiler.compile
    assert len(compiled_on) == 3 and aengine._thread not in compiled_on
    for text in (text_a, text_b):  # one matcher per request: both outputs are whole documents
        assert 0 <= json.loads(text)["n"] <= 99


def test_a_request_crosses_as_plain_values_one_queue_each_way(engine, prompts, reference):
    """In: a Submit value on the command queue; out: StreamEvent values on the outbox the
    submission named (here a plain queue.SimpleQueue) — the same tokens as Engine.generate, the
    last event carrying the GenerationResult. Nothing of the caller runs on the engine thread
    but the outbox's put."""
    import queue

    from graphc.runtime.async_streams import StreamEvent

    a = AsyncEngine(engine)
    try:
        box: queue.SimpleQueue = queue.SimpleQueue()
        rid, prompt_ids = a.submit(prompts[0], P, box).result(10)
        ids, events = [], []
        while not (events and events[-1].out.finished):
            events.append(box.get(timeout=10))
            ids += events[-1].out.new_token_ids
        assert all(type(e) is StreamEvent and e.error is None for e in events)
        assert ids == reference[0] and events[-1].out.request_id == rid
        assert events[-1].result.token_ids == reference[0] and events[-1].result.prompt_ids == prompt_ids
        assert all(e.result is None for e in events[:-1])  # the result comes with the final delta only
    finally:
        a.shutdown()


def test_a_bad_submission_fails_its_future_and_sends_nothing(engine):
    import queue

    a = AsyncEngine(engine)
    try:
        box: queue.SimpleQueue = queue.SimpleQueue()
        with pytest.raises(ValueError, match="empty"):
            a.submit([], P, box).result(10)
        assert box.empty() and a.num_inflight == 0
    finally:
        a.shutdown()


def test_a_steps_events_reach_a_loop_in_one_hand_over(aengine, prompts, reference, monkeypatch):
    """Six streams on one event loop: each engine iteration hands its events for that loop over in
    one call_soon_threadsafe (async_streams.deliver_all), never one per stream, and every stream
    still gets its tokens in order."""
    from graphc.runtime import async_streams as ae  # hand_over looks deliver_all up there

    sizes = []
    plain = ae.deliver_all

    def deliver_all(items, *timing):
        sizes.append(len(items))
        plain(items, *timing)

    monkeypatch.setattr(ae, "deliver_all", deliver_all)

    async def main():
        loop = asyncio.get_running_loop()
        calls = []
        real = loop.call_soon_threadsafe

        def counting(cb, *args, **kw):
            calls.append(cb)
            return real(cb, *args, **kw)

        loop.call_soon_threadsafe = counting
        got = await asyncio.gather(*[collect(aengine.stream(p, P)) for p in prompts])
        return got, calls

    got, calls = asyncio.run(main())
    assert [ids for ids, _, _ in got] == reference
    events = [cb for cb in calls if cb is deliver_all or getattr(cb, "__name__", "") in ("deliver", "put_nowait")]
    assert events and all(cb is deliver_all for cb in events)  # no per-event hand-over
    assert max(sizes) >= 2 and len(sizes) < sum(sizes)  # iterations carried several streams' events at once


def test_token_gaps_and_hand_over_waits_are_histograms(aengine, prompts, reference):
    """The snapshot's itl histogram holds one observation per gap between a stream's deltas that
    carry tokens, and handover one per hand-over to the loop; a later stream adds to them."""

    async def deltas(stream):
        n = 0
        async for out in stream:
            n += bool(out.new_token_ids)
        return n

    async def main():
        return await asyncio.gather(*[deltas(aengine.stream(p, P)) for p in prompts])

    counts = asyncio.run(main())
    lat = aengine.snapshot.latency
    assert lat["itl"].count == sum(n - 1 for n in counts) and lat["itl"].count >= len(prompts)
    assert lat["itl"].total > 0
    more = asyncio.run(main())
    after = aengine.snapshot.latency
    assert after["itl"].count == lat["itl"].count + sum(n - 1 for n in more)
    # a snapshot is taken before its iteration's hand-over: by now the first run's are all in it,
    # at least one per step of its longest stream
    assert after["handover"].count >= max(counts)


def test_steps_are_timed_by_what_they_did(aengine, prompts):
    """Every engine step's wall time lands in one of the step histograms: the steps that ran the
    prompts (alone: prefill; with rows decoding: mixed) and the decode-only ones."""
    from graphc.runtime.latency_histograms import step_kind

    assert [step_kind(0, 3), step_kind(12, 3), step_kind(12, 0)] == ["step_decode", "step_mixed", "step_prefill"]

    async def main():
        await asyncio.gather(*[collect(aengine.stream(p, P)) for p in prompts])
        return aengine.snapshot

    lat = asyncio.run(main()).latency
    kinds = {k: lat.get(k, Histogram()).count for k in ("step_decode", "step_mixed", "step_prefill")}
    assert kinds["step_prefill"] + kinds["step_mixed"] >= 1  # the prompts ran in some step
    assert sum(kinds.values()) >= P.max_tokens - 1  # a step for every token after each stream's first
    assert kinds["step_decode"] >= P.max_tokens // 2 and lat["step_decode"].total > 0
