"""MLX environment defaults graphc sets for serving (runtime/mlx_env.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from graphc.runtime import mlx_env


def test_mlx_plan_cache_default_is_set_and_a_user_value_kept():
    """graphc raises MLX's cuDNN attention plan cache (serving meets more shapes than its default
    holds) unless the user set it; importing the runtime applied it to this process."""
    env = {"MLX_CUDA_SDPA_CACHE_SIZE": "32"}
    assert mlx_env.apply_defaults(env, cpu=False) == {} and env["MLX_CUDA_SDPA_CACHE_SIZE"] == "32"
    env = {}
    assert mlx_env.apply_defaults(env, cpu=False) == mlx_env.DEFAULTS == env
    assert "MLX_CUDA_SDPA_CACHE_SIZE" in os.environ


def test_the_cpu_gets_a_wider_evaluation_order_for_prefill_lanes():
    """On the CPU, MLX's breadth-first tape is widened so that two prefill lanes' forwards run side
    by side (runtime/batched_prefill.py); a user's value is kept, and a GPU keeps MLX's."""
    env = {}
    assert mlx_env.apply_defaults(env, cpu=True) == {**mlx_env.DEFAULTS, "MLX_BFS_MAX_WIDTH": "64"}
    env = {"MLX_BFS_MAX_WIDTH": "20"}
    assert "MLX_BFS_MAX_WIDTH" not in mlx_env.apply_defaults(env, cpu=True) and env["MLX_BFS_MAX_WIDTH"] == "20"
    assert os.environ.get("MLX_BFS_MAX_WIDTH") == "64"  # this process: the CPU, nothing set before graphc


def test_the_plan_cache_size_is_set_before_mlx_core_is_imported():
    """MLX sizes the importing thread's plan cache when mlx.core is imported, so the default must be
    in the environment by then, whichever graphc entry point comes first (contracts/mlx_env.py)."""
    probe = """
import importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "mlx.core" and not seen:
            seen.append(os.environ.get("MLX_CUDA_SDPA_CACHE_SIZE"))
        return None
sys.meta_path.insert(0, Watch())
import importlib
importlib.import_module(sys.argv[1])
print(seen[0] if seen else "mlx.core not imported")
"""
    env = {k: v for k, v in os.environ.items() if k != "MLX_CUDA_SDPA_CACHE_SIZE"}
    for entry in ("graphc.cli.main", "graphc.runtime", "graphc.compiler.compile", "graphc.contracts.step",
                  "graphc.benchmarks.step_timeline"):
        out = subprocess.run([sys.executable, "-c", probe, entry], env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == "2048", (entry, out)
