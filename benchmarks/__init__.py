"""`graphc bench`: graphc's Engine against mlx-lm's BatchGenerator and a plain mlx-lm loop.

Everything runs in one process, on the same model, prompts and device, so the
ratios are fair; absolute times only mean something on the machine named in the
report's environment block (see docs/performance.md).
"""

import graphc.contracts  # noqa: F401  first: it sets what MLX reads when mlx.core is imported

from .run import BenchConfig, run_bench

__all__ = ["BenchConfig", "run_bench"]
