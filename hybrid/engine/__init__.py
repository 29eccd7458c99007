"""The serving engine: one shared KV block pool, prefix caching, continuous batching."""

from .async_engine import AsyncEngine, EngineClosedError, SlowConsumerError
from .engine import Engine
from .output import TextOutput
from .params import GenerationParams
from .request import RequestOutput
from .sampling import Sampler

__all__ = ["Engine", "AsyncEngine", "EngineClosedError", "SlowConsumerError", "GenerationParams",
           "RequestOutput", "Sampler", "TextOutput"]
