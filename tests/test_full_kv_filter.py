"""FullKV.filter keeps the chosen rows by copying runs of consecutive rows (or one gather when
there are many runs): the same arrays, padding columns dropped, as a gather by row index."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.cache import full as full_mod
from graphc.runtime.cache import row_copies
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


@pytest.mark.parametrize("words", [True, False])
@pytest.mark.parametrize("dtype,dim", [(mx.bfloat16, 64), (mx.float32, 4), (mx.uint32, 16), (mx.bfloat16, 1)])
@pytest.mark.parametrize("first", [0, 7])
def test_gather_rows_equals_the_element_gather(monkeypatch, words, dtype, dim, first):
    """The GPU's gather of rows as 8-byte words (and the element gather it falls back to where a
    row's last axis is no whole number of words, e.g. a bf16 scale per group) gives x[rows][..., first:, :]."""
    monkeypatch.setattr(row_copies, "word_gather_here", lambda: words)
    x = mx.array(np.arange(9 * 3 * 20 * dim, dtype=np.float32).reshape(9, 3, 20, dim)).astype(dtype)
    rows = [8, 0, 3, 4, 7]
    got = row_copies.gather_rows(x, rows, first=first)
    want = np.array(x.astype(mx.float32))[rows][:, :, first:]
    assert got.dtype == dtype and got.shape == want.shape
    assert np.array_equal(np.array(got.astype(mx.float32)), want)


def test_scattered_rows_join_through_the_word_gather(monkeypatch):
    """extend_all keeping rows in more runs than MAX_COPY_RUNS gathers them (as words on a GPU):
    each kept row's own columns, then the joining rows', are the original arrays' (numpy)."""
    monkeypatch.setattr(full_mod.mx, "default_device", lambda: mx.Device(mx.gpu))
    n = 2 * MAX_COPY_RUNS + 2
    keep = list(range(1, n, 2))
    pads = [(5 * i) % 17 for i in range(n)]
    one, other = _cache(pads, 90), _cache([3, 0], 40)
    want = [np.array(one.keys)[r, :, pads[r]:90] for r in keep] + \
        [np.array(other.keys)[r, :, p:40] for r, p in enumerate(other.left_pad)]
    one.extend_all([other], keep)
    got = np.array(one.keys)
    assert one.batch == len(keep) + 2 and one.idx == 90
    assert all(np.array_equal(got[i, :, p:one.idx], w) for i, (p, w) in enumerate(zip(one.left_pad, want)))
