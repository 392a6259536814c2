"""Engine.warm_up() runs the shapes serving meets first (runtime/warmup.py serving_shapes): a batched
prefill of ROWS prompts, and a prompt chunked over two steps that joins their decoding batch."""

from __future__ import annotations

import mlx.core as mx
import pytest

from graphc.runtime import Engine
from graphc.runtime.scheduler import STEP_TOKENS_FLOOR
from graphc.runtime.warmup import ROWS, warm_up


def _record(eng) -> list:
    seen, plain = [], eng.scheduler.schedule

    def schedule():
        s = plain()
        seen.append(([len(g) for g in s.groups], [n for _, n in s.prefill], len(eng.scheduler.running)))
        return s

    eng.scheduler.schedule = schedule
    return seen


def test_warm_up_prefills_a_batch_and_a_chunked_prompt_that_joins_it(model_dir):
    # "auto" may take it whole; one prefill lane, as on a GPU, where the shapes are warmed
    eng = Engine.load(model_dir("llama"), step_tokens=STEP_TOKENS_FLOOR, prefill_lanes=1)
    seen = _record(eng)
    warm_up(eng, shapes=True)  # (Engine.warm_up() runs them on a GPU only)
    assert ([ROWS], [16] * ROWS, 0) in seen  # the ROWS prompts in one batched forward
    chunks = [(n, running) for _, ns, running in seen for n in ns if n > 16]
    assert chunks == [(STEP_TOKENS_FLOOR, ROWS), (32, ROWS)]  # two chunks while ROWS rows decode
    assert max(running for *_, running in seen) == ROWS + 1  # it joined their batch
    assert not eng.has_unfinished() and eng.stats["generated_tokens"] == 0


def test_warm_up_skips_the_serving_shapes_where_the_batch_cannot_hold_them(model_dir):
    eng = Engine.load(model_dir("llama"), max_batch=2)
    seen = _record(eng)
    warm_up(eng, shapes=True)
    assert max(running for *_, running in seen) <= 1  # the two batch-1 requests only


@pytest.mark.skipif(mx.default_device().type == mx.DeviceType.gpu, reason="a GPU warm-up runs the shapes")
def test_the_cpu_warm_up_is_the_two_requests_alone(model_dir):
    eng = Engine.load(model_dir("llama"))
    seen = _record(eng)
    eng.warm_up()
    assert max(running for *_, running in seen) <= 1
