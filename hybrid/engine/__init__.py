"""The serving engine: one shared KV block pool, prefix caching, continuous batching."""

from .async_engine import AsyncEngine, EngineClosedError
from .engine import Engine
from .request import GenerationParams, RequestOutput

__all__ = ["Engine", "AsyncEngine", "EngineClosedError", "GenerationParams", "RequestOutput"]
