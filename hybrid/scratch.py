"""Reusable activation buffers (the seed's ``ctx.Scratch``): no allocation on the steady decode path."""

from __future__ import annotations

import math

import numpy as np


class Scratch:
    """Named float32 buffers that grow to the largest size asked for and are then reused.

    ``get(name, shape)`` returns a C-contiguous view of the named buffer with that shape; the
    contents are unspecified.  A later ``get`` of the same name may return the same memory, so a
    caller keeps a buffer only until its next ``get`` of that name.  One Scratch may serve many
    layers that run one after another; give concurrent callers their own.
    """

    def __init__(self):
        self._buffers: dict = {}

    def get(self, name: str, shape: tuple, dtype=np.float32) -> np.ndarray:
        size = math.prod(shape)
        key = (name, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < size:
            buf = np.empty(max(size, 1), dtype=dtype)
            self._buffers[key] = buf
        return buf[:size].reshape(shape)

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
