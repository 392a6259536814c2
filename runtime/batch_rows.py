"""The decode batch's rows: which request sits in which row of the batch caches, and the rows that
requests which ended have left vacant.

Why vacant rows: the batch caches are contiguous left-padded `[B, H, T, ...]` arrays
(runtime/cache/full.py), so taking a row out copies every kept row's KV. A saturated serving run
ends one row at a time; on the H200 (1B Llama shape, 64 rows) a step in which rows left cost
~19 ms against an 8.7 ms decode step (docs/serving-bench.md), and those steps set the tail of the
inter-token latency. A row whose request ended is left in place instead: it keeps decoding (its
tokens are dropped), and a FullKV narrows it to the column it writes (`vacate`), so its attention
reads one column and `/metrics` counts none of it as live. The rows are compacted by copies the
batch takes anyway: a join, and a decode step whose write needs wider buffers (every 256 columns,
runtime/cache/full.py: the drop and the growth are one copy). The decode plan's `vacant rows`
choice (compiler/passes/decode_choices.py) says whether they are also compacted once they pass a
quarter of the batch ("quarter": on the CPU, where a vacant row costs a row of every decode
matmul) or only by those copies ("copies": on a GPU, where the matmuls read the weights once for
every row and a drop of its own is a step several times as long). Under "reuse" (the GPU's
auto) a join also writes its rows into vacant rows in place, copying only the joining rows'
own positions (FullKV.fill_rows): under arrivals over time every join was a copy of the whole
batch, and those steps set the inter-token latency's tail at the server door. A join falls back
to the copy where there are fewer vacant rows than joining ones or a joining row is longer than
the batch's columns; a growth copy keeps a quarter of the live rows' count vacant for the joins
to come (`spare_rows`).

Only rows that could not come back and need nothing from the host are left vacant: a preempted
request is queued again (its row must go, or it would sit in the batch twice once it rejoins),
and a row with host logit edits (grammar, logits processors) or drafts of its own would keep
costing host work each step. Those rows are taken out at once, as before.
"""

from __future__ import annotations

from .request import Status

# Under the plan's "quarter": compact once more than this share of the batch's rows is vacant.
MAX_VACANT_SHARE = 0.25


class BatchRows:
    """rows: the batch's requests in row order (vacant ones included); caches: one layer cache per
    layer holding those rows (None while the batch is empty); vacant: ids of the rows left vacant."""

    def __init__(self, vacant_rows: str = "quarter"):
        self.rows: list = []
        self.caches: list | None = None
        self.vacant: set[int] = set()
        # The decode plan's `vacant rows` choice: past this share of the batch, vacant rows are
        # dropped by a copy of their own ("copies": never, the join and growth copies drop them;
        # "at once": paged rows, whose leaving copies nothing).
        self.max_vacant_share = {"quarter": MAX_VACANT_SHARE, "copies": 1.0, "reuse": 1.0, "at once": 0.0}[vacant_rows]
        self.reuse = vacant_rows == "reuse"  # joins fill vacant rows in place (fill_rows)

    def live(self) -> list:
        """The requests still decoding, in row order."""
        return [r for r in self.rows if id(r) not in self.vacant]

    def clear(self) -> None:
        self.rows, self.caches, self.vacant = [], None, set()

    def join(self, reqs: list, parts: list[list]) -> None:
        """Append `reqs`; `parts` are their layer caches, one list per prefilled group. Vacant rows go
        in the same copy of the batch (filtered out before the extend)."""
        keep = None
        if self.reuse and self._fill(reqs, parts):
            return
        if self.caches is None or not self.rows:
            self.rows, self.vacant = [], set()
            self.caches, parts = parts[0], parts[1:]
        elif self.vacant:
            keep = self.live_indices()
            self.rows, self.vacant = [self.rows[i] for i in keep], set()
        if parts or keep is not None:
            for i, mine in enumerate(self.caches):
                extend_all(mine, [p[i] for p in parts], keep)
        self.rows.extend(reqs)

    def _fill(self, reqs: list, parts: list[list]) -> bool:
        """Write the joining rows into vacant rows in place (lowest first); False where they do
        not all fit (then the join copies the batch, dropping the vacant rows)."""
        if not self.caches or not self.rows or len(reqs) > len(self.vacant):
            return False
        if not all(hasattr(c, "fill_rows") and c.can_fill([p[i] for p in parts]) for i, c in enumerate(self.caches)):
            return False
        slots = [i for i, r in enumerate(self.rows) if id(r) in self.vacant][:len(reqs)]
        for i, c in enumerate(self.caches):
            c.fill_rows(slots, [p[i] for p in parts])
        for i, req in zip(slots, reqs):
            self.vacant.discard(id(self.rows[i]))
            self.rows[i] = req
        return True

    def leave(self, idx: list[int], vacate: bool) -> None:
        """The rows at `idx` (requests that ended or were preempted) leave the batch: left vacant
        where `vacate` says they may (see the module docstring), else taken out now with any vacant
        ones. An empty batch drops its caches."""
        for i in idx:
            self.vacant.add(id(self.rows[i]))
        live = self.live_indices()
        if not live:
            self.clear()
            return
        cheap = any(getattr(c, "cheap_filter", False) for c in self.caches)  # paged rows: no copy to save
        if not vacate or cheap or len(self.vacant) > self.max_vacant_share * len(self.rows):
            self._keep(live)
            return
        for c in self.caches:
            narrow = getattr(c, "vacate", None)
            if narrow is not None:
                narrow(idx)

    def grows_next(self) -> bool:
        """Whether the next decode step widens some layer's buffers (`grows_next`: a copy of every
        row), in which the vacant rows should go (drop_vacant)."""
        return bool(self.caches) and any(getattr(c, "grows_next", _never)() for c in self.caches)

    def spare_rows(self) -> int:
        """Vacant rows a growth copy keeps for joins to fill: none but under "reuse", there a
        quarter of the live rows (at least one)."""
        return -(-(len(self.rows) - len(self.vacant)) // 4) if self.reuse else 0

    def drops_at_growth(self) -> bool:
        """Whether a growing step's copy would drop vacant rows (more are vacant than it keeps)."""
        return len(self.vacant) > self.spare_rows()

    def drop_vacant(self) -> None:
        """Drop the vacant rows (but `spare_rows` of them) in one copy per layer that also leaves
        room for the next decode write (extend_all allocates for one column more), so a growing
        step copies the rows once."""
        spare = self.spare_rows()
        kept_vacant = set([id(r) for r in self.rows if id(r) in self.vacant][:spare])
        keep = [i for i, r in enumerate(self.rows) if id(r) not in self.vacant or id(r) in kept_vacant]
        self.rows, self.vacant = [self.rows[i] for i in keep], kept_vacant
        for c in self.caches:
            extend_all(c, [], keep)

    def live_indices(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if id(r) not in self.vacant]

    def _keep(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
        self.vacant = set()
        for c in self.caches:
            c.filter(keep)


def _never() -> bool:
    return False


def may_vacate(req, speculates) -> bool:
    """A row that may be left vacant: its request ended for good (not preempted back to the queue)
    and its steps need nothing from the host (no grammar, processors or drafts of its own);
    `speculates(params)`: whether the engine's speculator drafts for such a request."""
    return req.status is Status.FINISHED and req.params.chain_safe and not speculates(req.params)


def extend_all(cache, others: list, keep: list[int] | None = None) -> None:
    """cache.extend_all(others, keep) (runtime/cache/base.py), or filter and one extend at a time
    for a cache of mlx-lm's own (the `native` policy) that has no extend_all."""
    many = getattr(cache, "extend_all", None)
    if many is not None:
        many(others, keep)
        return
    if keep is not None:
        cache.filter(keep)
    for other in others:
        cache.extend(other)
