"""Tensor-parallel serving over `mx.distributed` (docs/distributed.md).

    mlx.launch -n 2 --backend ring $(which graphc) serve --model DIR

Rank 0 runs the server and scheduler and sends each step's plan; the other ranks replay it on
their shard of the model (SPMD). `Engine.load(DIR, distributed=True)` does the same in a script.
"""

from .group import GroupFailed, launched, world
from .leader import LeaderEngine
from .load import check_shardable, engine_from_model, load_sharded, shardable_model_types

__all__ = ["GroupFailed", "LeaderEngine", "check_shardable", "engine_from_model", "launched", "load_sharded",
           "shardable_model_types", "world"]
