"""The speculator's defaults by device: whether verify is pipelined, gated, and how many verify
positions one forward may hold. Each says why it is what it is (docs/speculative.md)."""

from __future__ import annotations

import mlx.core as mx

def default_pipeline() -> bool:
    """Pipelined verify is opt-in (`spec_pipeline=True`). It hides the device's run of a verify
    behind the host's build of the next one, so it pays only where that run is long; on the
    H200 with SmolLM2-135M a verify forward's device time was 0.1-0.5 ms of a 5.5-7 ms
    host-bound step (benchmarks/probes/verify_cost.py), and pipelined measured 0.73-1.21x
    unpipelined: a discarded guess costs a whole host build. On the CPU the forward
    itself is the cost, so a discarded guess is a wasted step."""
    return False


def default_adaptive() -> bool:
    """The measured gate (runtime/measured_gate.py) is on by default everywhere: what wins
    depends on the device, the model and the traffic, which it measures and no default knows."""
    return True


def default_max_tokens() -> int:
    """Verify positions per forward by device. GPU: a forward over up to ~64 rows costs about
    what one over a few rows does (weight reads dominate). CPU: compute-bound — measured with
    SmolLM2-135M (Q4_1, 2 cores), 2 positions cost ~1.04x one, 5 cost ~3.5x — so a verify
    forward is kept to 4 positions (docs/speculative.md)."""
    return 64 if mx.default_device() == mx.gpu else 4
