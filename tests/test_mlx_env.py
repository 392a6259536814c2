"""MLX environment defaults graphc sets for serving (runtime/mlx_env.py)."""

from __future__ import annotations

import os

from graphc.runtime import mlx_env


def test_mlx_plan_cache_default_is_set_and_a_user_value_kept():
    """graphc raises MLX's cuDNN attention plan cache (serving meets more shapes than its default
    holds) unless the user set it; importing the runtime applied it to this process."""
    env = {"MLX_CUDA_SDPA_CACHE_SIZE": "32"}
    assert mlx_env.apply_defaults(env) == {} and env["MLX_CUDA_SDPA_CACHE_SIZE"] == "32"
    env = {}
    assert mlx_env.apply_defaults(env) == mlx_env.DEFAULTS == env
    assert "MLX_CUDA_SDPA_CACHE_SIZE" in os.environ
