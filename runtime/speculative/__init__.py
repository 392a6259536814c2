"""Speculative decoding: draft k tokens per row cheaply, verify them in one batched forward.

    support.py       whether a bound model can roll back rejected positions (and why not)
    prompt_lookup.py n-gram drafting over each row's prompt + output (host-side, plain Python)
    draft_model.py   drafting with a small model of the same tokenizer, on its own per-row caches
    config.py        the `speculative` setting of a request / engine, validated
    speculator.py    per-batch decision (who drafts, when it is off), the verify step, stats
    rows.py          per-row drafting state: k, the acceptance window that pauses a row
    verify.py        the verify step's values: a queued verify, and what it hands the runner
                     (emitted tokens, the positions each row's caches drop: the rollback)
    defaults.py      pipelined / gated / verify positions per forward, by device

The verification itself is the graph's `verify` node (compiler/ops/speculative.py).
docs/speculative.md has the user's view.
"""

from .draft_model import DraftModel
from .config import SPEC_METHODS, SpecConfig, parse_speculative
from .prompt_lookup import NgramIndex
from .speculator import Speculator
from .support import rollback_problem

__all__ = ["SPEC_METHODS", "DraftModel", "NgramIndex", "SpecConfig", "Speculator", "parse_speculative", "rollback_problem"]
