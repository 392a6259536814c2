"""The disk tier's partial last blocks ("tails"): the positions of a sequence past its last full block.

Full blocks (runtime/cache/disk_tier.py) are write-once files named by the token chain up to
their end. A sequence rarely ends on a block end, and a growing conversation's next turn
starts exactly where the previous prompt (or answer) ended: without the tail, a restarted
server recomputes up to `block_tokens - 1` positions more than a warm one.

A tail is one file per *parent chain*: `<hash of the last full block before it>-tail`
(the model identity for a sequence shorter than one block). It holds the tokens past that
block end, their KV planes, and for hybrid models the recurrent state at every position
inside the tail where the tree kept a snapshot (`s<layer>.<k>@<offset>`). Unlike a block it
is *replaced* when a later sequence on the same chain ends in the same block (the write is
still a private temp file renamed into place: a reader sees the old or the new file, whole,
checksummed). A hit on it uses the common prefix of its tokens and the prompt's (dense), or
the longest stretch of it that ends at a kept state (hybrid), so a prompt that re-tokenizes
near the previous end, or a next turn that dropped the answer, still reuses what matches.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .disk_files import encode_block
from .prefix_state import PrefixKind, PrefixState
from .radix import common_prefix

TAIL = "-tail"


def tail_name(parent: str) -> str:
    return parent + TAIL


def tail_states(path: list, start: int, end: int) -> dict[int, list]:
    """Snapshots on `path` at positions in (start, end], by offset from `start` (whole ones only)."""
    out = {}
    for node in path:
        if start < node.end <= end and node.snapshot is not None and all(
                a is not None for st in node.snapshot for a in st.arrays):
            out[node.end - start] = node.snapshot
    return out


def covered(known: tuple | None, toks: np.ndarray, states: dict) -> bool:
    """Whether a tail file of tokens / state offsets `known` has `toks` as a prefix and a state
    wherever `states` has one: writing `toks` over it would lose positions and gain nothing."""
    if known is None:
        return False
    ktoks, koffs = known
    return len(ktoks) >= len(toks) and common_prefix(ktoks, toks) == len(toks) and set(states) <= koffs


def write_tail(tier, tokens: np.ndarray, slots: np.ndarray, path: list) -> None:
    """Queue the tail of `tokens` (KV in pool `slots`, one per position) past its last full block."""
    B, n = tier.block, min(len(tokens), len(slots))
    start = n // B * B
    if n == start:
        return
    parent = tier.hashes(tokens, start // B)[-1] if start else tier.model_id
    name = tail_name(parent)
    toks = np.array(tokens[start:n], np.int32)
    states = tail_states(path, start, n) if tier.snapshot_layers else {}
    if tier.snapshot_layers and not states:
        return  # a hybrid hit must end at a kept state: a tail without one is no use
    if covered(tier.known_tails.get(name), toks, states):
        return  # what this process last wrote or read there holds all of it (a prompt end, then its answer)
    arrays = {f"l{i}.{p}": a for i in tier.layers for p, a in enumerate(tier.pool.gather(i, slots[start:n]))}
    for off, snap in states.items():
        arrays.update({f"s{i}.{k}@{off}": a for i, st in zip(tier.snapshot_layers, snap)
                       for k, a in enumerate(st.arrays)})
    mx.eval(list(arrays.values()))
    raw = {k: (a.dtype, a.shape, np.array(a.view(mx.uint8)).tobytes()) for k, a in arrays.items()}
    meta = {"model": tier.model_id, "block": name, "start": start, "tokens_n": n - start, "kind": "tail"}
    tier.store.put(name, lambda m=meta, t=toks, r=raw: encode_block(m, t, r), replace=True)
    tier.known_tails[name] = (toks, frozenset(states))
    tier.counters["disk_spilled_tails"] += 1


def read_tail(tier, tokens: np.ndarray, start: int, parent: str, past: int):
    """(usable length, {plane name: array [:, :length]}, snapshot states or None) of the tail at
    block end `start` of `tokens`, if its file checks out and gives positions beyond `past`
    (what the tree and the blocks already hold); else None."""
    name = tail_name(parent)
    known = tier.known_tails.get(name)
    if known is not None and start + common_prefix(known[0], tokens[start:]) <= past:
        return None  # what this process last put or saw there adds nothing to the tree: no read
    got = tier.store.read(name)
    if got is None:
        return None
    meta, toks, arrays = got
    n = len(toks)
    why = None
    if meta.get("model") != tier.model_id:
        why = f"written by another model ({str(meta.get('model'))[:12]}...)"
    elif (meta.get("block") != name or meta.get("start") != str(start) or meta.get("kind") != "tail"
          or not 0 < n < tier.block):
        why = "its metadata does not match its name"
    else:
        why = tier.planes_misfit(arrays, n)
    if why is None and tier.snapshot_layers:
        offsets = {int(k.split("@")[1]) for k in arrays if k.startswith("s")}
        for off in offsets:
            if any(not any(k.startswith(f"s{i}.") and k.endswith(f"@{off}") for k in arrays)
                   for i in tier.snapshot_layers):
                why = f"a recurrent layer's state at offset {off} is missing"
    if why:
        tier.store.reject(tier.store.path(name), why)
        return None
    offsets = sorted({int(k.split("@")[1]) for k in arrays if k.startswith("s")})
    tier.known_tails[name] = (toks, frozenset(offsets))
    use = common_prefix(toks, tokens[start:])
    states = None
    if tier.snapshot_layers:
        limit = min(use, len(tokens) - 1 - start)  # a hybrid hit ends before the prompt's last token
        use = next((o for o in reversed(offsets) if o <= limit), 0)
        if use:
            states = []
            for i in tier.snapshot_layers:
                names = sorted((k for k in arrays if k.startswith(f"s{i}.") and k.endswith(f"@{use}")),
                               key=lambda k: int(k.split(".")[1].split("@")[0]))
                states.append(PrefixState(PrefixKind.SNAPSHOT, start + use, start + use,
                                          tuple(arrays[k] for k in names)))
    if use == 0 or start + use <= past:
        return None
    planes = {k: a[:, :use] for k, a in arrays.items() if k.startswith("l")}
    tier.counters["disk_loaded_tails"] += 1
    return use, planes, states
