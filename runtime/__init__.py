"""graphc runtime: the engine, cache policies, scheduler, sampling and server."""

import graphc.contracts  # noqa: F401  first: it sets what MLX reads when mlx.core is imported

from .mlx_env import apply_defaults

apply_defaults()  # before any MLX GPU op reads them (runtime/mlx_env.py says why)


from .async_engine import AsyncEngine
from .config import EngineConfig
from .engine import Engine
from .params import SamplingParams
from .request import GenerationResult, RequestOutput

__all__ = ["AsyncEngine", "Engine", "EngineConfig", "GenerationResult", "RequestOutput", "SamplingParams"]
