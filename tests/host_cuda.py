"""The real CUDA backend on an emulated GPU: everything of hybrid/_cuda runs as shipped (device
arrays, arena, KV blocks and their device tables, the launch layer, argument packing, the kernel
sources) except two things: device memory is host memory, and each kernel variant is compiled by
g++ against tests/cuda_host/emulator.h and run on CPU threads instead of by NVRTC on a GPU.

So tests here check the kernels' logic and every launch's grid, argument order and buffer
handling without a GPU.  They cannot check speed, the driver calls, or the GPU memory model;
``python -m hybrid.tools.gpucheck`` on a real GPU does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

from hybrid._cuda import compiler
from hybrid._cuda.signatures import pack

EMULATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_host", "emulator.h")
_libs: dict = {}


def compiler_missing() -> "str | None":
    """Why the emulation cannot be built here, or None."""
    if shutil.which("g++") is None:
        return "g++ is not installed"
    return None


def _build_dir() -> str:
    d = os.environ.get("HYBRID_EMU_BUILD") or os.path.join(tempfile.gettempdir(),
                                                          f"hybrid-emu-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def load(spec) -> ctypes.CDLL:
    """The emulated variant ``spec``: a shared library exporting emu_<kernel> for each kernel."""
    lib = _libs.get(spec)
    if lib is not None:
        return lib
    sources = compiler.read_sources(spec.source)
    with open(EMULATOR, encoding="utf-8") as f:
        emulator = f.read()
    digest = hashlib.sha256((emulator + repr(spec) + repr(sorted(sources.items()))).encode())
    so = os.path.join(_build_dir(), f"{spec.key}-{digest.hexdigest()[:12]}.so")
    if not os.path.exists(so):
        tu = f"{so[:-3]}.{os.getpid()}.cpp"
        with open(tu, "w", encoding="utf-8") as f:
            f.write(f'#include "{spec.source}"\n')
            f.writelines(f"HY_EXPORT({name})\n" for name in spec.kernels)
        cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w",
               "-include", EMULATOR, "-I", compiler.KERNEL_DIR]
        tmp = f"{so}.{os.getpid()}.tmp"  # concurrent runs never share a half-written file
        cmd += [f"-D{k}={v}" for k, v in spec.defines] + [tu, "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"emulated build of {spec.key} failed:\n{res.stderr[-4000:]}")
        os.replace(tmp, so)
    lib = ctypes.CDLL(so)
    _libs[spec] = lib
    return lib


class EmuBuffer:
    """Host memory standing in for a device allocation (256-byte aligned, like cuMemAlloc)."""

    def __init__(self, dev, nbytes: int):
        self.device, self.nbytes = dev, int(nbytes)
        self._mem = np.empty(self.nbytes + 256, dtype=np.uint8)
        self.ptr = int(self._mem.ctypes.data + (-self._mem.ctypes.data) % 256)

    def free(self) -> None:
        pass  # the memory goes with the object


class EmuDevice:
    """The interface of hybrid._cuda.device.Device over host memory and emulated kernels."""

    def __init__(self, index: int, sm_count: int = 2):
        self.index, self.sm_count = index, sm_count
        self.arch, self.name = "emulated", "host emulation"
        self.launches: list = []

    def make_current(self) -> None:
        pass

    def alloc(self, nbytes: int) -> EmuBuffer:
        return EmuBuffer(self, nbytes)

    def copy_h2d(self, dst_ptr: int, host: np.ndarray) -> None:
        ctypes.memmove(dst_ptr, host.ctypes.data, host.nbytes)

    def copy_d2h(self, host: np.ndarray, src_ptr: int) -> np.ndarray:
        ctypes.memmove(host.ctypes.data, src_ptr, host.nbytes)
        return host

    def copy_d2d(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        ctypes.memmove(dst_ptr, src_ptr, nbytes)

    def fill32(self, ptr: int, bits: int, count: int) -> None:
        np.ctypeslib.as_array((ctypes.c_uint32 * count).from_address(ptr))[:] = bits

    def fill16(self, ptr: int, bits: int, count: int) -> None:
        np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(ptr))[:] = bits

    def synchronize(self) -> None:
        pass

    def kernel(self, spec, name: str):
        return name, getattr(load(spec), "emu_" + name)

    def launch(self, fn, grid, block, args, shared_bytes: int = 0) -> None:
        name, entry = fn
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        if min(grid) <= 0:
            return
        params, keep = pack(name, args)
        self.launches.append((name, grid, block))
        entry((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
              ctypes.c_void_p(params.ctypes.data))
        del keep

    def event_timer(self):
        t = [0.0]

        def begin():
            t[0] = time.perf_counter()

        def end() -> float:
            return (time.perf_counter() - t[0]) * 1e3

        return begin, end
