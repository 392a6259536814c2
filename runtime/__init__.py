"""graphc runtime: the engine, cache policies, scheduler, sampling and server."""

from .mlx_env import apply_defaults

apply_defaults()  # before any MLX GPU op reads them (runtime/mlx_env.py says why)


from .async_engine import AsyncEngine
from .config import EngineConfig
from .engine import Engine
from .params import SamplingParams
from .request import GenerationResult, RequestOutput

__all__ = ["AsyncEngine", "Engine", "EngineConfig", "GenerationResult", "RequestOutput", "SamplingParams"]
