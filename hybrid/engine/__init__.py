"""The serving engine: one shared KV block pool, prefix caching, continuous batching."""

from .engine import Engine
from .request import GenerationParams, RequestOutput

__all__ = ["Engine", "GenerationParams", "RequestOutput"]
