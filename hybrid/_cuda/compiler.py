"""NVRTC compilation of hybrid's CUDA kernel sources, cached in memory and on disk.

A kernel variant is a .cu file of ``hybrid/_cuda/kernels`` plus ``-D`` defines.  It is compiled
for one architecture (``sm_80``, ``sm_90``, ...) to a cubin.  Cubins are cached by a readable key
(file, defines, architecture) plus a hash of the sources and the NVRTC version, in memory and under
``HYBRID_CACHE_DIR`` (default: the user's cache directory), written atomically under a file lock.
NVRTC works without a GPU or a driver, so CI compiles every variant.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field

KERNEL_DIR = os.path.join(os.path.dirname(__file__), "kernels")
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_memory_cache: dict = {}


class HybridCudaError(RuntimeError):
    """A CUDA driver or NVRTC call failed: 'CUDA_ERROR_...: description' (with the NVRTC log)."""


@dataclass(frozen=True)
class KernelSpec:
    """One compiled variant: a source file, its defines and the kernels it exports."""

    source: str  # file name in hybrid/_cuda/kernels
    defines: tuple = ()  # (("HEAD_DIM", 128), ...)
    kernels: tuple = field(default=())  # extern "C" names it must export

    @property
    def key(self) -> str:
        d = "-".join(f"{k}{v}" for k, v in self.defines) or "default"
        return f"{os.path.splitext(self.source)[0]}-{d}"


def bindings(name: str):
    """``cuda.bindings.<name>`` (driver, nvrtc), or HybridCudaError saying cuda-python is missing."""
    import importlib

    try:
        return importlib.import_module(f"cuda.bindings.{name}")
    except ImportError as exc:
        raise HybridCudaError(f"cuda-python is not installed (pip install 'hybrid[cuda]'): "
                              f"{exc}") from None


def _nvrtc():
    return bindings("nvrtc")


def _check_nvrtc(nvrtc, result, what: str, prog=None) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return
    msg = f"{err.name}: {what}"
    if prog is not None:
        msg += "\n" + program_log(nvrtc, prog)
    raise HybridCudaError(msg)


def _writable(size: int) -> bytes:
    """A new bytes object of ``size`` zero bytes for NVRTC to write into.  Never ``b" " * n``:
    for n == 1 that is the interpreter's shared one-byte object, and NVRTC's write into it
    turned every ``bytes([32])`` of the process into b"\x00"."""
    return bytes(size)


def program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = _writable(size)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode("utf-8", errors="replace").strip()


def read_sources(source: str) -> dict:
    """{name: text} of a kernel file and the headers it includes (recursively)."""
    out, todo = {}, [source]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        path = os.path.join(KERNEL_DIR, name)
        with open(path, encoding="utf-8") as f:
            out[name] = f.read()
        todo.extend(_INCLUDE_RE.findall(out[name]))
    return out


def nvrtc_version() -> tuple:
    nvrtc = _nvrtc()
    res = nvrtc.nvrtcVersion()
    _check_nvrtc(nvrtc, res, "nvrtcVersion")
    return tuple(res[1:])


def options(spec: KernelSpec, arch: str) -> list:
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device", "--use_fast_math",
            "-Werror=all-warnings"]
    opts += [f"-D{k}={v}" for k, v in spec.defines]
    return opts


def cache_dir() -> str:
    base = os.environ.get("HYBRID_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "hybrid", "kernels")
    return base


def compile_spec(spec: KernelSpec, arch: str, *, use_disk: bool = True) -> tuple:
    """Compile ``spec`` for ``arch``; returns (cubin bytes, NVRTC log).  Raises HybridCudaError
    with the full log on a compile error or warning, or when an expected kernel is missing."""
    sources = read_sources(spec.source)
    opts = options(spec, arch)
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    digest.update(" ".join(opts).encode())
    version = nvrtc_version()
    digest.update(repr(version).encode())
    key = f"{spec.key}-{arch}-nvrtc{version[0]}.{version[1]}-{digest.hexdigest()[:16]}"
    hit = _memory_cache.get(key)
    if hit is not None:
        return hit
    path = os.path.join(cache_dir(), key + ".cubin")
    if use_disk and os.path.isfile(path):
        with open(path, "rb") as f:
            result = (f.read(), "")
        _memory_cache[key] = result
        return result
    cubin, log = _run_nvrtc(spec, sources, opts, "CUBIN")
    result = (bytes(cubin), log)
    _memory_cache[key] = result
    if use_disk:
        _write_atomically(path, result[0])
    return result


_ENTRY_RE = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
_PARAM_RE = re.compile(r"\.param\s+\.(\w+)")


def ptx_parameters(spec: KernelSpec, arch: str = "compute_80") -> dict:
    """{kernel name: [PTX parameter types, e.g. 'u64', 'u32', 'f32']} of ``spec`` as NVRTC
    compiles it: the ABI the launch layer's declared signatures are checked against."""
    ptx, _ = _run_nvrtc(spec, read_sources(spec.source), options(spec, arch), "PTX")
    text = ptx.rstrip(b"\x00").decode()
    return {m.group(1): _PARAM_RE.findall(m.group(2)) for m in _ENTRY_RE.finditer(text)}


def _run_nvrtc(spec: KernelSpec, sources: dict, opts: list, output: str) -> tuple:
    """Compile ``spec`` with NVRTC; returns (the CUBIN or PTX bytes, the log).  Raises
    HybridCudaError with the full log on any error."""
    nvrtc = _nvrtc()
    headers = [n for n in sources if n != spec.source]
    res = nvrtc.nvrtcCreateProgram(sources[spec.source].encode(), spec.source.encode(),
                                   len(headers), [sources[h].encode() for h in headers],
                                   [h.encode() for h in headers])
    _check_nvrtc(nvrtc, res, f"creating the program for {spec.key}")
    prog = res[1]
    try:
        for name in spec.kernels:
            _check_nvrtc(nvrtc, nvrtc.nvrtcAddNameExpression(prog, name.encode()),
                         f"registering kernel {name}")
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _check_nvrtc(nvrtc, res, f"compiling {spec.key} with {' '.join(opts)}", prog)
        log = program_log(nvrtc, prog)
        res = getattr(nvrtc, f"nvrtcGet{output}Size")(prog)
        _check_nvrtc(nvrtc, res, f"nvrtcGet{output}Size", prog)
        data = _writable(res[1])
        _check_nvrtc(nvrtc, getattr(nvrtc, f"nvrtcGet{output}")(prog, data), f"nvrtcGet{output}", prog)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return data, log


def _write_atomically(path: str, data: bytes) -> None:
    """Write under an exclusive lock, through a temporary file renamed into place."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock_path = path + ".lock"
    with open(lock_path, "a+b") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: the atomic rename still keeps readers safe
            pass
        if os.path.isfile(path):
            return
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
