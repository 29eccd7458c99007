"""CUDA backend registration.

The CUDA kernels (NVRTC-compiled paged attention and layer ops) are not part of this release yet;
this module reports exactly why the backend cannot serve, so that asking for ``cuda:N`` fails with
a clear reason instead of an obscure import error.  It never initialises the driver.
"""

import importlib.util

from ..registry import BackendUnavailable


def availability() -> "tuple[bool, str]":
    """(ok, reason) without touching the CUDA driver."""
    if importlib.util.find_spec("cuda") is None:
        return False, "cuda-python is not installed (pip install 'hybrid[cuda]')"
    return False, "this build of hybrid has no CUDA kernels yet (the CUDA backend is a later release)"


def register(registrar) -> None:
    ok, reason = availability()
    if not ok:
        raise BackendUnavailable(reason)
