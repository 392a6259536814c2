"""The cache-policy protocol.

A *policy* is bound to one layer at bind time (it knows the layer's kind, heads,
head_dim, window). It creates *layer caches*: the objects an mlx-lm attention layer
is handed as `cache=`. mlx-lm layers only ever touch

    cache.offset                       RoPE position (int, or an mx.array [B] per row)
    cache.update_and_fetch(k, v)       write the new keys/values, return what to attend over
    cache.make_mask(N, window_size=None, return_array=False)   (called by the lowering)

so the model never knows its policy. The runtime additionally batches requests
with four operations every layer cache implements:

    filter(rows)    keep only these batch rows (requests that finished leave)
    extend(other)   append other's rows (admitted requests join the decode batch);
                    extend_all(others, keep) the same for several after filter(keep), at once
                    where the cache can
    extract(row)    one row as a batch-of-one cache (preemption, prefix storage)
    row_length(row) tokens of context `row` has seen (its next absolute position)
    nbytes          bytes held right now

Rows are left-padded: every row writes its new token at the same column, so one
decode step is one slice-update per layer for the whole batch.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import mlx.core as mx

from .prefix_state import PrefixKind, PrefixState


@attrs.frozen
class PolicyParam:
    type: type
    default: Any
    doc: str = ""


class LayerCache:
    """Per-batch state for one layer. See the module docstring for the protocol."""

    offset: Any

    def update_and_fetch(self, keys, values):  # pragma: no cover - protocol
        raise NotImplementedError

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        raise NotImplementedError

    def filter(self, rows: list[int]) -> None:
        raise NotImplementedError

    def extend(self, other: "LayerCache") -> None:
        raise NotImplementedError

    def extend_all(self, others: list, keep: list[int] | None = None) -> None:
        """filter(keep) (when given), then extend() by each of `others` in order; a cache that can
        do it in one copy overrides this (FullKV: the kept rows and every part written once into
        one buffer)."""
        if keep is not None:
            self.filter(keep)
        for other in others:
            self.extend(other)

    def extract(self, row: int) -> "LayerCache":
        raise NotImplementedError

    def row_length(self, row: int) -> int:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError


class CachePolicy:
    """Base class for policies. Subclasses register with @register_policy("name")."""

    name: ClassVar[str] = "?"
    PARAMS: ClassVar[dict[str, PolicyParam]] = {}
    LAYER_KINDS: ClassVar[tuple[str, ...]] = ("full_attention",)
    chain_safe: ClassVar[bool] = True
    # A policy that changes the numbers on purpose (quantized KV) says how far, as a fraction
    # of the logits' scale; the load-time self-check (compiler/selfcheck.py) allows that much
    # on top of rounding. Exact policies leave it 0.
    lossy_tolerance: ClassVar[float] = 0.0

    def __init__(self, layer, **params):
        problems = self.check_params(params)
        if problems:
            raise ValueError(f"cache policy '{self.name}': " + "; ".join(problems))
        self.layer = layer
        self.params = {k: p.default for k, p in self.PARAMS.items()} | params

    @classmethod
    def check_params(cls, params: dict) -> list[str]:
        out = []
        for key, value in params.items():
            p = cls.PARAMS.get(key)
            if p is None:
                known = ", ".join(sorted(cls.PARAMS)) or "none"
                out.append(f"unknown param '{key}' (accepted: {known})")
            elif value is not None and not isinstance(value, p.type):
                out.append(f"param '{key}' must be {p.type.__name__}, got {value!r}")
        return out

    @classmethod
    def check_layer(cls, layer) -> str | None:
        """Why this policy cannot serve `layer` (None when it can)."""
        if layer.kind not in cls.LAYER_KINDS:
            return f"policy '{cls.name}' serves {', '.join(cls.LAYER_KINDS)} layers, not {layer.kind}"
        return None

    def bytes_per_token(self) -> int:
        """KV bytes one request adds per token of context (0 for constant-size state)."""
        return self.layer.kv_bytes_per_token

    def bytes_per_request(self, context: int) -> int:
        """Bytes one request holds at `context` tokens (steady state)."""
        return self.bytes_per_token() * context

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.params.items() if v is not None)
        return f"{self.name}({extra})" if extra else self.name

    def new_cache(self) -> LayerCache:
        """An empty cache for a batch of one request."""
        raise NotImplementedError

    # -- the prefix protocol (runtime/cache/prefix_state.py; used by runtime/prefix_io.py) ------
    # What the prefix cache keeps for this layer: PrefixKind.TOKENS (every position's rows, in
    # the shared pool), TAIL (the last prefix_tail() positions before a boundary) or SNAPSHOT
    # (the state after a boundary). None: this policy takes no part, and prefix_unsupported()
    # says why (graphc inspect shows it; the whole graph then runs without a prefix cache).
    prefix_kind: ClassVar[PrefixKind | None] = None

    def prefix_unsupported(self) -> str | None:
        """Why this policy cannot share prefixes (None when it can)."""
        if self.prefix_kind is None:
            return (f"policy '{self.name}' keeps no prefix state (it declares no prefix_kind; see "
                    "docs/cache-policies.md, 'Taking part in the prefix cache')")
        return None

    def prefix_tail(self) -> int | None:
        """TAIL policies: how many positions before a boundary a hit needs (the window)."""
        return None

    def prefix_capture(self, cache: LayerCache, row: int, start: int, end: int) -> PrefixState:
        """Positions start..end-1 of `row` (TOKENS, TAIL) or the state after `end` (SNAPSHOT,
        start == end), as a PrefixState. `end` is at most cache.row_length(row); a TAIL capture
        asks for at most prefix_tail() positions, a SNAPSHOT capture for end == row_length(row).
        Copies what must not keep the batch's buffers alive; never changes `cache`."""
        raise NotImplementedError(f"policy '{self.name}' declares prefix_kind {self.prefix_kind} "
                                  "but does not implement prefix_capture")

    def prefix_capture_rows(self, cache: LayerCache, spans: list) -> tuple:
        """TOKENS: the planes of several rows' positions at once, each [H, n, ...] with the spans'
        positions one after the other — what prefix_capture of each (row, start, end) in `spans`
        gives, concatenated. Rows leaving a batch together are stored with one pool write per
        layer instead of one per row and layer (runtime/prefix_io.py). This default concatenates
        prefix_capture's planes; a policy whose cache can gather them in one op overrides it."""
        parts = [self.prefix_capture(cache, row, start, end).arrays for row, start, end in spans]
        return parts[0] if len(parts) == 1 else tuple(mx.concatenate(p, axis=1) for p in zip(*parts))

    def prefix_restore(self, state: PrefixState) -> LayerCache:
        """A fresh batch-of-one cache holding `state` (its next position is state.end): TOKENS
        states start at 0; TAIL states hold the last prefix_tail() positions or all of them."""
        raise NotImplementedError(f"policy '{self.name}' declares prefix_kind {self.prefix_kind} "
                                  "but does not implement prefix_restore")
