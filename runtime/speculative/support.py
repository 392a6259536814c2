"""Can this bound model speculate? Only when every layer's cache can drop rejected positions.

Full-attention KV (`full`, `pool_backed`: `FullKV` rows) trims per row. A windowed ring buffer
has already overwritten what a rejected position displaced, recurrent state (SSM / linear
attention) has folded the rejected tokens in, and mlx-lm's own (`native`) caches are one
request at a time with no per-row trim: for those models speculation is off, with this reason
in `graphc inspect`, the server log and the 400 a request asking for it gets.
"""

from __future__ import annotations


# The rule is a neutral contract: the compiler's `verify` op shows it in inspect too.
from graphc.contracts.policies import rollback_problem  # noqa: E402,F401 - re-exported
