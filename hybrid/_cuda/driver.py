"""The CUDA driver through cuda-python, initialised lazily; one checker for every call.

Nothing here runs at ``import hybrid``: the registry imports the CUDA backend only when a
``cuda:N`` placement asks for it, and ``availability()`` is the one question it asks first.
"""

from __future__ import annotations

import threading

from .compiler import HybridCudaError, bindings

_lock = threading.Lock()
_state: dict = {}


def api():
    """cuda-python's driver API module (cuda.bindings.driver)."""
    return bindings("driver")


def check(result, what: str = "CUDA call"):
    """Raise HybridCudaError('CUDA_ERROR_...: description') unless the driver call succeeded;
    returns the call's values (cuda-python returns (err, *values))."""
    driver = api()
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        desc = driver.cuGetErrorString(err)
        text = desc[1].decode() if desc[0] == driver.CUresult.CUDA_SUCCESS and desc[1] else ""
        raise HybridCudaError(f"{err.name}: {text or 'no description'} ({what})")
    if isinstance(result, tuple):
        values = result[1:]
        return values[0] if len(values) == 1 else values
    return None


def init() -> int:
    """cuInit once; returns the number of devices.  Raises HybridCudaError saying why not."""
    with _lock:
        if "devices" in _state:
            return _state["devices"]
        if "error" in _state:
            raise HybridCudaError(_state["error"])
        try:
            driver = api()
            try:
                check(driver.cuInit(0), "cuInit")
            except HybridCudaError:
                raise
            except Exception as exc:  # no driver library: cuda-python raises its own error types
                raise HybridCudaError(f"no NVIDIA driver: {exc}") from None
            n = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
            if n == 0:
                raise HybridCudaError("CUDA_ERROR_NO_DEVICE: no CUDA device is visible")
        except HybridCudaError as exc:
            _state["error"] = str(exc)
            raise
        _state["devices"] = n
        return n


def availability() -> "tuple[bool, str]":
    """(ok, reason): whether a CUDA device can be used, without raising."""
    try:
        n = init()
    except HybridCudaError as exc:
        return False, str(exc)
    return True, f"{n} CUDA device(s)"


def compute_capability(index: int) -> str:
    """'sm_XY' of device ``index``."""
    driver = api()
    init()
    dev = check(driver.cuDeviceGet(index), f"cuDeviceGet({index})")
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return f"sm_{major}{minor}"
