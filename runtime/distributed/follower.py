"""Ranks other than 0: receive each step plan from rank 0, replay it on the local engine, repeat.

The follower's Engine is an ordinary one over its shard of the model; its outputs are thrown
away (rank 0 answers the clients). It ends with exit code 0 when rank 0 sends SHUTDOWN, and
with 1 — after saying why on stderr — when rank 0 disappears, goes silent past the timeout,
or the two engines stop producing the same tokens.
"""

from __future__ import annotations

import signal
import sys
import threading

from .group import GroupFailed, broadcast_bytes, broadcast_ints, is_group_error
from .plan import HEADER_WORDS, IDLE, NO_STEP_YET, SHUTDOWN, Plan, decode_params, error_digest, step_digest
from .watchdog import EXIT_GROUP_FAILED, Watchdog


def follow(engine, group, watchdog: Watchdog, *, timeout: float) -> int:
    """Run rank 0's steps until it shuts the group down; the process exit code."""
    rank = group.rank()
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C in a terminal reaches every rank of the launch: rank 0 decides (a clean shutdown
        # sends the plan that ends this loop with 0); a follower interrupted mid-collective would
        # only leave rank 0 waiting on it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _loop(engine, group, watchdog, timeout)
    except GroupFailed as e:
        sys.stderr.write(f"graphc rank {rank}: {e} (exit {EXIT_GROUP_FAILED})\n")
        sys.stderr.flush()
        return EXIT_GROUP_FAILED
    return 0


def _loop(engine, group, watchdog: Watchdog, timeout: float) -> None:
    rank = group.rank()
    seq, last = 0, NO_STEP_YET
    while True:
        try:
            with watchdog.armed(f"waiting for rank 0's plan {seq}", timeout):
                header = broadcast_ints(group, None, HEADER_WORDS)
                body = broadcast_bytes(group, None, header[4]) if header[4] > 0 else b""
            plan = Plan.parse(header, body)
        except (RuntimeError, ValueError) as e:
            raise GroupFailed(f"lost rank 0 while waiting for plan {seq}: {e}") from None
        if plan.seq != seq:
            raise GroupFailed(f"expected plan {seq} from rank 0, got {plan.seq}: the ranks are out of step")
        if plan.last_digest != last:
            raise GroupFailed(
                f"after plan {seq - 1} rank {rank} produced different tokens than rank 0 (digest {last} vs "
                f"{plan.last_digest}): the ranks diverged, so their next collectives would not match")
        seq += 1
        if plan.kind == SHUTDOWN:
            return
        if plan.kind == IDLE:
            continue
        for ev in plan.events:
            _apply(engine, ev, seq - 1)
        try:
            with watchdog.armed(f"rank {rank}: step {seq - 1}", timeout):
                last = step_digest(engine.step())
        except GroupFailed:
            raise
        except Exception as e:  # rank 0 hits the same one (it is deterministic) and says so in its digest
            last = error_digest(e)
            if is_group_error(e):
                raise GroupFailed(f"step {seq - 1} failed in a collective: {e}") from None


def _apply(engine, ev: list, seq: int) -> None:
    if ev[0] == "add":
        _, rid, ids, params = ev
        try:
            engine.add_request(ids, decode_params(params), rid)
        except ValueError as e:  # rank 0 accepted it: this rank differs (another model, tokenizer, ...)
            raise GroupFailed(f"request {rid} of plan {seq} was accepted by rank 0 but not here: {e}") from None
    elif ev[0] == "abort":
        engine.abort(ev[1])
    else:
        raise GroupFailed(f"unknown event {ev[0]!r} in plan {seq}: rank 0 runs another graphc version")
