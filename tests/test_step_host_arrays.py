"""A decode step reads no array made on the host in that step, where a batch's rows are unchanged.

On MLX's CUDA backend a host-made array of more than 8 bytes lives in managed memory and the first
GPU kernel that reads it migrates its page (~100 µs for 64 int32s on the H200; benchmarks/probes/host_arrays.py).
The rows' left padding is the per-row array a step needs: FullKV keeps it on the device, made once
per value and shared by every layer's cache, and the compiled step and the kernel views take that
array instead of building one from the host list each step.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.full import FullKV
from helpers import random_prompts


def _filled(pads: list[int], idx: int = 6) -> FullKV:
    c = FullKV(len(pads), pads)
    k = mx.random.normal((len(pads), 2, idx, 4))
    c.append({"keys": k, "values": k + 1})
    return c


def test_left_pad_array_is_made_once_per_value_and_shared_by_layers():
    a, b = _filled([0, 2, 1]), _filled([0, 2, 1])
    arr = a.left_pad_array()
    assert arr is a.left_pad_array() is b.left_pad_array()  # one array for every layer
    assert arr.dtype == mx.int32 and arr.tolist() == [0, 2, 1]
    assert a.offset.tolist() == [6, 4, 5] and a.left_padding is arr
    assert a.offset is b.offset  # the step's offsets: one lazy array for every layer, not an op each
    b.append({"keys": mx.zeros((3, 2, 1, 4)), "values": mx.zeros((3, 2, 1, 4))})
    assert b.offset.tolist() == [7, 5, 6] and b.offset is not a.offset  # a later column: its own


@pytest.mark.parametrize("edit", ["filter", "extend", "trim_rows", "assign", "iadd"])
def test_left_pad_array_follows_every_edit_of_the_padding(edit):
    c = _filled([0, 2, 1])
    before = c.left_pad_array()
    if edit == "filter":
        c.filter([1, 2])
    elif edit == "extend":
        c.extend(_filled([0], idx=3))
    elif edit == "trim_rows":
        c.trim_rows([1, 2, 1])
    elif edit == "assign":
        c.left_pad = [3, 3, 3]
    else:
        c.left_pad += [4]
    assert c.left_pad_array().tolist() == list(c.left_pad)
    assert c.left_pad_array() is not before
    if edit != "iadd":  # an in-place list edit is seen through the setter `+=` calls
        pads = np.array(c.left_pad)
        want = c.idx - pads if pads.any() else c.idx
        assert np.array_equal(np.array(c.offset), want)


def test_the_compiled_step_takes_one_left_pad_array_per_batch_composition(model_dir):
    eng = Engine.load(model_dir("llama"), compile=True, max_batch=2, prefill_chunk=32)
    d = eng.compiled.decode
    seen: dict[tuple, set] = {}
    keep = []  # holds every array seen, so that an id is never reused by a later one
    inner = d._fn

    def spy(tokens, idx, left_pad, keys, values):
        keep.append(left_pad)
        seen.setdefault(tuple(np.array(left_pad).tolist()), set()).add(id(left_pad))
        return inner(tokens, idx, left_pad, keys, values)

    d._fn = spy
    prompts = random_prompts(4, eng.vocab_size, [5, 19, 11, 3], seed=5)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (30, 12, 25, 8)]
    eng.generate(prompts, params)
    assert d.compiled_steps > 10 and seen
    assert any(any(k) for k in seen)  # rows of different lengths: padded compositions ran
    # Each padding value was one array, however many steps and layers read it.
    assert all(len(ids) == 1 for ids in seen.values()), seen


@pytest.fixture
def made(monkeypatch):
    """The values the windowed cache's on_device calls had to make (not already on the device)."""
    from graphc.runtime.cache import device_ints, windowed

    out = []

    def counting(ints):
        if tuple(ints) not in device_ints._MADE:
            out.append(tuple(ints))
        return device_ints.on_device(ints)

    monkeypatch.setattr(windowed, "on_device", counting)
    device_ints._MADE.clear()
    return out


def test_windowed_offsets_of_rows_at_different_positions_come_from_one_device_array(made):
    from graphc.runtime.cache.windowed import WindowedKV


    H, D, window = 2, 4, 4
    a, b = WindowedKV(window), WindowedKV(window)
    a.update_and_fetch(mx.zeros((1, H, 20, D)), mx.zeros((1, H, 20, D)))
    b.update_and_fetch(mx.zeros((1, H, 2, D)), mx.zeros((1, H, 2, D)))
    a.extend(b)
    for step in range(12):  # past the window: the ring shifts pos0 of both rows alike
        want = [a.row_length(r) for r in range(a.batch)]
        assert want == [20 + step, 2 + step]
        off = a.offset
        assert off.tolist() == want
        twin = WindowedKV(window)  # another layer's cache of the same rows, same step
        twin.pos0, twin.idx = list(a.pos0), a.idx
        assert twin.offset is off
        a.update_and_fetch(mx.zeros((2, H, 1, D)), mx.zeros((2, H, 1, D)))
    # The rows differ by 18 at every step, ring shifts included: one device array, made once.
    assert made == [(0, -18)]


def test_a_padded_windowed_mask_reads_one_device_array_while_the_padding_holds(made):
    from graphc.runtime.cache.windowed import WindowedKV

    H, D, window = 2, 4, 8
    a, b = WindowedKV(window), WindowedKV(window)
    a.update_and_fetch(mx.zeros((1, H, 6, D)), mx.zeros((1, H, 6, D)))
    b.update_and_fetch(mx.zeros((1, H, 2, D)), mx.zeros((1, H, 2, D)))
    a.extend(b)  # the short row is left-padded by 4 columns
    for _ in range(2):  # still padded: the long row has not filled the window yet
        m = a.make_mask(1)
        assert m.shape == (2, 1, 1, a.idx + 1) and m[1].sum().item() == a.row_length(1) + 1
        a.update_and_fetch(mx.zeros((2, H, 1, D)), mx.zeros((2, H, 1, D)))
    assert len(made) == 1  # the padding array, made at the first step only


def test_on_device_keeps_a_bounded_number_of_values():
    from graphc.runtime.cache import device_ints

    device_ints._MADE.clear()
    first = device_ints.on_device([1, 2, 3])
    for i in range(40):
        assert device_ints.on_device([i, i + 1]).tolist() == [i, i + 1]
    assert len(device_ints._MADE) <= 16
    again = device_ints.on_device([1, 2, 3])  # evicted long ago: made afresh, same values
    assert again is not first and again.tolist() == [1, 2, 3]
