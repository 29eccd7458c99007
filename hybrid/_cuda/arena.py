"""Per-device scratch arena (the seed's ``ctx.Scratch``): named device buffers that grow to the
largest size asked for and are then reused, so the steady decode path allocates nothing.

``get(name, shape)`` returns a view whose contents are unspecified and that stays valid until the
next ``get`` of the same name.  Reuse needs no waiting: every copy and launch goes to the
device's one stream, so a rewrite is ordered after the kernels that read the old contents.  A
grown buffer's old memory is freed (after a synchronise) once no view refers to it.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .arrays import DeviceArray, empty

_arenas: dict = {}
_lock = threading.Lock()


class Arena:
    def __init__(self, index: int):
        self.index = index
        self._buffers: dict = {}

    def get(self, name: str, shape, dtype=np.float32) -> DeviceArray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        key = (name, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.size < size:
            buf = empty(self.index, max(size, 1, 0 if buf is None else 2 * buf.size), dtype)
            self._buffers[key] = buf
        return buf[:size].reshape(shape)

    def upload(self, name: str, host, dtype=None) -> DeviceArray:
        """``host`` copied into the named buffer (the copy is queued on the device's stream)."""
        host = np.ascontiguousarray(host, dtype=dtype)
        return self.get(name, host.shape, host.dtype).copy_from_host(host)

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())


def arena(index: int) -> Arena:
    """The backend's own arena on GPU ``index`` (positions, tables, split-K partials)."""
    a = _arenas.get(index)
    if a is None:
        with _lock:
            a = _arenas.setdefault(index, Arena(index))
    return a
