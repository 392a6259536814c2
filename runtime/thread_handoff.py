"""Handing an engine built on one thread to another: evaluate what the build left lazy, first.

MLX gives every thread its own streams, and an op runs on the stream of the thread that made it:
a lazy array can be evaluated only on that thread ("There is no Stream(gpu, N) in current
thread" anywhere else). An engine built on one thread (`Engine.load` on the main thread, a
server's loader thread) and stepped on another (AsyncEngine's engine thread) must therefore hold
no lazy array from its build; which ones a build leaves depends on the device and on what the
load skipped (a restart skips the self-check that evaluated them on a fresh start), so instead of
trusting every path, `settle` finds them all and evaluates them on the building thread.

`AsyncEngine.load(build)` avoids the handoff altogether (it builds on the engine thread).
"""

from __future__ import annotations

import collections

import mlx.core as mx

# Objects of these packages are walked into; anything else (tokenizers, numpy, the standard
# library's threads and queues) holds no MLX array of the engine's and is left alone.
_WALKED = ("graphc.", "mlx_lm.", "mlx.nn.")
_MAX_OBJECTS = 500_000  # a bound on the walk, far above an engine's own object graph


def arrays_of(root) -> list[mx.array]:
    """Every mx.array reachable from `root` through attributes, dicts, lists, tuples and sets of
    graphc, mlx-lm and mlx.nn objects (an mlx.nn.Module is a dict of its parameters)."""
    seen, found = set(), []
    todo = collections.deque([root])
    while todo and len(seen) < _MAX_OBJECTS:
        obj = todo.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, mx.array):
            found.append(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
            if not type(obj).__module__.startswith(_WALKED):  # a Module's attributes live in its __dict__ too
                continue
            todo.extend(vars(obj).values())
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            todo.extend(obj)
        elif type(obj).__module__.startswith(_WALKED):
            if hasattr(obj, "__dict__"):
                todo.extend(vars(obj).values())
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if isinstance(slot, str) and hasattr(obj, slot):
                        todo.append(getattr(obj, slot))
    return found


def settle(engine) -> int:
    """Evaluate every array `engine` holds, on the calling thread (the one that built it);
    the number of arrays found. Evaluated arrays cost nothing, so a settled engine costs a walk."""
    found = arrays_of(engine)
    mx.eval(found)
    return len(found)
