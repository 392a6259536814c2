"""The prefix protocol on each built-in policy, without an engine: capture positions of a batch row,
restore them into a fresh cache, and get the same keys back at the same absolute positions.
(tests/test_prefix_cache.py and test_cache_plugins.py check the engine end to end.)"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.cache import PrefixKind, PrefixState
from graphc.runtime.cache.full import FullPolicy
from graphc.runtime.cache.pool_backed import PoolBackedPolicy
from graphc.runtime.cache.ssm_state import SSMStatePolicy, StateCache
from graphc.runtime.cache.windowed import WindowedPolicy
from graphc.runtime.prefix_cache import prefix_unsupported_reason

H, D = 2, 4


def kv(n: int, seed: int, batch: int = 1):
    rng = np.random.default_rng(seed)
    return (mx.array(rng.standard_normal((batch, H, n, D)).astype(np.float32)),
            mx.array(rng.standard_normal((batch, H, n, D)).astype(np.float32)))


def test_a_state_must_hold_as_many_tokens_as_its_positions():
    k, v = kv(3, 0)
    with pytest.raises(ValueError, match="positions 5..8 needs planes with 4 tokens"):
        PrefixState(PrefixKind.TOKENS, 5, 9, (k[0], v[0]))
    PrefixState(PrefixKind.SNAPSHOT, 9, 9, (None, k))  # opaque: not checked


def test_tokens_capture_a_padded_row_and_restore_it_at_position_zero():
    policy = PoolBackedPolicy(SimpleNamespace(kind="full_attention"))
    cache = type(policy.new_cache())(2, [3, 0])  # row 0 left-padded by 3
    k, v = kv(7, 1, batch=2)
    cache.update_and_fetch(k, v)
    state = policy.prefix_capture(cache, 0, 1, 4)  # row 0's positions 1..3 = columns 4..6
    assert (state.kind, state.start, state.end) == (PrefixKind.TOKENS, 1, 4)
    np.testing.assert_array_equal(np.array(state.arrays[0]), np.array(k[0, :, 4:7]))
    full = policy.prefix_capture(cache, 0, 0, 4)
    restored = policy.prefix_restore(full)
    assert restored.row_length(0) == 4 and restored.offset == 4
    np.testing.assert_array_equal(np.array(restored.state[1][0]), np.array(v[0, :, 3:7]))


@pytest.mark.parametrize("policy_cls", [PoolBackedPolicy, FullPolicy])
def test_rows_captured_together_equal_each_row_captured_alone(policy_cls):
    """prefix_capture_rows (one gather per plane for a batch's leaving rows) gives what each row's
    prefix_capture gives, concatenated; the base class's default (FullPolicy inherits it) too."""
    policy = policy_cls(SimpleNamespace(kind="full_attention"))
    if policy_cls is FullPolicy:
        policy.prefix_capture = PoolBackedPolicy.prefix_capture.__get__(policy)  # FullPolicy keeps no prefixes
    cache = type(policy.new_cache())(3, [3, 0, 5])  # left-padded rows
    k, v = kv(9, 2, batch=3)
    cache.update_and_fetch(k, v)
    spans = [(2, 0, 4), (0, 1, 6), (1, 7, 9), (0, 0, 1)]
    got = policy.prefix_capture_rows(cache, spans)
    want = [np.concatenate([np.array(policy.prefix_capture(cache, r, s, e).arrays[j]) for r, s, e in spans], axis=1)
            for j in range(2)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.array(g), w)
    np.testing.assert_array_equal(np.array(got[0][:, :4]), np.array(k[2, :, 5:9]))


def test_a_tail_is_clamped_to_what_the_window_still_holds():
    policy = WindowedPolicy(SimpleNamespace(kind="sliding_attention", window=4))
    cache = policy.new_cache()
    k, v = kv(10, 2)
    cache.update_and_fetch(k, v)
    for i in range(6):  # decode steps: the buffer compacts to the last `window` columns
        cache.update_and_fetch(*kv(1, 10 + i))
    assert cache.row_length(0) == 16
    held = cache.idx - cache.lo[0]
    state = policy.prefix_capture(cache, 0, 0, 16)  # asks for more than it holds
    assert held < 16  # the window dropped the oldest positions
    assert state.kind is PrefixKind.TAIL and (state.start, state.end) == (16 - held, 16)
    tail = policy.prefix_capture(cache, 0, 12, 16)
    restored = policy.prefix_restore(tail)
    assert restored.row_length(0) == 16 and restored.offset == 16
    np.testing.assert_array_equal(np.array(restored.keys[0, :, :4]), np.array(tail.arrays[0]))
    with pytest.raises(ValueError, match="has seen 16 positions, not 17"):
        policy.prefix_capture(cache, 0, 13, 17)


def test_a_state_counts_its_positions_whether_or_not_the_model_advances_it():
    """Some recurrent layers call cache.advance(N) (qwen3_next), some never do (mlx-lm's
    bailing_moe_linear); graphc's attention op calls folded(N) after every forward, so the count
    the prefix cache checks a snapshot against is right either way, and never doubled."""
    from graphc.compiler.ops.forward import _folded

    quiet, counting = StateCache(2, 1), StateCache(2, 1)
    for n in (5, 1, 1):
        counting.advance(n)  # the model counted
        _folded([quiet, counting, object()], n)  # caches without folded() are left alone
    assert quiet.row_length(0) == 7 and counting.row_length(0) == 7
    policy = SSMStatePolicy(SimpleNamespace(kind="linear_attention", state_size=2))
    quiet[0] = mx.zeros((1, 3))
    assert policy.prefix_capture(quiet, 0, 7, 7).end == 7


def test_a_snapshot_exists_only_after_the_last_position():
    policy = SSMStatePolicy(SimpleNamespace(kind="linear_attention", state_size=2))
    cache = StateCache(2, 1)
    cache[0], cache[1] = mx.ones((1, 3)), mx.zeros((1, 2, 2))
    cache.advance(5)
    state = policy.prefix_capture(cache, 0, 5, 5)
    assert (state.kind, state.start, state.end) == (PrefixKind.SNAPSHOT, 5, 5)
    restored = policy.prefix_restore(state)
    assert restored.row_length(0) == 5 and restored[0] is cache[0]
    with pytest.raises(ValueError, match="only after the last position folded in"):
        policy.prefix_capture(cache, 0, 4, 4)


def test_a_policy_that_takes_no_part_names_itself_and_its_layer():
    layer = SimpleNamespace(kind="full_attention")
    pols = [PoolBackedPolicy(layer), FullPolicy(layer)]
    assert prefix_unsupported_reason(pols) == (
        "layer 1's policy 'full' keeps each request's KV to itself (pool_backed shares prefixes)")
    sliding = [WindowedPolicy(SimpleNamespace(kind="sliding_attention", window=w)) for w in (4, 8)]
    assert "different windows [4, 8]" in prefix_unsupported_reason([pols[0], *sliding])
    assert "per-token prefix state" in prefix_unsupported_reason(sliding[:1])
    assert prefix_unsupported_reason(pols[:1] + sliding[:1]) is None
