"""Mixed steps: one request's prompt chunk rides the decode step's forward (the decode plan's
`mixed step` choice, `decode: {mixed_step: true}`; the stack is compiler/mixed_forward.py).

The runner prepares the chunk where it always does (its caches, an admitted prefix restored, the
pieces that end at prefix boundaries), then, instead of a forward of its own, hands it here. The
step's first decode launch carries it: the decode rows and the chunk go through the decoder
stack together; the rows' logits go through the decode plan's head, the chunk's last real
position (on its final chunk) through the prefill plan's. Its first token is read after the
step's decode tokens, so the decode chain is queued before the host waits for the prompt.

A chunk rides only where the separate path would give the same result: a single request's chunk
(not a batched prefill group), no prompt logprobs, no host edits for its first token, and a plain
decode launch this step (the plan's choice already required plain K/V caches and llama blocks). Otherwise, or when the step
ends up not launching one (a burst still admitting, a speculative verify step), the chunk runs
as its own forward after the decode.

Off by default: the host still waits for the chunk's first token in the step that carries it, so
the next decode step starts on an idle device, and on an H100 the engine's mixed step stayed
~2.4x the decode step where the fused forward alone, chained, was 1.46x (docs/scheduling.md,
"Mixed steps"). Reading that token one step later is what is left.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.compiler.lower import StepInputs, cache_arrays
from graphc.compiler.mixed_forward import mixed_hidden

from . import chunk_pad
from .prompt_chunk import ChunkPrep


@attrs.define
class Rider:
    """A chunk in a launched mixed step: what the host reads once the step's tokens are in."""

    prep: ChunkPrep
    out: object = None  # the prefill head's StepOutputs (final chunks)
    st: object = None  # its sampling tensors


class MixedSteps:
    """The runner's mixed-step state: at most one chunk waiting for the step's launch, and the one
    riding the launch the host reads next."""

    def __init__(self, compiled, sampler, final_chunk, prefix_io):
        self.binding = compiled.binding
        self.prefill = compiled.prefill
        self.sampler = sampler
        self.final_chunk = final_chunk
        self.prefix_io = prefix_io
        self.waiting: ChunkPrep | None = None
        self.riding: Rider | None = None
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
        logits lazily built on the rows' hidden states); the chunk's head is kept for `read`."""
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
        if self.prefix_io is not None:
            self.prefix_io.after_chunk(req, prep.end)
        self.riding = rider
        self.steps += 1
        return ctx

    def targets(self) -> list:
        """What the launch queues for the riding chunk besides the decode tokens."""
        r = self.riding
        if r is None:
            return []
        if r.out is None:
            return cache_arrays(r.prep.req.caches)  # a middle chunk: its cache writes
        lp = [r.out.logprobs.chosen] if r.out.logprobs is not None else []
        return [r.out.next_tokens, *lp]

    def read(self) -> tuple[ChunkPrep, int | None, dict | None] | None:
        """The riding chunk's result, once the host may wait for it: (prep, first token or None,
        logprobs). None when no chunk rode."""
        r, self.riding = self.riding, None
        if r is None:
            return None
        if r.out is None:
            return r.prep, None, None
        tok = int(r.out.next_tokens.item())
        lps = r.out.logprobs.to_lists(r.st)[0] if r.out.logprobs is not None else None
        if self.prefix_io is not None:
            self.prefix_io.store_prompt(r.prep.req)  # the prompt's new KV into the pool, its end locked
        return r.prep, tok, lps

    def drop(self) -> None:
        """Forget any chunk (fault recovery: the runner's state is reset)."""
        self.waiting = self.riding = None
