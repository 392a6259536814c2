"""The next decode step's input, built while the step before it may still run on the device.

A decode step's input tokens are a lazy gather of the pending step's tokens (rows that stayed,
in order) plus the host-known first tokens of rows that joined, so membership changes never
break the chain; its sampling state (positions for the seeded noise, tokens generated, penalty
counts) continues from the pending step's advanced state, lazily too, or is rebuilt from the
host where the pending step carried none.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from .batch_sampling import SamplerCache, SamplingState


@attrs.define
class Launch:
    """A decode step that has been queued: its rows (in batch order) and lazy tokens."""

    rows: list
    tokens: mx.array  # int32 [B]
    logprobs: object = None  # LogprobsOutput when a row asked
    sampling: SamplingState | None = None  # the state this step used
    next_sampling: SamplingState | None = None  # advanced past this step's tokens (lazy)
    host: list | None = None  # what the host reads for `tokens` (runtime/host_read.py)
    rider: object = None  # a final prompt chunk in this launch (runtime/mixed_step.py), read with it

def next_input(sampler: SamplerCache, rows: list, pending: Launch | None) -> tuple[mx.array, SamplingState | None]:
    """Input tokens [B, 1] and sampling state for the current rows, lazily from the pending step where possible."""
    st = sampler.tensors(rows)
    if pending is None:
        toks = mx.array([[r.last_token] for r in rows], dtype=mx.int32)
        return toks, (sampler.host_state(st, rows) if st is not None else None)
    pos = {id(r): i for i, r in enumerate(pending.rows)}
    from_pending = [pos[id(r)] for r in rows if id(r) in pos]
    joined = [r for r in rows if id(r) not in pos]
    # Built as the pending rows (in their order) then the joined ones, then put in row order:
    # a join appends its rows, or writes them into rows left vacant (runtime/batch_rows.py).
    toks, state = _kept_then_joined(sampler, st, rows, pending, pos, from_pending, joined)
    if not joined:  # rows that stayed keep their order: nothing to put back
        return toks, state
    inflight, fresh = iter(range(len(from_pending))), iter(range(len(from_pending), len(rows)))
    order = [next(inflight) if id(r) in pos else next(fresh) for r in rows]
    if order == list(range(len(rows))):
        return toks, state
    perm = mx.array(order, dtype=mx.int32)
    if state is not None:
        state = SamplingState(state.st, state.positions[perm], _take(state.n_generated, perm),
                              _take(state.counts, perm))
    return toks[perm], state


def _kept_then_joined(sampler, st, rows, pending, pos, from_pending, joined):
    """next_input's tokens and state with the rows from `pending` first, then `joined`."""
    same = from_pending == list(range(len(pending.rows)))
    idx = None if same else mx.array(from_pending, dtype=mx.int32)
    toks = pending.tokens if same else pending.tokens[idx]
    if joined:
        toks = mx.concatenate([toks, mx.array([r.last_token for r in joined], dtype=mx.int32)])
    if st is None:
        return toks[:, None], None
    prev = pending.next_sampling
    if prev is None or (not same and not from_pending):
        # The pending step ran without a sampler: every row's history is on the host but
        # the pending token, which is still in flight.
        inflight = [r for r in rows if id(r) in pos]
        state = sampler.host_state(st, inflight, in_flight=1) if inflight else None
        fresh = sampler.host_state(st, joined) if joined else None
        return toks[:, None], _concat(st, state, fresh)
    kept = prev if same else SamplingState(st, prev.positions[idx], _take(prev.n_generated, idx),
                                           _take(prev.counts, idx))
    kept.st = st
    if (kept.counts is None and st.has_penalties) or (kept.n_generated is None and st.has_min_tokens):
        # penalties or min_tokens appeared with a joined row: their history is on the host
        kept = sampler.host_state(st, [r for r in rows if id(r) in pos], in_flight=1)
    fresh = sampler.host_state(st, joined) if joined else None
    return toks[:, None], _concat(st, kept, fresh)

def _concat(st, a: SamplingState | None, b: SamplingState | None) -> SamplingState:
    if a is None or b is None:
        out = a or b
        out.st = st
        return out
    # a (kept rows) may carry arrays the new rows' tensors do not read: b (host_state for st) has
    # exactly those st reads, and a has them too (next_input rebuilds a otherwise)
    return SamplingState(st, mx.concatenate([a.positions, b.positions]), _cat(a.n_generated, b.n_generated),
                         _cat(a.counts, b.counts))

def _take(a: mx.array | None, idx: mx.array) -> mx.array | None:
    return None if a is None else a[idx]

def _cat(a: mx.array | None, b: mx.array | None) -> mx.array | None:
    return None if a is None or b is None else mx.concatenate([a, b])
