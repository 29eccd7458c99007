"""hybrid: Llama/Qwen-style decoder layers over a paged KV cache, fast on plain CPUs.

    import hybrid, numpy as np
    cfg = hybrid.DecoderConfig(hidden_size=576, num_heads=9, num_kv_heads=3)
    layer = hybrid.DecoderLayer(cfg, weights, index=0, placement="cpu")
    cache = hybrid.PagedKVCache(num_layers=1, num_kv_heads=3, head_dim=64)
    out = layer.forward(hidden, positions, cache); cache.commit(len(positions))

``import hybrid`` loads no optional package and never touches CUDA.
"""

import os as _os

# OpenBLAS threads spin for ~2**28 cycles after each call by default, taking the cores from the
# OpenMP kernels that run next (see hybrid/_cpu/__init__.py); read when OpenBLAS loads, so this
# only helps when hybrid is imported before NumPy.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from . import ops, reference  # noqa: E402
from .config import DecoderConfig, LayerWeights
from .kvcache import AppendResult, CacheCapacityError, PagedKVCache
from .kvpool import KVBlockPool, PoolExhaustedError
from .engine import AsyncEngine, Engine, GenerationParams, RequestOutput
from .layer import DecoderLayer
from .placement import Placement, placement_of, to_device
from .profile import profiling
from .quant import FORMATS, QuantizedTensor, WeightFormat, dequantize, quantize
from .registry import BackendUnavailable, NoBackendError, backend_status
from .scratch import Scratch
from .step import StepBatch
from .threads import get_num_threads, set_num_threads

__version__ = "0.1.0"


def load_model(path=None, **kwargs):
    """Load a model (see hybrid.models.load_model); imports the model packages only when called."""
    from .models import load_model as _load

    return _load(path, **kwargs)


__all__ = [
    "KVBlockPool", "PoolExhaustedError", "Engine", "AsyncEngine", "GenerationParams", "RequestOutput",
    "AppendResult", "BackendUnavailable", "FORMATS", "QuantizedTensor", "WeightFormat",
    "dequantize", "quantize", "CacheCapacityError", "DecoderConfig", "DecoderLayer",
    "LayerWeights", "NoBackendError", "PagedKVCache", "Placement", "Scratch", "StepBatch", "backend_status",
    "get_num_threads", "load_model", "ops", "placement_of", "profiling", "reference", "set_num_threads",
    "to_device",
]
