"""Reusable activation buffers (the seed's ``ctx.Scratch``): no allocation on the steady decode path."""

from __future__ import annotations

import math

import numpy as np

from .placement import CPU, Placement


def aligned_empty(shape, dtype, align: int = 4096) -> np.ndarray:
    """np.empty whose data starts on an `align`-byte boundary.  NumPy's own allocations are
    16-byte aligned, and data 16 bytes past a cache line splits every 64-byte vector load of it
    in two.  The KV pool's chunks and Scratch's activation buffers take it."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes].view(dtype).reshape(shape)


class Scratch:
    """Named buffers that grow to the largest size asked for and are then reused.

    ``get(name, shape)`` returns a C-contiguous view of the named buffer with that shape; the
    contents are unspecified.  A later ``get`` of the same name may return the same memory, so a
    caller keeps a buffer only until its next ``get`` of that name.  One Scratch may serve many
    layers that run one after another; give concurrent callers their own.  Buffers for a
    ``cuda:N`` placement are device arrays from that backend (its per-device arena).
    """

    def __init__(self):
        self._buffers: dict = {}

    def get(self, name: str, shape: tuple, dtype=np.float32, placement=CPU):
        size = math.prod(shape)
        placement = Placement.parse(placement)
        key = (name, np.dtype(dtype), placement)
        buf = self._buffers.get(key)
        if buf is None or buf.size < size:
            if placement.is_cpu:
                buf = aligned_empty((max(size, 1),), dtype, 64)
            else:
                from . import registry

                buf = registry.lookup("empty", placement)(placement, max(size, 1), dtype)
            self._buffers[key] = buf
        return buf[:size].reshape(shape)

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
