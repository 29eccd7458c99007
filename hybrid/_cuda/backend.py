"""CUDA backend registration.

The kernel sources (``kernels/*.cu``) and their NVRTC compilation exist; the launch layer
(device memory, scratch arena, GPU KV cache, kernel launches) is not written yet.  So this backend
reports why it cannot serve: no cuda-python, no driver, no device, or, with all of those present,
that the launch layer is missing.  It never initialises the driver at ``import hybrid``.
"""

import importlib.util

from ..registry import BackendUnavailable


def availability() -> "tuple[bool, str]":
    """(ok, reason) for running hybrid's layers on CUDA."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return False, "cuda-python is not installed (pip install 'hybrid[cuda]')"
    from .driver import availability as device_availability

    ok, reason = device_availability()
    if not ok:
        return False, reason
    return False, (f"{reason} found, but this build's CUDA launch layer is not implemented yet "
                   f"(kernels compile; launches come with the CUDA backend issue)")


def register(registrar) -> None:
    ok, reason = availability()
    if not ok:
        raise BackendUnavailable(reason)
