"""Device memory, modules and kernel launches on one GPU through cuda-python's driver API.

    dev = Device(0)                               # primary context of GPU 0, one stream
    buf = dev.to_device(np.ones(16, np.float32))  # DeviceBuffer; buf.free() or the finalizer
    fn = dev.kernel(variants.elementwise(), "hybrid_add_f32")
    dev.launch(fn, grid, block, [buf, buf, out, Arg.i64(16)])
    host = dev.to_host(out, np.empty(16, np.float32))

Kernel arguments are packed by hand: each argument is copied into a small host array of its C
type and the launch receives an array of their addresses (the documented ``void **kernelParams``),
so the argument types are explicit and never guessed.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import driver as drv
from .compiler import KernelSpec, compile_spec


class Arg:
    """Explicitly sized scalar kernel arguments."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        self.value = value

    @staticmethod
    def i32(v) -> "Arg":
        return Arg(np.array([v], dtype=np.int32))

    @staticmethod
    def i64(v) -> "Arg":
        return Arg(np.array([v], dtype=np.int64))

    @staticmethod
    def f32(v) -> "Arg":
        return Arg(np.array([v], dtype=np.float32))

    @staticmethod
    def ptr(v) -> "Arg":
        return Arg(np.array([int(v)], dtype=np.uint64))


def pack_args(args) -> tuple:
    """(addresses array, keep-alive list) for ``void **kernelParams``.  DeviceBuffers and None
    pass as 64-bit pointers; scalars must be wrapped in Arg."""
    storage = []
    for a in args:
        if a is None:
            storage.append(np.zeros(1, dtype=np.uint64))
        elif isinstance(a, DeviceBuffer):
            storage.append(np.array([a.ptr], dtype=np.uint64))
        elif isinstance(a, Arg):
            storage.append(a.value)
        else:
            raise TypeError(f"kernel argument of type {type(a).__name__}: wrap scalars in Arg.i32/"
                            f"i64/f32/ptr so their C type is explicit")
    addrs = np.array([s.ctypes.data for s in storage], dtype=np.uint64)
    return addrs, storage


def _free(ptr: int) -> None:
    try:
        from cuda.bindings import driver

        driver.cuMemFree(ptr)
    except Exception:  # the context may be gone at interpreter exit
        pass


class DeviceBuffer:
    """``nbytes`` of device memory, freed by ``free()`` or, at the latest, by its finalizer."""

    def __init__(self, device: "Device", nbytes: int):
        d = drv._driver()
        self.device = device
        self.nbytes = int(nbytes)
        self.ptr = int(drv.check(d.cuMemAlloc(max(self.nbytes, 1)), f"cuMemAlloc({nbytes})"))
        self._finalizer = weakref.finalize(self, _free, self.ptr)

    def free(self) -> None:
        if self._finalizer.alive:
            self._finalizer()

    def __int__(self) -> int:
        return self.ptr


class Device:
    """The primary context and one stream of GPU ``index``; compiled kernels are cached per
    (spec, name)."""

    def __init__(self, index: int = 0):
        d = drv._driver()
        n = drv.init()
        if not 0 <= index < n:
            raise drv.HybridCudaError(f"CUDA_ERROR_INVALID_DEVICE: cuda:{index} requested, "
                                      f"{n} device(s) visible")
        self.index = index
        self.handle = drv.check(d.cuDeviceGet(index), "cuDeviceGet")
        self.context = drv.check(d.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        drv.check(d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = drv.check(d.cuStreamCreate(0), "cuStreamCreate")
        self.arch = drv.compute_capability(index)
        self._modules: dict = {}
        self._functions: dict = {}

    # -- memory ------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(self, nbytes)

    def to_device(self, host: np.ndarray) -> DeviceBuffer:
        host = np.ascontiguousarray(host)
        buf = self.alloc(host.nbytes)
        self.copy_h2d(buf, host)
        return buf

    def copy_h2d(self, buf: DeviceBuffer, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        d = drv._driver()
        drv.check(d.cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data, host.nbytes, self.stream),
                  "cuMemcpyHtoDAsync")
        self.synchronize()  # the host array may go away when we return

    def to_host(self, buf: DeviceBuffer, out: np.ndarray) -> np.ndarray:
        d = drv._driver()
        self.synchronize()
        drv.check(d.cuMemcpyDtoH(out.ctypes.data, buf.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def synchronize(self) -> None:
        drv.check(drv._driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # -- kernels -----------------------------------------------------------------------------
    def kernel(self, spec: KernelSpec, name: str):
        key = (spec, name)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        d = drv._driver()
        module = self._modules.get(spec)
        if module is None:
            cubin, _ = compile_spec(spec, self.arch)
            module = drv.check(d.cuModuleLoadData(cubin), f"cuModuleLoadData({spec.key})")
            self._modules[spec] = module
        fn = drv.check(d.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
        self._functions[key] = fn
        return fn

    def launch(self, fn, grid, block, args, shared_bytes: int = 0) -> None:
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        addrs, keep = pack_args(args)
        d = drv._driver()
        drv.check(d.cuLaunchKernel(fn, *grid, *block, shared_bytes, self.stream,
                                   addrs.ctypes.data, 0), "cuLaunchKernel")
        del keep  # the driver copied the arguments at launch

    def event_timer(self):
        """(start, stop, elapsed_ms) helpers around CUDA events on this stream."""
        d = drv._driver()
        start = drv.check(d.cuEventCreate(0), "cuEventCreate")
        stop = drv.check(d.cuEventCreate(0), "cuEventCreate")

        def begin():
            drv.check(d.cuEventRecord(start, self.stream), "cuEventRecord")

        def end() -> float:
            drv.check(d.cuEventRecord(stop, self.stream), "cuEventRecord")
            drv.check(d.cuEventSynchronize(stop), "cuEventSynchronize")
            return float(drv.check(d.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))

        return begin, end
