"""One request's prompt chunk as a forward of its own: prepared (the pieces that end at prefix
boundaries run, what is left measured out), then run through the prefill plan.

The runner (runtime/runner.py) prepares every single-request chunk here; a prepared chunk either
runs here or rides the step's decode launch (runtime/mixed_step.py), which reads the same
ChunkPrep. Non-final chunks skip the head (the plan's `final chunk` steps); a final chunk may be
padded to the chunk alignment (runtime/chunk_pad.py). The request's runner-owned fields (its caches,
logprobs) are written by the runner from what these return (runtime/request.py's table).
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.compiler.lower import StepInputs
from graphc.compiler.ops import PromptTargets

from . import chunk_pad


@attrs.define
class ChunkPrep:
    """A prompt chunk ready to run: the request's caches hold [0, start), the chunk is [start, end)."""

    req: object
    n: int  # the scheduled chunk size (what PrefillDone reports)
    start: int
    end: int
    final: bool
    targets: object = None  # PromptTargets when the chunk's prompt logprobs are asked
    pad: int = 0  # pad tokens after a final chunk's real ones (runtime/chunk_pad.py)

    def tokens(self, with_pad: bool) -> list[int]:
        ids = self.req.context_ids[self.start:self.end]
        return ids + [chunk_pad.PAD_TOKEN] * self.pad if with_pad else ids


@attrs.define
class ChunkResult:
    token: int | None = None  # the first generated token, once the whole prompt is in
    first_logprobs: dict | None = None  # that token's, when asked
    prompt_logprobs: list | None = None  # this chunk's prompt logprobs, when asked


@attrs.define
class PrefillDone:
    """What one prefill chunk did (plain data for the engine's postprocess): the prompt positions
    [0, end) are in the request's cache; `token` is its first generated token once the whole
    prompt is in (None for a chunk mid-prompt). A final chunk riding a decode launch reports
    twice: its tokens once launched (no token yet), its token once read (n=0, counted once)."""

    req: object  # the Request
    n: int  # prompt tokens this chunk computed
    end: int
    token: int | None = None
    logprobs: dict | None = None


class PromptChunks:
    def __init__(self, step, sampler, final_chunk, prefix_io, edits):
        self.step = step  # the prefill plan's LoweredStep
        self.sampler = sampler
        self.final_chunk = final_chunk  # chunk_pad.FinalChunk: whole or split, padded or not
        self.prefix_io = prefix_io
        self.edits = edits  # (rows, ctx, step) -> host edit rows or None (the runner's)
        self.padded = 0  # pad positions computed (stats, tests)

    def prepare(self, req, max_tokens: int) -> ChunkPrep:
        """For a request whose caches hold its admitted prefix: the pieces that end at prefix
        boundaries run, and what is left to run: [start, end), its prompt targets and padding."""
        start = req.prefilled
        end = min(len(req.context_ids), start + max_tokens)
        final = end == len(req.context_ids)
        if self.prefix_io is not None:  # pieces ending at prefix boundaries, state captured there
            start = self.prefix_io.prefill_pieces(req, start, end)
        targets = None
        if req.params.prompt_logprobs is not None and not req.n_resumed:
            # The graph's prompt_logprobs node scores each position against the next prompt token
            # (the chunk's last position against the next chunk's first).
            targets = PromptTargets(req.prompt_ids[start + 1:end + 1], req.params.prompt_logprobs)
        pad = self.final_chunk.pad(end - start) if final and targets is None else 0
        return ChunkPrep(req, max_tokens, start, end, final, targets, pad)

    def run(self, prep: ChunkPrep) -> ChunkResult:
        """The chunk's forward; its first generated token once the whole prompt is in the cache."""
        req, start, end, final, targets, pad = prep.req, prep.start, prep.end, prep.final, prep.targets, prep.pad
        step = self.step
        tokens = mx.array(prep.tokens(False), dtype=mx.int32)[None]
        self.padded += pad
        if pad and self.final_chunk.whole:
            # One forward: the real tokens, then pads they never see (causal), sampled at the last
            # real one; the pad columns trimmed off the cache (its next write lands on the first).
            padded = mx.array(prep.tokens(True), dtype=mx.int32)[None]
            ctx = step.forward(StepInputs(padded, req.caches, final=True, sample_at=end - start - 1))
            chunk_pad.trim(req.caches, pad)
        else:
            if pad:
                # The chunk but its last token, padded after the real ones to an aligned length
                # (cache writes only), the pad columns trimmed; the last token then runs alone.
                head = mx.array(prep.tokens(False)[:-1] + [chunk_pad.PAD_TOKEN] * pad, dtype=mx.int32)[None]
                step.forward(StepInputs(head, req.caches, final=False))
                chunk_pad.trim(req.caches, pad)
                tokens = tokens[:, -1:]
            ctx = step.forward(StepInputs(tokens, req.caches, final=final, prompt_targets=targets,
                                          all_positions=targets is not None))
        if self.prefix_io is not None:
            self.prefix_io.after_chunk(req, end)
        res = ChunkResult(prompt_logprobs=self._prompt_logprobs(ctx, targets) if targets is not None else None)
        if not final:
            mx.eval(step.fill_targets(ctx))
            return res
        st = self.sampler.tensors([req])
        if st is not None:
            ctx.inputs.sampling = self.sampler.host_state(st, [req])
        out = step.head(ctx, self.edits([req], ctx, step))
        mx.eval(out.next_tokens)
        if out.logprobs is not None:
            res.first_logprobs = out.logprobs.to_lists(st)[0]
        if self.prefix_io is not None:
            self.prefix_io.store_prompt(req)  # the prompt's new KV into the pool, its end locked
        res.token = int(out.next_tokens.item())
        return res

    def _prompt_logprobs(self, ctx, targets: PromptTargets) -> list:
        """The graph's prompt_logprobs output for this chunk, one entry per target."""
        if not targets.ids:
            return []
        out = ctx.values[self.step.outputs["prompt_logprobs"]]
        mx.eval(*out.arrays())
        return out.to_lists(targets.ids)
