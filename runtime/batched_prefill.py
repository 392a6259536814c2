"""Whole prompts prefilled together: each group one left-padded forward, and where the prefill plan
has lanes (`prefill lanes`, compiler/passes/prefill_choices.py) several groups at once, each built
on a CPU stream of its own and evaluated together.

Why lanes: MLX runs each stream's ops on a thread of its own, and mlx-cpu's bundled reference
BLAS runs a matmul on one thread, so one forward leaves the other cores idle; two forwards on two
streams took half the time of one over both (runtime/cpu_lanes.py measures it at load). A lane's
forward is the same forward as alone, so tokens do not depend on the lanes.
"""

from __future__ import annotations

import threading

import attrs
import mlx.core as mx

from graphc.compiler.lower import StepInputs
from graphc.compiler.selfcheck import batch_prefill_ok

from . import chunk_pad


@attrs.define
class _Built:
    """One group's forward, built (lazy) and not yet evaluated."""

    reqs: list
    caches: list
    out: object
    sampling: object
    extra: int


_LOCAL = threading.local()


def lane_streams(n: int) -> list:
    """n CPU streams for the calling thread, shared by every engine that steps on it (MLX's streams
    belong to the thread that made them: an engine built on one thread may step on another, as
    AsyncEngine's does)."""
    made = getattr(_LOCAL, "streams", None)
    if made is None:
        made = _LOCAL.streams = []
    while len(made) < n:
        made.append(mx.new_stream(mx.cpu))
    return made[:n]


class BatchedPrefill:
    """The runner's batched prefill: the prefill step, its sampler and prefix side, handed over by
    the runner (runtime/runner.py); `edits(rows, ctx, step)` is the runner's host-edit hook."""

    def __init__(self, step, sampler, final_chunk: chunk_pad.FinalChunk, prefix_io, policies, edits,
                 lanes: int = 1):
        self.step, self.sampler, self.final_chunk = step, sampler, final_chunk
        self.prefix_io, self.policies, self.edits = prefix_io, policies, edits
        self.lanes = lanes if self.possible else 1
        self.padded_tokens = 0  # pad positions computed (for stats and tests)

    def run(self, groups: list[list]) -> list[tuple[list, list]]:
        """Prefill each group's whole contexts (requests with nothing cached) as one forward, rows
        left-padded, and sample each one's first token; the groups side by side, each on a lane's
        stream, when there are lanes for them (the caller sends only groups `in_lane` together).
        Per group: ((token, logprobs) per request, its layer caches)."""
        built = []
        if 1 < len(groups) <= self.lanes:
            for group, stream in zip(groups, lane_streams(self.lanes)):
                with mx.stream(stream):
                    built.append(self._build(group))
        else:
            built = [self._build(g) for g in groups]
        mx.eval([b.out.next_tokens for b in built])
        return [self._finish(b) for b in built]

    @property
    def possible(self) -> bool:
        """Several whole prompts in one left-padded forward: for graphs whose every layer keeps
        FullKV rows (full / pool_backed) and whose prefix cache needs no boundary captures."""
        if self.prefix_io is not None and self.prefix_io.prefix.needs_boundaries:
            return False
        return batch_prefill_ok(self.policies)

    def in_lane(self, group: list) -> bool:
        """A group of (request, tokens) chunks that may run in a lane beside others: whole prompts
        (nothing cached, no prompt logprobs) with no host edits to compute between the forward and
        the head (grammar masks and logits processors run on the host). With lanes, a lone whole
        prompt goes through the batched path too."""
        return self.lanes > 1 and all(
            r.prefilled == 0 and n == len(r.context_ids) and r.params.prompt_logprobs is None
            and r.params.chain_safe for r, n in group)

    def _build(self, reqs: list) -> _Built:
        ctxs = [r.context_ids for r in reqs]
        extra = self.final_chunk.pad(max(map(len, ctxs)))  # more left padding: aligned
        L = max(map(len, ctxs)) + extra
        pads = [L - len(c) for c in ctxs]
        caches = [type(p.new_cache())(len(reqs), pads) for p in self.policies]
        tokens = mx.array([[chunk_pad.PAD_TOKEN] * p + c for p, c in zip(pads, ctxs)], dtype=mx.int32)
        step = self.step
        self.padded_tokens += extra * len(reqs)
        if extra and not self.final_chunk.whole:
            # Split: all but the last column as one aligned forward (query = key length), then the
            # last column. Whole: one forward, whose last column is real in every row.
            step.forward(StepInputs(tokens[:, :-1], caches, final=False))
            tokens = tokens[:, -1:]
        ctx = step.forward(StepInputs(tokens, caches, final=True))
        st = self.sampler.tensors(reqs)
        if st is not None:
            ctx.inputs.sampling = self.sampler.host_state(st, reqs)
        out = step.head(ctx, self.edits(reqs, ctx, step))
        return _Built(reqs, caches, out, st, extra)

    def _finish(self, b: _Built) -> tuple[list, list]:
        reqs, caches = b.reqs, b.caches
        toks = b.out.next_tokens.tolist()
        lps = b.out.logprobs.to_lists(b.sampling) if b.out.logprobs is not None else [None] * len(reqs)
        if self.prefix_io is not None:
            self.prefix_io.store_prompt_rows(reqs, caches)
        if b.extra:  # the columns every row pads go (filter drops them): the decode batch never holds them
            for c in caches:
                c.filter(list(range(len(reqs))))
        return list(zip(toks, lps)), caches
