"""One GPU through cuda-python's driver API: its primary context, one stream, memory, modules and
kernel launches.

    dev = device(0)                               # cuda:0, created once per process
    buf = dev.alloc(64)                           # DeviceBuffer; buf.free() or the finalizer
    fn = dev.kernel(variants.elementwise(), "hybrid_add_f32")
    dev.launch(fn, grid, block, [a, b, out, n])   # packed by the kernel's declared signature

Every launch and copy goes to the device's one stream, in order, so a buffer may be rewritten by
the next copy or kernel without waiting: the stream orders it after the work that read it.
Kernel arguments are packed by each kernel's declared C signature (``signatures.py``), which a
CI test checks against the PTX that NVRTC emits, so an argument is never guessed.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from . import driver as drv
from .compiler import HybridCudaError, KernelSpec, compile_spec
from .signatures import pack

_devices: dict = {}
_devices_lock = threading.Lock()
_current = threading.local()  # the context this thread made current last


def device(index: int) -> "Device":
    """The Device of GPU ``index`` (created on first use, shared afterwards)."""
    dev = _devices.get(index)
    if dev is None:
        with _devices_lock:
            dev = _devices.get(index)
            if dev is None:
                dev = Device(index)
                _devices[index] = dev
    dev.make_current()
    return dev


def _free(context, ptr: int) -> None:
    """Free device memory once the work queued on it has finished (finalizers may run on any
    thread, and at interpreter exit the driver may already be gone)."""
    try:
        from cuda.bindings import driver

        driver.cuCtxSetCurrent(context)
        _current.context = None
        driver.cuCtxSynchronize()
        driver.cuMemFree(ptr)
    except Exception:
        pass


class DeviceBuffer:
    """``nbytes`` of device memory, freed by ``free()`` or, at the latest, by its finalizer."""

    def __init__(self, dev: "Device", nbytes: int):
        d = drv.api()
        self.device = dev
        self.nbytes = int(nbytes)
        self.ptr = int(drv.check(d.cuMemAlloc(max(self.nbytes, 1)), f"cuMemAlloc({nbytes})"))
        self._finalizer = weakref.finalize(self, _free, dev.context, self.ptr)

    def free(self) -> None:
        if self._finalizer.alive:
            self._finalizer()

    def __int__(self) -> int:
        return self.ptr


class Device:
    """The primary context and one stream of GPU ``index``; compiled kernels cached per (spec,
    name).  Use ``device(index)`` rather than constructing one."""

    def __init__(self, index: int = 0):
        d = drv.api()
        n = drv.init()
        if not 0 <= index < n:
            raise HybridCudaError(f"CUDA_ERROR_INVALID_DEVICE: cuda:{index} requested, "
                                  f"{n} device(s) visible")
        self.index = index
        self.handle = drv.check(d.cuDeviceGet(index), "cuDeviceGet")
        self.context = drv.check(d.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self.make_current()
        self.stream = drv.check(d.cuStreamCreate(0), "cuStreamCreate")
        self.arch = drv.compute_capability(index)
        attr = d.CUdevice_attribute
        self.sm_count = int(drv.check(d.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.handle)))
        self.name = drv.check(d.cuDeviceGetName(64, self.handle)).split(b"\0")[0].decode()
        self._modules: dict = {}
        self._functions: dict = {}

    def make_current(self) -> None:
        """Make this device's context current on the calling thread (a no-op when it is)."""
        if getattr(_current, "context", None) is not self.context:
            drv.check(drv.api().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            _current.context = self.context

    # -- memory ------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        self.make_current()
        return DeviceBuffer(self, nbytes)

    def copy_h2d(self, dst_ptr: int, host: np.ndarray) -> None:
        """Queue a copy of ``host`` (C-contiguous) to ``dst_ptr``.  The driver copies pageable
        host memory into its staging area before returning, so ``host`` may change afterwards."""
        self.make_current()
        drv.check(drv.api().cuMemcpyHtoDAsync(dst_ptr, host.ctypes.data, host.nbytes,
                                                  self.stream), "cuMemcpyHtoDAsync")

    def copy_d2h(self, host: np.ndarray, src_ptr: int) -> np.ndarray:
        """Copy into ``host`` (C-contiguous, writeable) once the queued work is done."""
        self.make_current()
        d = drv.api()
        drv.check(d.cuMemcpyDtoHAsync(host.ctypes.data, src_ptr, host.nbytes, self.stream),
                  "cuMemcpyDtoHAsync")
        self.synchronize()
        return host

    def copy_d2d(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        self.make_current()
        drv.check(drv.api().cuMemcpyDtoDAsync(dst_ptr, src_ptr, nbytes, self.stream),
                  "cuMemcpyDtoDAsync")

    def fill32(self, ptr: int, bits: int, count: int) -> None:
        """Set ``count`` 32-bit words to ``bits`` (e.g. 0x7FC00000, a float32 NaN)."""
        self.make_current()
        drv.check(drv.api().cuMemsetD32Async(ptr, bits, count, self.stream), "cuMemsetD32Async")

    def fill16(self, ptr: int, bits: int, count: int) -> None:
        self.make_current()
        drv.check(drv.api().cuMemsetD16Async(ptr, bits, count, self.stream), "cuMemsetD16Async")

    def synchronize(self) -> None:
        drv.check(drv.api().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # -- kernels -----------------------------------------------------------------------------
    def kernel(self, spec: KernelSpec, name: str):
        """The function ``name`` of variant ``spec``, compiled for this GPU on first use."""
        key = (spec, name)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        self.make_current()
        d = drv.api()
        module = self._modules.get(spec)
        if module is None:
            cubin, _ = compile_spec(spec, self.arch)
            module = drv.check(d.cuModuleLoadData(cubin), f"cuModuleLoadData({spec.key})")
            self._modules[spec] = module
        handle = drv.check(d.cuModuleGetFunction(module, name.encode()),
                           f"cuModuleGetFunction({name})")
        fn = (name, handle)
        self._functions[key] = fn
        return fn

    def launch(self, fn, grid, block, args, shared_bytes: int = 0) -> None:
        """Queue kernel ``fn`` (from ``kernel()``) with ``args`` packed by its signature."""
        name, handle = fn
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        if min(grid) <= 0:
            return  # nothing to do (an empty batch or zero rows)
        params, keep = pack(name, args)
        self.make_current()
        drv.check(drv.api().cuLaunchKernel(handle, *grid, *block, shared_bytes, self.stream,
                                               params.ctypes.data, 0), f"cuLaunchKernel({name})")
        del keep  # the driver copied the argument values at launch

    def event_timer(self):
        """(begin, end) helpers around CUDA events on this stream; ``end()`` returns ms."""
        d = drv.api()
        self.make_current()
        start = drv.check(d.cuEventCreate(0), "cuEventCreate")
        stop = drv.check(d.cuEventCreate(0), "cuEventCreate")

        def begin():
            drv.check(d.cuEventRecord(start, self.stream), "cuEventRecord")

        def end() -> float:
            drv.check(d.cuEventRecord(stop, self.stream), "cuEventRecord")
            drv.check(d.cuEventSynchronize(stop), "cuEventSynchronize")
            return float(drv.check(d.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))

        return begin, end

    def __repr__(self) -> str:
        return f"Device(cuda:{self.index}, {self.name}, {self.arch}, {self.sm_count} SMs)"
