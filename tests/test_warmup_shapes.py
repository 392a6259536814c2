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


def test_warm_up_runs_the_row_copies_on_the_batch_caches(model_dir, monkeypatch):
    """The copies that drop rows (a run, two runs, scattered rows as words with and without dropped
    columns) run once on every plane of the ROWS-row batch, on both gather paths, and leave the
    batch as it was; the engine's tokens afterwards are unchanged."""
    from graphc.runtime.cache import row_copies

    ran = []
    plain = row_copies.gather_rows

    def gather_rows(x, rows, first=0):
        ran.append((x.shape[0], tuple(rows), first))
        return plain(x, rows, first)

    monkeypatch.setattr(row_copies, "word_gather_here", lambda: True)  # a GPU's path, here on the CPU
    monkeypatch.setattr(row_copies, "gather_rows", gather_rows)  # warm_row_copies looks it up there
    eng = Engine.load(model_dir("llama"), step_tokens=STEP_TOKENS_FLOOR, prefill_lanes=1)
    warm_up(eng, shapes=True)
    planes = 2 * len(eng.runner.policies)  # keys and values of every layer
    assert ran.count((ROWS, (0, 2), 0)) == planes and ran.count((ROWS, (0, 2), 1)) == planes
    assert not eng.has_unfinished() and eng.stats["generated_tokens"] == 0


def test_warm_row_copies_leaves_the_cache_as_it_was():
    from graphc.runtime.cache.full import FullKV
    from graphc.runtime.cache.row_copies import warm_row_copies

    c = FullKV(4, [0, 1, 2, 3])
    c.keys = mx.arange(4 * 2 * 5 * 8, dtype=mx.float32).reshape(4, 2, 5, 8)
    c.values = c.keys + 1
    c.idx = 5
    before = [mx.array(c.keys), mx.array(c.values)]
    assert warm_row_copies(c) == 2
    assert mx.array_equal(c.keys, before[0]).item() and mx.array_equal(c.values, before[1]).item()
    assert warm_row_copies(FullKV(2, [0, 0])) == 0  # nothing written yet: nothing to copy


def test_warm_up_writes_a_prompt_into_a_vacant_row_and_grows_past_the_vacant_ones(model_dir, monkeypatch):
    """vacant_row_paths: two rows end early and stay vacant (the GPU's "reuse"), a prompt that joins
    then is written into one in place (FullKV.fill_rows), and the step crossing the first capacity
    boundary drops the vacant rows past the spare one in its growth copy; nothing is left behind."""
    from graphc.runtime.batch_rows import BatchRows
    from graphc.runtime.cache.full import FullKV

    seen = []
    fill, drop = FullKV.fill_rows, BatchRows.drop_vacant
    monkeypatch.setattr(FullKV, "fill_rows", lambda c, slots, others: (seen.append(("fill", tuple(slots))),
                                                                       fill(c, slots, others))[1])
    monkeypatch.setattr(BatchRows, "drop_vacant", lambda b: (seen.append(("drop", len(b.vacant))), drop(b))[1])
    eng = Engine.load(model_dir("llama"), step_tokens=STEP_TOKENS_FLOOR, prefill_lanes=1,
                      decode_options={"vacant_rows": "reuse"})
    stats = dict(eng.stats)
    warm_up(eng, shapes=True)
    fills = {s for k, s in seen if k == "fill"}
    assert fills == {(0,)}  # into the lowest vacant row, for every layer
    assert ("drop", 2) in seen  # two vacant, one kept spare for the joins to come
    assert not eng.has_unfinished() and eng.stats == stats
