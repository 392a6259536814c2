"""The prefix cache's array side, used by the runner: restore hits, capture boundaries, fill pools.

runtime/prefix_cache.py decides which slots hold what (plain Python); this module moves
the arrays: gather a hit from the pools into a fresh batch-of-one working cache, take
references to window tails / recurrent state at boundaries while a prompt is
prefilled, and scatter a prompt's (or a finished request's) new KV into its slots.

Cost model. A hit of m tokens costs one gather of m rows per pool-backed layer (and
`window` rows per windowed layer) into the working cache; an insert of n new tokens
one scatter of n rows per layer. Both are a few ops per layer, queued asynchronously;
decode never touches the pools.
"""

from __future__ import annotations

import mlx.core as mx

from graphc.compiler.lower import StepInputs

from .cache.pool import KVPool
from .prefix_cache import Capture, PrefixCache, WritePlan


class PrefixIO:
    def __init__(self, prefix: PrefixCache, compiled):
        self.prefix = prefix
        self.compiled = compiled
        self.policies = compiled.binding.policies
        roles = [getattr(p, "prefix_role", None) for p in self.policies]
        self.pool_layers = [i for i, r in enumerate(roles) if r == "pool"]
        self.window_layers = [i for i, r in enumerate(roles) if r == "window"]
        self.state_layers = [i for i, r in enumerate(roles) if r == "snapshot"]
        self.pool = KVPool(self.pool_layers, prefix.slots.capacity)
        self.window_pool = (KVPool(self.window_layers, prefix.window_slots.capacity)
                            if prefix.window_slots is not None else None)
        self.gathered_tokens = 0

    # -- admission ------------------------------------------------------------------
    def restore(self, req) -> None:
        """Fill `req.caches` (fresh) with the prefix the prefix cache admitted, if any."""
        hit = self.prefix.take_hit(req)
        if hit is None:
            return
        caches, fresh = req.caches, []
        for i in self.pool_layers:
            k, v = self.pool.gather(i, hit.slots)
            caches[i] = self.policies[i].restore(k, v)
            fresh += [k, v]
        if self.window_layers:
            start = hit.length - len(hit.window_slots)
            for i in self.window_layers:
                k, v = self.window_pool.gather(i, hit.window_slots)
                caches[i] = self.policies[i].restore(k, v, start)
                fresh += [k, v]
        for j, i in enumerate(self.state_layers):
            caches[i] = self.policies[i].restore(hit.snapshot[j], hit.length)
        # Run the gathers now: a lazy gather would keep the pool's current buffers alive,
        # and the next scatter into the pool would have to copy them.
        mx.async_eval(fresh)
        self.gathered_tokens += hit.length

    # -- prefill: boundaries ------------------------------------------------------------
    def prefill_pieces(self, req, start: int, end: int) -> int:
        """Run the prompt from `start` up to the last boundary before `end`, one forward per
        piece (lazy, not evaluated), capturing state at each boundary. Returns the new start."""
        if getattr(req.params, "prompt_logprobs", None) is not None:
            return start  # the runner reads prompt logprobs off one forward per chunk: no pieces
        points = self.prefix.capture_points(req)
        step = self.compiled.prefill
        for cut in sorted(p for p in points if start < p < end):
            tokens = mx.array(req.context_ids[start:cut], dtype=mx.int32)[None]
            step.forward(StepInputs(tokens, req.caches, final=False))
            self.prefix.add_capture(req, cut, self.capture(req.caches, 0))
            start = cut
        return start

    def after_chunk(self, req, end: int) -> None:
        if end in self.prefix.capture_points(req):
            self.prefix.add_capture(req, end, self.capture(req.caches, 0))
        if end < len(req.context_ids):  # the prompt so far, for requests admitted meanwhile
            self.store_prompt(req, end)  # (the whole prompt is stored once its first token is out)

    def capture(self, caches: list, row: int) -> Capture | None:
        """References to the window tails and recurrent state of `row` (no copies)."""
        if not (self.window_layers or self.state_layers):
            return None
        cap = Capture()
        if self.window_layers:
            tails = [self.policies[i].capture(caches[i], row) for i in self.window_layers]
            cap.window = [(k, v) for k, v, _ in tails]
            cap.window_start = tails[0][2]
            mx.async_eval([a for kv in cap.window for a in kv])  # copy now, free the buffer it came from
        if self.state_layers:
            cap.snapshot = [self.policies[i].capture(caches[i], row) for i in self.state_layers]
        return cap

    # -- inserts ---------------------------------------------------------------------
    def store_prompt(self, req, upto: int | None = None) -> None:
        """Prompt positions [0, upto) are in req.caches: write what the tree lacks."""
        self._write(self.prefix.insert_prompt(req, upto), req.caches, 0)

    def store_prompt_row(self, req, caches: list, row: int) -> None:
        """Like store_prompt, for a request whose prompt is row `row` of a batched prefill."""
        self._write(self.prefix.insert_prompt(req, None), caches, row)

    def store_rows(self, reqs: list, rows: list[int], caches: list) -> None:
        """Requests leaving the decode batch: store prompt + output whose KV the batch holds."""
        for req, row in zip(reqs, rows):
            n = self.row_length(caches, row)
            seq = (req.prompt_ids + req.output_ids)[:n]
            self._write(self.prefix.insert_finished(req, seq, self.capture(caches, row)), caches, row)

    def row_length(self, caches: list, row: int) -> int:
        c = caches[self.pool_layers[0]]
        return c.idx - c.left_pad[row]

    def _write(self, plan: WritePlan, caches: list, row: int) -> None:
        for slots, start, end in plan.pool:
            for i in self.pool_layers:
                k, v = self.policies[i].positions(caches[i], row, start, end)
                self.pool.write(i, slots, k, v)
        for slots, cap, offsets in plan.window:
            idx = mx.array(offsets, dtype=mx.int32)
            for (k, v), i in zip(cap.window, self.window_layers):
                self.window_pool.write(i, slots, k[:, idx], v[:, idx])
        if plan.pool:
            self.pool.flush()
        if plan.window:
            self.window_pool.flush()

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes + (self.window_pool.nbytes if self.window_pool else 0)
