"""`cache_list`: several caches for one layer (mlx-lm's `CacheList`), each served by its own policy.

Some layers keep more than one cache: deepseek_v32 and longcat_flash keep two KV caches
(attention + indexer / two attention blocks), baichuan_m1 a small state cache next to its
KV. mlx-lm wraps them in a `CacheList` and the layer indexes it (`cache[0]`, `cache[1]`).
`ListCache` is that protocol; every batching operation applies to each part.

Each part gets the policy its mlx-lm class maps to (compiler/cachekinds.py): KVCache ->
`full`, RotatingKVCache -> `windowed`, ArraysCache -> `ssm_state`. The parts keep no
prefix-cache role, so a model with cache lists runs without prefix reuse (graphc inspect
says so) rather than with a partial, wrong restore.
"""

from __future__ import annotations

from .base import CachePolicy, LayerCache
from .registry import get_policy, register_policy

# The policy serving each part kind inside a list (no pool: parts have no prefix role).
PART_POLICIES = {"full_attention": "full", "sliding_attention": "windowed",
                 "linear_attention": "ssm_state", "cache_list": "cache_list", "native": "native"}


class ListCache(LayerCache):
    def __init__(self, caches: list):
        self.caches = list(caches)

    def __getitem__(self, i):
        return self.caches[i]

    def __len__(self) -> int:
        return len(self.caches)

    @property
    def offset(self):
        return self.caches[0].offset

    def row_length(self, row: int) -> int:
        return self.caches[0].row_length(row)

    def make_mask(self, N: int, window_size=None, return_array: bool = False):
        return self.caches[0].make_mask(N, window_size=window_size, return_array=return_array)

    def empty(self) -> bool:
        return self.caches[0].empty()

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self):
        return [c.state for c in self.caches]

    # -- batching ---------------------------------------------------------------
    def filter(self, rows: list[int]) -> None:
        for c in self.caches:
            c.filter(rows)

    def extend(self, other: "ListCache") -> None:
        self.extend_all([other])

    def extend_all(self, others: list, keep: list[int] | None = None) -> None:
        for i, c in enumerate(self.caches):
            c.extend_all([o.caches[i] for o in others], keep)

    def grows_next(self, n: int = 1) -> bool:
        return any(getattr(c, "grows_next", lambda n: False)(n) for c in self.caches)

    def extract(self, row: int) -> "ListCache":
        return ListCache([c.extract(row) for c in self.caches])

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)


@register_policy("cache_list")
class CacheListPolicy(CachePolicy):
    """A list of caches per layer (mlx-lm's CacheList): one part policy per cache, no prefix reuse."""

    LAYER_KINDS = ("cache_list",)

    def __init__(self, layer, **params):
        super().__init__(layer, **params)
        self.parts = []
        for part in layer.parts:
            cls = get_policy(PART_POLICIES[part.kind])
            problem = cls.check_layer(part)
            if problem:
                raise ValueError(f"part {len(self.parts)} of the cache list: {problem}")
            self.parts.append(cls(part))

    def bytes_per_token(self) -> int:
        return sum(p.bytes_per_token() for p in self.parts)

    def bytes_per_request(self, context: int) -> int:
        return sum(p.bytes_per_request(context) for p in self.parts)

    def describe(self) -> str:
        return f"{self.name}({', '.join(p.describe() for p in self.parts)})"

    def prefix_unsupported(self) -> str:
        # Each part could speak the protocol, but the prefix cache keeps one kind per layer;
        # a partial restore (some parts, not others) would be wrong, so the list takes no part.
        return f"policy '{self.name}' keeps several caches per layer, and the prefix cache keeps one per layer"

    def new_cache(self) -> ListCache:
        return ListCache([p.new_cache() for p in self.parts])
