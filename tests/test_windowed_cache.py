"""WindowedKV on its own: attention through it equals sliding-window attention over the whole
history, for chunked prefill, left-padded batches with different offsets, compaction,
filter / extend / extract; its masks take the fused path whenever the window cannot bind,
and its bytes stay bounded."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.cache.windowed import WindowedKV

H, D = 2, 8


class Row:
    """One sequence's reference: every K/V it ever wrote, by absolute position."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.k, self.v = [], []

    def new(self, n):
        k = self.rng.standard_normal((1, H, n, D)).astype(np.float32)
        v = self.rng.standard_normal((1, H, n, D)).astype(np.float32)
        self.k.append(k)
        self.v.append(v)
        return mx.array(k), mx.array(v)

    def expected(self, q, n, window):
        """Output for the last n positions' queries q [1, H, n, D] with a sliding window."""
        k = mx.array(np.concatenate(self.k, axis=2))
        v = mx.array(np.concatenate(self.v, axis=2))
        T = k.shape[2]
        qpos = mx.arange(T - n, T)[:, None]
        kpos = mx.arange(T)[None]
        mask = (qpos >= kpos) & (qpos < kpos + window)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)


def attend(cache, q, ks, vs):
    n = q.shape[2]
    mask = cache.make_mask(n)
    k, v = cache.update_and_fetch(ks, vs)
    if isinstance(mask, mx.array):
        width = mask.shape[-1]
        assert width == k.shape[2], "mask width must equal the number of keys returned"
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)


def prefill(window, row: Row, length, chunk):
    cache = WindowedKV(window)
    done = 0
    while done < length:
        n = min(chunk, length - done)
        ks, vs = row.new(n)
        q = mx.random.normal((1, H, n, D))
        out = attend(cache, q, ks, vs)
        np.testing.assert_allclose(np.array(out), np.array(row.expected(q, n, window)), atol=1e-5)
        done += n
    return cache


def decode_step(cache, rows, window):
    ks, vs, qs = [], [], []
    for r in rows:
        k, v = r.new(1)
        ks.append(k)
        vs.append(v)
        qs.append(mx.random.normal((1, H, 1, D)))
    out = attend(cache, mx.concatenate(qs), mx.concatenate(ks), mx.concatenate(vs))
    for i, r in enumerate(rows):
        np.testing.assert_allclose(np.array(out[i:i + 1]), np.array(r.expected(qs[i], 1, window)), atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 8, 21])
def test_chunked_prefill_matches_sliding_attention(chunk):
    row = Row(0)
    cache = prefill(8, row, 50, chunk)
    assert cache.offset == 50
    assert cache.capacity <= 8 + max(chunk, 8)


def test_batched_decode_mixed_offsets_compaction_filter_extend():
    window = 6
    rows = [Row(i) for i in range(4)]
    lengths = [2, 9, 30, 6]
    batch = prefill(window, rows[0], lengths[0], 4)
    for r, n in zip(rows[1:3], lengths[1:3]):
        batch.extend(prefill(window, r, n, 4))
    live = rows[:3]
    for step in range(25):
        decode_step(batch, live, window)
        if step == 7:  # a row leaves
            batch.filter([0, 2])
            live = [live[0], live[2]]
        if step == 12:  # a new row joins mid-stream
            batch.extend(prefill(window, rows[3], lengths[3], 5))
            live = live + [rows[3]]
        assert batch.capacity <= 2 * window
    assert batch.offset.tolist() == [len(np.concatenate(r.k, axis=2)[0, 0]) for r in live]


def test_extract_keeps_row_and_positions():
    window = 4
    rows = [Row(10), Row(11)]
    batch = prefill(window, rows[0], 3, 3)
    batch.extend(prefill(window, rows[1], 11, 5))
    decode_step(batch, rows, window)
    one = batch.extract(1)
    assert one.offset == 12
    decode_step(one, [rows[1]], window)


def test_masks_take_the_fused_path_while_the_window_cannot_bind():
    c = WindowedKV(8)
    assert c.make_mask(5) == "causal"  # offset 0 + 5 <= 8
    c.update_and_fetch(mx.zeros((1, H, 5, D)), mx.zeros((1, H, 5, D)))
    assert c.make_mask(1) is None
    assert c.make_mask(3) == "causal"  # 5 + 3 <= 8: still cannot bind
    m = c.make_mask(4)  # 5 + 4 > 8: the window binds for the last query
    assert isinstance(m, mx.array) and m.shape == (4, 9)
    for _ in range(40):  # decode far past the window: exactly `window` keys, no mask
        assert c.make_mask(1) is None
        k, _ = c.update_and_fetch(mx.zeros((1, H, 1, D)), mx.zeros((1, H, 1, D)))
        assert k.shape[2] == min(c.offset, 8)
    assert c.capacity == 16


def test_decode_mask_marks_exactly_the_last_window_keys_per_row():
    window = 4
    a, b = WindowedKV(window), WindowedKV(window)
    a.update_and_fetch(mx.zeros((1, H, 20, D)), mx.zeros((1, H, 20, D)))
    b.update_and_fetch(mx.zeros((1, H, 2, D)), mx.zeros((1, H, 2, D)))
    a.extend(b)
    m = a.make_mask(1)
    assert m.shape == (2, 1, 1, 4)
    assert m[0].sum().item() == 4  # a long row: all of the last `window` keys
    assert m[1].sum().item() == 3  # a short row: its 2 keys and the new one, not the padding
    for _ in range(2):
        a.update_and_fetch(mx.zeros((2, H, 1, D)), mx.zeros((2, H, 1, D)))
    assert a.make_mask(1) is None  # both rows now have `window` keys: the fused path again


def test_bytes_stay_bounded_as_context_grows():
    c = WindowedKV(16)
    c.update_and_fetch(mx.zeros((1, H, 16, D)), mx.zeros((1, H, 16, D)))
    sizes = set()
    for _ in range(200):
        c.update_and_fetch(mx.zeros((1, H, 1, D)), mx.zeros((1, H, 1, D)))
        sizes.add(c.nbytes)
    assert sizes == {2 * 2 * 16 * H * D * 4}
