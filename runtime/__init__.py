"""graphc runtime: the engine, cache policies, scheduler, sampling and server."""

from .engine import Engine
from .params import SamplingParams
from .request import GenerationResult, RequestOutput

__all__ = ["Engine", "GenerationResult", "RequestOutput", "SamplingParams"]
