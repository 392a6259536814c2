"""The values a verify step is made of: a verify forward queued on the device, the view a
drafter gets of a row past a verify still in flight, and what a verify step hands back to the
runner (the tokens it emitted and the positions each row's caches must drop)."""

from __future__ import annotations

import attrs
import mlx.core as mx


@attrs.define
class QueuedVerify:
    """A verify forward queued on the device: its rows, their drafts (right-padded to L - 1) and
    lazy results."""

    rows: list
    drafts: list
    L: int  # positions written per row: the input token, drafts, padding
    targets: mx.array  # int32 [B, L]
    accepted: mx.array  # int32 [B]
    held: int = -1  # positions after the input token still in the caches (L - 1 until padding is trimmed)

    def __attrs_post_init__(self):
        if self.held < 0:
            self.held = self.L - 1


@attrs.define
class AssumedRow:
    """What a drafter sees when it drafts past a verify still in flight: the row's prompt and
    its output as if every draft were accepted (the bonus token is not known yet)."""

    id: str
    prompt_ids: list
    output_ids: list
    params: object


@attrs.frozen
class Verified:
    """One verify step's outcome, for the runner to apply: `emitted` is (request, token, None)
    per emitted token, rows in batch order; `trims[i]` is how many positions row i's caches drop
    (its rejected drafts, padding, and a pipelined guess built on them), so the caches hold
    exactly the accepted sequence — `FullKV.trim_rows(trims)` on every layer."""

    emitted: list
    trims: list
