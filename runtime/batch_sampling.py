"""Per-batch sampling state: what the graph's edit / sample / logprobs nodes need for one step.

`SamplingTensors` (runtime/sampling) holds the per-row parameters of one batch
composition; it is rebuilt only when rows join or leave. The per-step arrays —
the position each chosen token will occupy (the seeded-noise key), tokens
generated so far (only while a row has min_tokens) and penalty counts (only with
penalties) — advance *inside* the lazy step, so a chained step N+1 gets exact
values without the host.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from .plan_contract import EDIT_KINDS, restrict
from .sampling import SamplingTensors, advance, build_token_counts, penalty_history


def needs_sampler(params) -> bool:
    """False for rows the plain argmax serves exactly: the greedy hot path skips the sampler."""
    return bool(
        params.temperature > 0 or params.repetition_penalty != 1.0 or params.frequency_penalty
        or params.presence_penalty or params.logit_bias or params.banned_token_ids or params.min_tokens
        or params.logprobs is not None or params.logprob_token_ids
    )


def _noise_seeded(params, req):
    """A sampled row without a seed samples with its request's `noise_seed` (drawn by
    Engine.add_request; docs/sampling.md, "Rows without a seed"): its noise state is then a row
    constant, as a seeded row's is, and a step needs no key. Greedy rows and requests made outside
    an Engine (no noise_seed) are left as they are."""
    if params.seed is None and params.temperature > 0 and getattr(req, "noise_seed", None) is not None:
        return attrs.evolve(params, seed=req.noise_seed)
    return params


@attrs.define
class SamplingState:
    """StepInputs.sampling: the batch's SamplingTensors and this step's per-row arrays."""

    st: SamplingTensors
    positions: mx.array  # int32 [B]: index the chosen token takes in its sequence
    n_generated: mx.array | None  # int32 [B] when a row has min_tokens (the only reader), else None
    counts: mx.array | None  # int32 [B, V] penalty counts (None without penalties)

    def advanced(self, tokens: mx.array) -> "SamplingState":
        pos, n, counts = advance(self.st, tokens, positions=self.positions, n_generated=self.n_generated,
                                 counts=self.counts)
        return SamplingState(self.st, pos, n, counts)


class SamplerCache:
    """Builds SamplingTensors for a row list, reusing the last one while the rows are the same."""

    def __init__(self, vocab_size: int, eos_token_ids=(), edits: tuple | None = "all", kernel: bool = False):
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        # The edit kinds the graph's logit_edits node declares (Plan.edits): tensors carry only
        # those. None (no logit_edits node) carries none; "all" (the default) every kind.
        self.edits = EDIT_KINDS if edits == "all" else tuple(edits or ())
        self._restrict = not set(EDIT_KINDS) <= set(self.edits)
        self.kernel = kernel  # the top-ranks CUDA kernel where it applies (decode: sampling_kernel)
        self._rows: list = []  # the rows _st was built for (held, so identity comparison is sound)
        self._st: SamplingTensors | None = None

    def tensors(self, rows) -> SamplingTensors | None:
        """None when every row is plain greedy (argmax needs no sampler)."""
        if len(rows) == len(self._rows) and all(a is b for a, b in zip(rows, self._rows)):
            return self._st  # the same rows as the last step: nothing to look at per row
        params = [r.params for r in rows]
        if self._restrict:
            params = [restrict(p, self.edits) for p in params]
        params = [_noise_seeded(p, r) for p, r in zip(params, rows)]
        st = None
        if any(needs_sampler(p) for p in params):
            st = SamplingTensors.build(params, self.vocab_size, eos_token_ids=self.eos_token_ids, validate=False,
                                       top_ranks_kernel=self.kernel)
        # Both together, after a build that may raise (a bad row, see runtime/fault.py): a failed
        # build must not leave the previous rows paired with no tensors.
        self._st, self._rows = st, list(rows)
        return st

    def host_state(self, st: SamplingTensors, rows, in_flight: int = 0) -> SamplingState:
        """Per-row arrays from host-known history (rows with no step in flight)."""
        pos = mx.array([r.num_tokens + in_flight for r in rows], dtype=mx.int32)
        n = None  # only min_tokens reads it: no array to keep and no add a step without one
        if st.has_min_tokens:
            n = mx.array([len(r.output_ids) + in_flight for r in rows], dtype=mx.int32)
        counts = None
        if st.has_penalties:
            counts = build_token_counts([penalty_history(r.params, r.prompt_ids, r.output_ids) for r in rows],
                                        self.vocab_size)
        return SamplingState(st, pos, n, counts)
