"""Trace a lowered step on a dummy batch and count the mx primitives its lazy graph holds.

This is what `graphc inspect` reports as "ops the lowered step contains": read off
the real expression (via mx.export_to_dot), not a hand-written list.
"""

from __future__ import annotations

import io
import re
from collections import Counter

import mlx.core as mx

from .compile import CompiledGraph
from .lower import StepInputs

_LABEL = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


def _prefilled(compiled: CompiledGraph, prompt: int) -> list:
    caches = [p.new_cache() for p in compiled.binding.policies]
    out = compiled.prefill(StepInputs(mx.zeros((1, prompt), mx.int32), caches, final=False))
    mx.eval(out.hidden)
    return caches


def trace_ops(compiled: CompiledGraph, kind: str, batch: int = 2, prompt: int = 8) -> list[tuple[str, int]]:
    """(primitive, count) pairs, most frequent first, for one `kind` step on a dummy batch."""
    if kind == "prefill":
        caches = [p.new_cache() for p in compiled.binding.policies]
        out = compiled.prefill(StepInputs(mx.zeros((1, prompt), mx.int32), caches, final=True))
    else:
        # A decode batch of `batch` rows with `prompt` tokens of context each.
        caches = _prefilled(compiled, prompt)
        for _ in range(batch - 1):
            for mine, theirs in zip(caches, _prefilled(compiled, prompt)):
                mine.extend(theirs)
        # Materialize the joined batch so the trace shows the decode step alone.
        mx.eval([v for c in caches for v in vars(c).values() if isinstance(v, mx.array)])
        out = compiled.decode(StepInputs(mx.zeros((batch, 1), mx.int32), caches, final=True))
    buf = io.StringIO()
    mx.export_to_dot(buf, *[x for x in (out.next_tokens, out.hidden) if x is not None])
    counts = Counter(_LABEL.findall(buf.getvalue()))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
