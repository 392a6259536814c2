"""What the prefix cache's bookkeeping (runtime/prefix_cache.py) hands out and keeps per request:
a hit to restore, what was captured at a boundary, a request's holds, and the array work an
insert needs (runtime/prefix_io.py does it). Plain records; the arrays in them are opaque here."""

from __future__ import annotations

import attrs
import numpy as np

from .radix import Node


@attrs.define
class Hit:
    length: int  # prompt tokens restored (m)
    slots: np.ndarray  # pool slots of positions 0..m-1
    window_slots: np.ndarray | None = None  # window-pool slots of positions m-len..m-1
    snapshot: object = None  # per SNAPSHOT layer, the PrefixState after m (opaque here)


@attrs.define
class Capture:
    """What the array side saw at a boundary b (opaque data; only its extent is read here)."""

    window: object = None  # per TAIL layer, the PrefixState of positions window_start..b-1
    window_start: int = 0
    snapshot: object = None  # per SNAPSHOT layer, the PrefixState after b


@attrs.define
class Hold:
    node: Node | None = None  # locked
    hit: Hit | None = None
    pinned: tuple | None = None  # (node, start, end): window positions pinned for the hit
    captures: dict = attrs.field(factory=dict)  # boundary position -> Capture


@attrs.define
class WritePlan:
    """Array work an insert needs: pool slots for sequence positions, window slots from captures."""

    pool: list = attrs.field(factory=list)  # (slots, start, end): positions start..end-1
    window: list = attrs.field(factory=list)  # (slots, capture, offsets into the capture)
