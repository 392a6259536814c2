"""Defaults for MLX's own environment variables that serving needs, set before MLX reads them.

The CUDA attention plan cache's size must be set before `mlx.core` is imported, so it lives in
graphc.contracts (contracts/mlx_env.py says why); `apply_defaults` sets it again for an
environment passed in, with the CPU's own default below.

On the CPU, prefill lanes (runtime/batched_prefill.py) evaluate two forwards on two streams in one
`mx.eval`. MLX orders an evaluation's arrays breadth first, at most `MLX_BFS_MAX_WIDTH` (20) of
them side by side; two prefill forwards are wider than that, so the tape took one lane's arrays
nearly all before the other's and the lanes ran one after the other (small-32k shape, 2 x 3
prompts of 384 tokens: 3.7 s against 4.3 s one by one). At 64 they ran together (2.3 s).
MLX reads that one when it first evaluates, so setting it when graphc.runtime is imported is in
time; a value the user set is kept.
"""

from __future__ import annotations

import os

import mlx.core as mx

from graphc.contracts.mlx_env import DEFAULTS

CPU_DEFAULTS = {"MLX_BFS_MAX_WIDTH": "64"}


def apply_defaults(environ=os.environ, cpu: bool | None = None) -> dict[str, str]:
    """Set each default the environment does not already set (the CPU's too when MLX's default
    device is the CPU); returns the ones set here."""
    if cpu is None:
        cpu = mx.default_device().type == mx.DeviceType.cpu
    wanted = {**DEFAULTS, **(CPU_DEFAULTS if cpu else {})}
    applied = {k: v for k, v in wanted.items() if k not in environ}
    environ.update(applied)
    return applied
