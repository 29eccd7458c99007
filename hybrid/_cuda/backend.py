"""CUDA backend registration: the launch layer's operations, for every ``cuda:N`` placement.

Imported by the registry only when a ``cuda`` placement is asked for, never at ``import hybrid``.
When it cannot serve it says why: cuda-python missing, no driver, no device.
"""

import importlib.util

from ..registry import BackendUnavailable


def availability() -> "tuple[bool, str]":
    """(ok, reason) for running hybrid's layers on CUDA."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return False, "cuda-python is not installed (pip install 'hybrid[cuda]')"
    from .driver import availability as device_availability

    return device_availability()


def kv_layer_storage(placement, num_kv_heads, head_dim, block_size, dtype):
    from .kv_blocks import DeviceLayerStorage

    return DeviceLayerStorage(placement, num_kv_heads, head_dim, block_size, dtype)


def is_device_array(obj) -> bool:
    from .arrays import DeviceArray

    return isinstance(obj, DeviceArray)


def check_attention(head_dim: int, group: int) -> None:
    """Raise ValueError when no paged-attention variant serves this head size / GQA group."""
    from . import variants

    variants.paged_attention(head_dim, group, False, False)


def linear(x, weight, bias, out, role="auto") -> None:
    """x @ weight.T (+ bias): one kernel serves prompt and decode rows alike, so the row role
    (hybrid/kernel_role.py) picks nothing here."""
    from . import launch

    launch.linear(x, weight, bias, out)


def register(registrar) -> None:
    ok, reason = availability()
    if not ok:
        raise BackendUnavailable(reason)
    from . import launch

    registrar.op("linear", linear)
    for name in ("rmsnorm", "rope", "swiglu", "add", "copy", "linear_split3",
                 "linear_swiglu", "linear_residual", "kv_append_batch", "paged_attention",
                 "to_device"):
        registrar.op(name, getattr(launch, name))
    registrar.op("empty", launch.empty_array)
    registrar.op("kv_layer_storage", kv_layer_storage)
    registrar.op("check_attention", check_attention)
