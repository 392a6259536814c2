"""An engine built on one thread and stepped on another (runtime/thread_handoff.py, AsyncEngine.load).

MLX evaluates a lazy array only on the thread whose stream made it. A GPU server restarted with
its self-check verdict stored skipped the check that had evaluated what the load left lazy, and
its engine thread failed every step ("There is no Stream(gpu, 0) in current thread"). The same
rule holds on the CPU, so a lazy array planted by the load reproduces it here."""

from __future__ import annotations

import threading

import httpx
import mlx.core as mx
import pytest

from graphc.runtime import AsyncEngine, Engine, SamplingParams
from graphc.runtime.cache import device_ints
from graphc.runtime.thread_handoff import arrays_of, settle
from server_harness import live_server, wait_until

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _with_lazy_weight(eng: Engine) -> Engine:
    """The engine with one weight left as a lazy op of the calling thread (times 1: same output)."""
    norm = eng.model.model.norm
    norm.weight = norm.weight * 1
    return eng


def _on_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_lazy_array_of_another_thread_cannot_be_evaluated():
    """The MLX rule the rest of this file works around: if MLX drops it, this test fails, and
    runtime/thread_handoff.py may go."""
    lazy = _on_thread(lambda: mx.ones((2,)) + 1)
    with pytest.raises(RuntimeError, match="in current thread"):
        mx.eval(lazy)


def test_async_engine_settles_an_engine_built_on_the_calling_thread(model_dir):
    eng = _with_lazy_weight(Engine.load(model_dir("llama")))
    want = Engine.load(model_dir("llama")).generate(["Hello"], GREEDY)[0].token_ids
    a = AsyncEngine(eng)
    try:
        assert a.generate_blocking("Hello", GREEDY, timeout=60).token_ids == want
    finally:
        a.shutdown()


def test_async_engine_load_builds_on_its_own_thread(model_dir):
    built_on = []

    def build():
        built_on.append(threading.current_thread())
        return _with_lazy_weight(Engine.load(model_dir("llama")))

    a = AsyncEngine.load(build)
    try:
        assert built_on == [a._thread]
        assert len(a.generate_blocking("Hello", GREEDY, timeout=60).token_ids) == 4
    finally:
        a.shutdown()


def test_async_engine_load_raises_what_the_build_raised_and_stops_its_thread():
    def build():
        raise FileNotFoundError("no model folder at '/nowhere'")

    with pytest.raises(FileNotFoundError, match="/nowhere"):
        AsyncEngine.load(build)


def test_the_server_builds_its_engine_on_the_engine_thread(model_dir):
    """`graphc serve`'s loader leaves a lazy weight (as a GPU load with a stored self-check did):
    the server still serves, because the build ran on the thread that steps it."""
    built_on = []

    def loader():
        built_on.append(threading.current_thread())
        return _with_lazy_weight(Engine.load(model_dir("llama")))

    with live_server(loader=loader) as srv:
        assert wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, timeout=60)
        assert built_on == [srv.state.aengine._thread]
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3,
                                                          "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3


def test_settle_finds_the_model_weights_and_the_runtime_state(model_dir):
    eng = Engine.load(model_dir("llama"))
    found = {id(a) for a in arrays_of(eng)}
    params = [v for _, v in __import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(eng.model.parameters())]
    assert params and all(id(p) in found for p in params)
    assert settle(eng) == len(found)


def test_per_row_offsets_are_not_shared_across_threads():
    """device_ints.offsets remembers its last lazy sum for the layers of one step; the per-row array
    it sums is shared by every engine of the process, so that memory must be per thread."""
    rows = device_ints.on_device([3, 1, 4])
    lazy = _on_thread(lambda: device_ints.offsets(rows, 10, 1))
    mine = device_ints.offsets(rows, 10, 1)
    assert mine is not lazy
    assert mine.tolist() == [13, 11, 14]
