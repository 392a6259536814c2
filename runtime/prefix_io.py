"""The prefix cache's array side, used by the runner: restore hits, capture boundaries, fill pools.

runtime/prefix_cache.py decides which slots hold what (plain Python); this module moves
the arrays: gather a hit from the pools into a fresh batch-of-one working cache, take
references to window tails / recurrent state at boundaries while a prompt is
prefilled, and scatter a prompt's (or a finished request's) new KV into its slots.

Every layer goes through the prefix protocol (runtime/cache/prefix_state.py):
`policy.prefix_capture(cache, row, start, end)` and `policy.prefix_restore(state)`, with
the positions chosen by the policy's `prefix_kind` (TOKENS, TAIL, SNAPSHOT).

Cost model. A hit of m tokens costs one gather of m rows per TOKENS layer (and
`window` rows per TAIL layer) into the working cache; an insert of n new tokens one
scatter of n rows per layer — for all the rows of one batched prefill, or all the rows
leaving the decode batch in one step, together (`_write_rows`). Both are a few ops per
layer, queued asynchronously; decode never touches the pools.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from graphc.compiler.lower import StepInputs

from .cache.pool import KVPool
from .cache.prefix_state import PrefixKind, PrefixState
from .prefix_cache import Capture, PrefixCache, WritePlan


class PrefixIO:
    """Moves prefix state between working caches and the pools through the prefix protocol
    (runtime/cache/prefix_state.py): it reads each policy's `prefix_kind` to know which
    positions to ask for, and never its class."""

    def __init__(self, prefix: PrefixCache, compiled):
        self.prefix = prefix
        self.compiled = compiled
        self.policies = compiled.binding.policies
        kinds = [p.prefix_kind for p in self.policies]
        self.token_layers = [i for i, k in enumerate(kinds) if k is PrefixKind.TOKENS]
        self.tail_layers = [i for i, k in enumerate(kinds) if k is PrefixKind.TAIL]
        self.snapshot_layers = [i for i, k in enumerate(kinds) if k is PrefixKind.SNAPSHOT]
        self.pool = KVPool(self.token_layers, prefix.slots.capacity)
        self.window_pool = (KVPool(self.tail_layers, prefix.window_slots.capacity)
                            if prefix.window_slots is not None else None)
        self.gathered_tokens = 0
        self.disk = None  # the disk tier (runtime/cache/disk_tier.py) when kv_cache_dir is set

    # -- admission ------------------------------------------------------------------
    def restore(self, req) -> None:
        """Fill `req.caches` (fresh) with the prefix the prefix cache admitted, if any."""
        hit = self.prefix.take_hit(req)
        if hit is None:
            return
        caches, fresh, m = req.caches, [], hit.length
        for i in self.token_layers:
            state = PrefixState(PrefixKind.TOKENS, 0, m, self.pool.gather(i, hit.slots))
            caches[i] = self.policies[i].prefix_restore(state)
            fresh += state.arrays
        for i in self.tail_layers:
            rows = self.window_pool.gather(i, hit.window_slots)
            state = PrefixState(PrefixKind.TAIL, m - len(hit.window_slots), m, rows)
            caches[i] = self.policies[i].prefix_restore(state)
            fresh += state.arrays
        for state, i in zip(hit.snapshot or (), self.snapshot_layers):
            caches[i] = self.policies[i].prefix_restore(state)
        # Run the gathers now: a lazy gather would keep the pool's current buffers alive,
        # and the next scatter into the pool would have to copy them.
        mx.async_eval(fresh)
        self.gathered_tokens += m

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
            self.prefix.add_capture(req, cut, self.capture(req.caches, 0, cut))
            start = cut
        return start

    def after_chunk(self, req, end: int) -> None:
        if end in self.prefix.capture_points(req):
            self.prefix.add_capture(req, end, self.capture(req.caches, 0, end))
        if end < len(req.context_ids):  # the prompt so far, for requests admitted meanwhile
            self.store_prompt(req, end)  # (the whole prompt is stored once its first token is out)

    def capture(self, caches: list, row: int, end: int) -> Capture | None:
        """What a boundary at `end` keeps of `row`: the last `window` positions of TAIL layers and
        the state of SNAPSHOT layers (copies of a tail, references to a state)."""
        if not (self.tail_layers or self.snapshot_layers):
            return None
        cap = Capture()
        if self.tail_layers:
            start = max(0, end - self.prefix.window)
            cap.window = [self.policies[i].prefix_capture(caches[i], row, start, end) for i in self.tail_layers]
            cap.window_start = max(st.start for st in cap.window)
            mx.async_eval([a for st in cap.window for a in st.arrays])  # copy now, free the buffer it came from
        if self.snapshot_layers:
            cap.snapshot = [self.policies[i].prefix_capture(caches[i], row, end, end) for i in self.snapshot_layers]
        return cap

    # -- inserts ---------------------------------------------------------------------
    def store_prompt(self, req, upto: int | None = None) -> None:
        """Prompt positions [0, upto) are in req.caches: write what the tree lacks."""
        self._write(self.prefix.insert_prompt(req, upto), req.caches, 0)
        if upto is None:  # a whole prompt: to disk too (a request may end here)
            self.spill_prompt(req)

    def spill_prompt(self, req) -> None:
        """A whole prompt already stored: to the disk tier too, where there is one (it reads the pool
        on the host, so a mixed step's final chunk does it once its first token is read)."""
        if self.disk is not None:
            self.disk.spill_sequences([req.context_ids])

    def store_prompt_rows(self, reqs: list, caches: list) -> None:
        """Like store_prompt, for the requests whose prompts are the rows of one batched prefill
        (request i is row i), written together (see _write_rows)."""
        self._write_rows([(self.prefix.insert_prompt(req, None), row) for row, req in enumerate(reqs)], caches)
        if self.disk is not None:
            self.disk.spill_sequences([req.context_ids for req in reqs])

    def store_rows(self, reqs: list, rows: list[int], caches: list) -> None:
        """Requests leaving the decode batch: store prompt + output whose KV the batch holds."""
        plans, seqs = [], []
        for req, row in zip(reqs, rows):
            n = self.row_length(caches, row)
            seq = (req.prompt_ids + req.output_ids)[:n]
            seqs.append(seq)
            plans.append((self.prefix.insert_finished(req, seq, self.capture(caches, row, n)), row))
        self._write_rows(plans, caches)
        if self.disk is not None:  # the conversation so far outlives the pool and the process
            self.disk.spill_sequences(seqs)

    def _write_rows(self, plans: list, caches: list) -> None:
        """(plan, row) pairs of one batch, already inserted into the tree in this order: their TOKENS
        positions go to the pool in one capture and one write per layer for all rows
        (policy.prefix_capture_rows), not one per row and layer. When 64 rows finish together
        that is 2 x layers ops instead of ~6 x 64 x layers, each encoded on the host while the
        rows still decoding wait."""
        spans = [(row, start, end) for plan, row in plans for _, start, end in plan.pool if end > start]
        slots = [s for plan, _ in plans for s, start, end in plan.pool if end > start]
        all_slots = np.concatenate(slots) if slots else None
        if all_slots is not None and len(np.unique(all_slots)) < len(all_slots):
            # A later row's insert evicted slots an earlier row had just been given (a full pool):
            # one scatter with repeated slots has no defined winner, so write row after row, in
            # insert order, as the tree expects.
            for plan, row in plans:
                self._write(plan, caches, row)
            return
        for plan, row in plans:
            if plan.window:
                self._write(WritePlan(window=plan.window), caches, row)
        if spans:
            for i in self.token_layers:
                self.pool.write(i, all_slots, self.policies[i].prefix_capture_rows(caches[i], spans))
            self.pool.flush()

    def row_length(self, caches: list, row: int) -> int:
        return caches[self.token_layers[0]].row_length(row)

    def _write(self, plan: WritePlan, caches: list, row: int) -> None:
        for slots, start, end in plan.pool:
            for i in self.token_layers:
                state = self.policies[i].prefix_capture(caches[i], row, start, end)
                self.pool.write(i, slots, state.arrays)
        for slots, cap, offsets in plan.window:
            for state, i in zip(cap.window, self.tail_layers):
                self.window_pool.write(i, slots, state.rows(offsets))
        if plan.pool:
            self.pool.flush()
        if plan.window:
            self.window_pool.flush()

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes + (self.window_pool.nbytes if self.window_pool else 0)
