"""DeviceArray: a C-contiguous array in GPU memory, the activations and weights of cuda layers.

It is deliberately small: shape, dtype, a device pointer and the buffer that owns the memory.
Views (``reshape``, a row range ``a[i:j]``, ``a[:n]`` of a flat array) share that buffer.
Moving data is explicit: ``empty`` / ``from_host`` / ``to_host``; NumPy refuses to convert one
silently (``np.asarray(device_array)`` raises and says to call ``to_host``).
"""

from __future__ import annotations

import math

import numpy as np

from ..placement import Placement
from .device import Device, device


class DeviceArray:
    __slots__ = ("device", "shape", "dtype", "ptr", "owner")

    def __init__(self, dev: Device, shape: tuple, dtype, ptr: int, owner):
        self.device = dev
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ptr = int(ptr)
        self.owner = owner  # the DeviceBuffer that keeps the memory alive

    # -- description ---------------------------------------------------------------------------
    @property
    def placement(self) -> Placement:
        return Placement("cuda", self.device.index)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype.name}, device={self.placement})"

    def __array__(self, *args, **kwargs):
        raise TypeError(f"this array lives on {self.placement}; call .to_host() (or "
                        f"hybrid.to_device(a, 'cpu')) to copy it to host memory")

    # -- views ---------------------------------------------------------------------------------
    def reshape(self, *shape) -> "DeviceArray":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // max(known, 1) if s == -1 else s for s in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape a device array of shape {self.shape} to {shape}")
        return DeviceArray(self.device, shape, self.dtype, self.ptr, self.owner)

    def __getitem__(self, key) -> "DeviceArray":
        """A contiguous range of the first axis (``a[i:j]``); other indexing is not supported."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("device arrays support only a contiguous first-axis slice a[i:j]")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(start, stop)
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        return DeviceArray(self.device, (stop - start,) + self.shape[1:], self.dtype,
                           self.ptr + start * row, self.owner)

    # -- copies --------------------------------------------------------------------------------
    def to_host(self, out: "np.ndarray | None" = None) -> np.ndarray:
        """A host copy (into ``out`` when given: C-contiguous, same shape and dtype)."""
        if out is None:
            out = np.empty(self.shape, dtype=self.dtype)
        elif (not isinstance(out, np.ndarray) or out.shape != self.shape or out.dtype != self.dtype
              or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writeable C-contiguous {self.dtype.name} array of "
                             f"shape {self.shape}")
        if self.size:
            self.device.copy_d2h(out, self.ptr)
        return out

    def copy_from_host(self, host: np.ndarray) -> "DeviceArray":
        """Overwrite with ``host`` (same shape, converted to this dtype)."""
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.shape != self.shape:
            raise ValueError(f"copying {host.shape} into a device array of shape {self.shape}")
        if self.size:
            self.device.copy_h2d(self.ptr, host)
        return self

    def copy_from(self, src: "DeviceArray") -> "DeviceArray":
        """Overwrite with another device array of the same shape and dtype (device to device,
        through the host when they are on different GPUs)."""
        if src.shape != self.shape or src.dtype != self.dtype:
            raise ValueError(f"copying {src.shape} {src.dtype} into {self.shape} {self.dtype}")
        if src.device is self.device:
            if self.size:
                self.device.copy_d2d(self.ptr, src.ptr, self.nbytes)
        else:
            self.copy_from_host(src.to_host())
        return self


def empty(index: int, shape, dtype=np.float32) -> DeviceArray:
    """Uninitialised device memory for an array of ``shape`` on GPU ``index``."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    dev = device(index)
    buf = dev.alloc(math.prod(shape) * np.dtype(dtype).itemsize)
    return DeviceArray(dev, shape, dtype, buf.ptr, buf)


def from_host(index: int, host, dtype=None) -> DeviceArray:
    """A device copy of a host array (converted to ``dtype`` when given)."""
    host = np.ascontiguousarray(host, dtype=dtype)
    arr = empty(index, host.shape, host.dtype)
    return arr.copy_from_host(host)
