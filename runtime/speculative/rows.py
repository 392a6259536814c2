"""What the speculator keeps per row: its drafting config and n-gram index, its current k, and
the acceptance window that pauses a row whose drafts keep being rejected."""

from __future__ import annotations

import attrs

from .config import SpecConfig
from .prompt_lookup import NgramIndex


@attrs.define
class RowState:
    cfg: SpecConfig
    index: NgramIndex
    k: int
    drafted: int = 0  # over the current window
    accepted: int = 0
    steps: int = 0
    paused_until: int = 0  # no drafting until the request has this many output tokens
    misses: int = 0  # consecutive attempts that found no draft

    def learn(self, drafted: int, accepted: int, *, shrink: bool, window: int, min_acceptance: float) -> bool:
        """Adapt k to one verify's outcome (grow after a whole draft accepted, halve after none where
        `shrink`); every `window` verifies, True when under `min_acceptance` of the window's drafts
        were accepted: the caller then pauses the row (`pause`)."""
        if accepted == drafted:
            self.k = min(self.k + 1, self.cfg.num_draft_tokens)
        elif accepted == 0 and (shrink or self.cfg.method == "draft_model"):
            self.k = max(1, self.k // 2)  # a draft model's drafts cost a step each: it always shrinks
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        if self.steps < window:
            return False
        poor = self.accepted < min_acceptance * self.drafted
        self.drafted = self.accepted = self.steps = 0
        return poor

    def pause(self, until: int) -> None:
        """No drafting until the request has `until` output tokens; then k starts at its most."""
        self.paused_until = until
        self.k = self.cfg.num_draft_tokens
