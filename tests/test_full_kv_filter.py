"""FullKV.filter keeps the chosen rows by copying runs of consecutive rows (or one gather when
there are many runs): the same arrays, padding columns dropped, as a gather by row index."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.cache import full as full_mod
from graphc.runtime.cache.full import MAX_COPY_RUNS, FullKV, row_runs


def test_row_runs():
    assert row_runs([0, 1, 2, 5, 6]) == [(0, 3), (5, 7)]
    assert row_runs([3]) == [(3, 4)]
    assert row_runs([2, 0, 1]) == [(2, 3), (0, 2)]
    assert row_runs([1, 1]) == [(1, 2), (1, 2)]
    assert row_runs([]) == []


def _cache(pads: list[int], idx: int) -> FullKV:
    rng = np.random.default_rng(0)
    c = FullKV(len(pads), pads)
    shape = (len(pads), 2, 256, 4)
    c.keys, c.values = mx.array(rng.standard_normal(shape, dtype=np.float32)), mx.array(rng.standard_normal(shape, dtype=np.float32))
    c.idx = idx
    return c


@pytest.fixture(params=["cpu", "gpu"])
def copy_runs(request, monkeypatch):
    """Both ways of filtering: the CPU's gather and (faked here) the GPU's copy per run."""
    if request.param == "gpu":
        monkeypatch.setattr(full_mod.mx, "default_device", lambda: mx.Device(mx.gpu))
    return request.param


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 5, 6], [9], [3, 4], [1, 8],
                                  [0, 2, 4, 6, 8, 1, 3, 5, 7], list(range(0, 10, 1))[::-1]])
def test_filter_equals_a_gather(rows, copy_runs):
    pads = [40, 10, 70, 30, 90, 20, 60, 50, 80, 100]
    c = _cache(pads, 120)
    want_shift = min(pads[r] for r in rows)
    want = {n: np.array(getattr(c, n))[rows][:, :, want_shift:] for n in c.PLANES}
    c.filter(rows)
    for n in c.PLANES:
        got = np.array(getattr(c, n))
        assert got.shape == want[n].shape and np.array_equal(got, want[n])
    assert c.left_pad == [pads[r] - want_shift for r in rows] and c.idx == 120 - want_shift


def test_many_runs_take_the_gather(copy_runs):
    rows = list(range(0, 2 * (MAX_COPY_RUNS + 1), 2))
    c = _cache([5] * (2 * MAX_COPY_RUNS + 2), 50)
    want = np.array(c.keys)[rows][:, :, 5:]
    c.filter(rows)
    assert np.array_equal(np.array(c.keys), want)
