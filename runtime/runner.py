"""The model runner: the only part of the runtime that touches arrays.

It owns the decode batch (one layer cache per layer, rows left-padded) and the
chain: while step N runs on the device, step N+1 is already built on N's lazy
tokens and queued, so host bookkeeping hides behind device work. Rows that
finish or join between steps do not break the chain: the next step's input is
a lazy gather of the previous step's tokens (plus host-known first tokens of
joined rows).
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.compiler.compile import CompiledGraph
from graphc.compiler.lower import StepInputs

from .request import Request


@attrs.define
class Launch:
    """A decode step that has been queued: its rows (in batch order) and lazy tokens."""

    rows: list
    tokens: mx.array  # int32 [B]
    logprobs: object = None


class ModelRunner:
    def __init__(self, compiled: CompiledGraph, *, chain: bool = True, host_edits=None, prefix_io=None):
        self.compiled = compiled
        # The prefix cache's array side (runtime/prefix_io.py), or None: restores admitted
        # hits, captures state at prefix boundaries, writes KV into the pools.
        self.prefix_io = prefix_io
        # host_edits(rows, logits) -> additive [B, V] row or None: grammar masks and Python
        # logits processors, for rows that are not chain-safe. Set by the engine.
        self.host_edits = host_edits
        self.policies = compiled.binding.policies
        self.chain = chain
        self.rows: list[Request] = []
        self.caches: list | None = None
        self.pending: Launch | None = None
        self.steps = 0

    # -- prefill ----------------------------------------------------------------
    def new_caches(self) -> list:
        return [p.new_cache() for p in self.policies]

    def prefill_chunk(self, req: Request, max_tokens: int) -> int | None:
        """Run up to `max_tokens` more prompt tokens of `req` (a batch of one).

        Returns the first generated token once the whole prompt is in the cache.
        Non-final chunks skip the head (the plan's `final chunk` steps).
        """
        if req.caches is None:
            req.caches = self.new_caches()
            if self.prefix_io is not None:
                self.prefix_io.restore(req)  # the cached prefix the scheduler admitted
        start = req.prefilled
        end = min(len(req.prompt_ids), start + max_tokens)
        final = end == len(req.prompt_ids)
        if self.prefix_io is not None:  # pieces ending at prefix boundaries, state captured there
            start = self.prefix_io.prefill_pieces(req, start, end)
        tokens = mx.array(req.prompt_ids[start:end], dtype=mx.int32)[None]
        step = self.compiled.prefill
        ctx = step.forward(StepInputs(tokens, req.caches, final=final))
        req.prefilled = end
        if self.prefix_io is not None:
            self.prefix_io.after_chunk(req, end)
        if not final:
            mx.eval(ctx.values[step.hidden_node])
            return None
        out = step.head(ctx, self._edits([req], ctx, step))
        mx.eval(out.next_tokens)
        if self.prefix_io is not None:
            self.prefix_io.store_prompt(req)  # the prompt's new KV into the pool, its end locked
        return int(out.next_tokens.item())

    def _edits(self, rows, ctx, step):
        """Host edit rows for `rows`, filled while the device runs the forward already queued."""
        if self.host_edits is None or all(r.params.chain_safe for r in rows):
            return None
        logits = ctx.values[step.logits_node]
        mx.async_eval(logits)
        return self.host_edits(rows, logits)

    # -- decode batch membership ------------------------------------------------------
    def join(self, req: Request) -> None:
        """Add a prefilled request to the decode batch (its caches become batch rows)."""
        caches, req.caches = req.caches, None
        if self.caches is None or not self.rows:
            self.caches = caches
        else:
            for mine, theirs in zip(self.caches, caches):
                mine.extend(theirs)
        self.rows.append(req)

    def leave(self, reqs: list[Request]) -> None:
        """Drop finished or aborted requests from the decode batch."""
        gone = {id(r) for r in reqs}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) == len(self.rows):
            return
        if self.prefix_io is not None:  # their prompt + output KV into the prefix cache first
            left = [i for i, r in enumerate(self.rows) if id(r) in gone]
            self.prefix_io.store_rows([self.rows[i] for i in left], left, self.caches)
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.caches = None
            self.pending = None
            return
        for c in self.caches:
            c.filter(keep)

    # -- decode -------------------------------------------------------------------
    def _next_input(self) -> mx.array:
        """Input tokens [B, 1] for the current rows, lazily from the pending step where possible."""
        p = self.pending
        if p is None:
            return mx.array([[r.last_token] for r in self.rows], dtype=mx.int32)
        pos = {id(r): i for i, r in enumerate(p.rows)}
        from_pending = [pos[id(r)] for r in self.rows if id(r) in pos]
        joined = [r.last_token for r in self.rows if id(r) not in pos]
        # join() appends and leave() keeps order, so pending rows come first.
        if from_pending == list(range(len(p.rows))):
            toks = p.tokens
        else:
            toks = p.tokens[mx.array(from_pending, dtype=mx.int32)]
        if joined:
            toks = mx.concatenate([toks, mx.array(joined, dtype=mx.int32)])
        return toks[:, None]

    def _launch(self) -> Launch:
        step = self.compiled.decode
        ctx = step.forward(StepInputs(self._next_input(), self.caches))
        out = step.head(ctx, self._edits(self.rows, ctx, step))
        launch = Launch(list(self.rows), out.next_tokens, out.logprobs)
        mx.async_eval(launch.tokens)
        self.steps += 1
        return launch

    def decode(self) -> list[tuple[Request, int]]:
        """One decode step for the batch; returns (request, token) for the step that completed.

        With chaining on, the step after it is queued before this returns.
        """
        if not self.rows:
            return []
        cur = self.pending if self.pending is not None else self._launch()
        chain = self.chain and all(r.params.chain_safe for r in self.rows)
        self.pending = cur
        self.pending = self._launch() if chain else None
        toks = cur.tokens.tolist()
        live = {id(r) for r in self.rows}
        return [(r, t) for r, t in zip(cur.rows, toks) if id(r) in live]

    def drain(self) -> None:
        """Forget a queued step (the batch is about to change in a way the chain cannot follow)."""
        self.pending = None

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches) if self.caches else 0
