"""The world group and the few collectives graphc itself sends over it (besides the model's own).

Everything goes through `mx.distributed` (ring, MPI, JACCL or NCCL, picked by `mlx.launch`):
graphc writes no transport. Rank 0's small messages (step plans, the load handshake) are
broadcasts built from `all_sum`: rank 0 contributes the payload, every other rank zeros,
so the sum is the payload on every rank, bit for bit.
"""

from __future__ import annotations

import logging
import os
import zlib

import mlx.core as mx
import numpy as np

from ..engine_closed import EngineClosed

# Environment variables a distributed launcher sets on every rank: mlx.launch (ring, nccl,
# jaccl) sets MLX_RANK; mpirun sets OMPI_COMM_WORLD_SIZE / PMI_SIZE.
LAUNCH_ENV = ("MLX_RANK", "MLX_WORLD_SIZE", "MLX_HOSTFILE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class GroupFailed(EngineClosed):
    """The distributed group can no longer run steps: a rank died, hung, or the ranks diverged.
    An EngineClosed, so the server answers 503 instead of queueing work that cannot run."""


def launched() -> bool:
    """True when a distributed launcher (mlx.launch, mpirun) started this process."""
    return any(os.environ.get(k) for k in LAUNCH_ENV)


def direct_launches_for_nccl() -> bool:
    """Under an NCCL launch, run MLX's CUDA backend without CUDA graphs, unless the user chose
    (MLX_USE_CUDA_GRAPHS set either way). Returns whether this call turned them off.

    Why: MLX captures every NCCL collective into the CUDA graph it is building; such graphs are
    not updatable, so each one is re-instantiated when it is launched. On the H200 pair
    (benchmarks/probes/tp_h200x2.sh probe) that made each of a decode step's 64 collectives cost 37-71 us inside
    the step instead of 9-18 us, and an 8B TP=2 decode step 1.2-1.4x slower. MLX reads the
    variable once, at its first GPU op, so this must run before any: `world()` calls it, and the
    entry points call `world()` before they build the model."""
    if "MLX_USE_CUDA_GRAPHS" in os.environ or not os.environ.get("NCCL_HOST_IP"):
        return False
    os.environ["MLX_USE_CUDA_GRAPHS"] = "0"
    return True


def world() -> mx.distributed.Group:
    """The world group of this launch (a group of one when nothing launched us)."""
    if direct_launches_for_nccl():
        logging.getLogger("graphc.distributed").info(
            "NCCL launch: MLX_USE_CUDA_GRAPHS=0 (collectives inside CUDA graphs cost 3-4x more; set "
            "MLX_USE_CUDA_GRAPHS=1 to keep them)")
    if not mx.distributed.is_available():
        raise GroupFailed("this MLX build has no distributed backend; install mlx with the ring/MPI/NCCL backends")
    return mx.distributed.init()


def _sum(group, a: mx.array) -> np.ndarray:
    out = mx.distributed.all_sum(a, group=group)
    mx.eval(out)
    return np.array(out)


def broadcast_ints(group, values, n: int) -> list[int]:
    """Rank 0's `n` int32 values on every rank (`values` is ignored off rank 0)."""
    if group.rank() == 0:
        v = np.zeros(n, np.int32)
        v[: len(values)] = values
        a = mx.array(v)
    else:
        a = mx.zeros((n,), mx.int32)
    return [int(x) for x in _sum(group, a)]


def broadcast_bytes(group, data: bytes | None, n: int) -> bytes:
    """Rank 0's `n` bytes on every rank. They travel as int32 words (zero-padded): every backend
    sums int32, not every one sums uint8; the sum cannot overflow, the others add zeros."""
    words = (n + 3) // 4
    if group.rank() == 0:
        a = mx.array(np.frombuffer(data.ljust(4 * words, b"\0"), np.int32))
    else:
        a = mx.zeros((words,), mx.int32)
    return _sum(group, a).astype(np.int32).tobytes()[:n]


def gather_ints(group, values: list[int]) -> list[list[int]]:
    """Every rank's non-negative `values` (same count everywhere, each < 2**62), indexed by rank.

    Each value travels as two 31-bit int32 words: not every backend sums int64."""
    n, k = group.size(), len(values)
    buf = np.zeros((n, k, 2), np.int32)
    for i, v in enumerate(values):
        if not 0 <= v < 1 << 62:
            raise ValueError(f"gather_ints carries values in [0, 2**62), got {v}")
        buf[group.rank(), i] = (v >> 31, v & 0x7FFFFFFF)
    out = _sum(group, mx.array(buf)).astype(np.int64)
    return [[int(hi) << 31 | int(lo) for hi, lo in row] for row in out]


def crc(data: bytes) -> int:
    """A 31-bit checksum (fits an int32 slot of a message)."""
    return zlib.crc32(data) & 0x7FFFFFFF


def is_group_error(e: BaseException) -> bool:
    """An error from a collective (MLX's distributed backends prefix theirs with their name)."""
    return isinstance(e, RuntimeError) and any(t in str(e) for t in ("[ring]", "[nccl]", "[mpi]", "[jaccl]"))
