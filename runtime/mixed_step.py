"""Mixed steps: one request's prompt chunk rides the decode step's forward (the decode plan's
`mixed step` choice, `decode: {mixed_step: true}`; the stack is compiler/mixed_forward.py).

The runner prepares the chunk where it always does (its caches, an admitted prefix restored, the
pieces that end at prefix boundaries), then, instead of a forward of its own, hands it here. The
step's first decode launch carries it: the decode rows and the chunk go through the decoder
stack together; the rows' logits go through the decode plan's head, the chunk's last real
position (on its final chunk) through the prefill plan's.

The host never waits for a riding chunk on its own. A middle chunk's cache writes are queued
with the launch and it is reported done at once. A final chunk's first token is a `Rider` on
its `Launch` (runtime/decode_input.py), read when that launch's tokens are: with the chain on,
in the next step, after the launch after it is queued, so the device runs on while the host
does the step's bookkeeping; that first token arrives one decode step later than a separate
forward's (TTFT + one decode step; its row joins the batch one step later too). In between,
the request's prompt is computed and its token unknown: the runner reports the chunk done at
launch (its tokens counted then), and the scheduler counts such a request as a row and never
schedules it (Scheduler.in_flight). The prompt's KV goes to the prefix pool at launch, lazily,
as a middle chunk's does (the disk copy waits for the read: it reads the pool on the host). A
rider whose request leaves first (an abort) is never read; one whose launch is dropped because
every row left is read at the end of the step (ModelRunner.run_decode); a fault recovery
forgets it and the request is recomputed with the step's rows.

A chunk rides only where the separate path would give the same result: a single request's chunk
(not a batched prefill group), no prompt logprobs, no host edits for its first token, and a plain
decode launch this step (the plan's choice already required plain K/V caches and llama blocks).
Otherwise, or when the step ends up not launching one (a burst still admitting, a speculative
verify step), the chunk runs as its own forward after the decode.

Off by default: the fused forward alone, chained, was 1.46x the decode step on an H100, but at
the door (1B shape, 8 req/s) the steps with prompt work cost 18 ms at p50 fused or separate, with
this late read too, and their p99 was ~360 against ~41 ms (docs/scheduling.md, "Mixed steps").
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.compiler.lower import StepInputs, cache_arrays
from graphc.compiler.mixed_forward import mixed_hidden

from . import chunk_pad
from .prompt_chunk import ChunkPrep


@attrs.define(eq=False)
class Rider:
    """A chunk in a launched mixed step: what the host reads once the step's tokens are in."""

    prep: ChunkPrep
    out: object = None  # the prefill head's StepOutputs (final chunks)
    st: object = None  # its sampling tensors


class MixedSteps:
    """The runner's mixed-step state: at most one chunk waiting for the step's launch, and the final
    chunks launched whose first token the host has not read yet (`unread`)."""

    def __init__(self, compiled, sampler, final_chunk, prefix_io):
        self.binding = compiled.binding
        self.prefill = compiled.prefill
        self.sampler = sampler
        self.final_chunk = final_chunk
        self.prefix_io = prefix_io
        self.waiting: ChunkPrep | None = None
        # Each is also its Launch's `rider`, read with that launch's tokens (ModelRunner._decode); one
        # whose launch is no longer pending is read at the step's end (ModelRunner.run_decode).
        self.unread: list[Rider] = []
        self.steps = 0  # mixed steps launched (Engine.describe, tests)

    @classmethod
    def of(cls, compiled, sampler, final_chunk, prefix_io) -> "MixedSteps | None":
        """The state where the decode plan chose fused mixed steps (its choice checked the model, the
        graph and the caches: compiler/mixed_forward.py why_not_mixable), else None."""
        choice = compiled.decode.plan.choice("mixed step")
        if choice is None or choice.choice != "fused":
            return None
        return cls(compiled, sampler, final_chunk, prefix_io)

    def takes(self, prep: ChunkPrep, rows: list, row_caches) -> bool:
        """Whether this prepared chunk rides the step's decode launch (see the module docstring)."""
        req = prep.req
        return (self.waiting is None and bool(rows) and row_caches is not None and prep.targets is None
                and req.params.chain_safe and not (prep.pad and not self.final_chunk.whole))

    def forward(self, decode_step, inputs: StepInputs):
        """The decode step's forward with the waiting chunk in it: the decode plan's context (its
        logits lazily built on the rows' hidden states), and the chunk's Rider (its head, for `read`)."""
        prep, self.waiting = self.waiting, None
        req = prep.req
        padded = bool(prep.pad)  # only whole final chunks get here padded (takes)
        toks = mx.array(prep.tokens(padded), dtype=mx.int32)[None]
        # A final chunk's last real token is the one position read after the stack (a split final chunk's).
        at = prep.end - prep.start - 1 if prep.final else None
        h_rows, h_prompt = mixed_hidden(self.binding, inputs.tokens, inputs.caches, toks, req.caches, at)
        if padded:
            chunk_pad.trim(req.caches, prep.pad)
        eager = getattr(decode_step, "step", decode_step)
        ctx = eager.from_hidden(inputs, h_rows)
        rider = Rider(prep)
        if prep.final:  # h_prompt: that one position, so the head reads its last
            pctx = self.prefill.from_hidden(StepInputs(toks[:, at:at + 1], req.caches, final=True), h_prompt)
            rider.st = self.sampler.tensors([req])
            if rider.st is not None:
                pctx.inputs.sampling = self.sampler.host_state(rider.st, [req])
            rider.out = self.prefill.head(pctx, None)
            self.unread.append(rider)
        if self.prefix_io is not None:
            self.prefix_io.after_chunk(req, prep.end)
            if prep.final:
                # The prompt's KV into the pool now, lazily, as a middle chunk's goes: a request
                # admitted next step hits it, as it would behind a separate forward. The disk copy,
                # which reads the pool on the host, waits for the token's read.
                self.prefix_io.store_prompt(req, prep.end)
        self.steps += 1
        return ctx, rider

    @staticmethod
    def targets(rider: Rider) -> list:
        """What the launch queues for the riding chunk besides the decode tokens."""
        if rider.out is None:
            return cache_arrays(rider.prep.req.caches)  # a middle chunk: its cache writes
        lp = [rider.out.logprobs.chosen] if rider.out.logprobs is not None else []
        return [rider.out.next_tokens, *lp]

    def read(self, rider: Rider) -> tuple[int, dict | None] | None:
        """A launched final chunk's (first token, logprobs), once the host may wait for it; None when
        its request left meanwhile (`leave`) or the runner was reset (`drop`)."""
        if not any(r is rider for r in self.unread):
            return None
        self.unread = [r for r in self.unread if r is not rider]
        tok = int(rider.out.next_tokens.item())
        lps = rider.out.logprobs.to_lists(rider.st)[0] if rider.out.logprobs is not None else None
        if self.prefix_io is not None:
            self.prefix_io.spill_prompt(rider.prep.req)
        return tok, lps

    def stranded(self, pending) -> list[Rider]:
        """Unread riders whose launch is not `pending` (the runner's): the chain was dropped under
        them when every row left, so no later decode step reads them."""
        mine = pending.rider if pending is not None else None
        return [r for r in self.unread if r is not mine]

    def leave(self, reqs: list) -> None:
        """`reqs` left (aborted, failed) before their first token was read: that token is never
        read, and nothing more of theirs goes to the prefix cache (their holds are released)."""
        gone = {id(r) for r in reqs}
        self.unread = [r for r in self.unread if id(r.prep.req) not in gone]

    def drop(self) -> None:
        """Forget every chunk (fault recovery: the runner's state is reset, and the requests whose
        chunks rode are recomputed)."""
        self.waiting, self.unread = None, []
