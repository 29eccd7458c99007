"""A host-memory stand-in for the cuda backend, for testing placement logic without a GPU.

It registers under the device kind "cuda" (tests swap it in with the ``emulated_cuda`` fixture)
and implements every operation the real backend registers, over ``EmuArray``: NumPy storage
behind the DeviceArray interface (shape, dtype, ptr, reshape, row slices, to_host,
copy_from_host, copy_from; NumPy conversion refused).  Row ops run the CPU kernels; paged
attention runs the CPU kernel, or with fused RoPE the float64 reference over the cache's
unrotated keys.  Every op insists that its arrays are EmuArrays on one device, so a layer that
lets a host array reach a device op (or the reverse) fails here as it would on a GPU.

What it proves: the routing of DecoderLayer, PagedKVCache, ops and Model across placements
(moves, buffers, fused-RoPE decisions, errors, rollback).  What it cannot: the CUDA kernels and
the driver layer, which ``python -m hybrid.tools.gpucheck`` checks on a real GPU.
"""

import numpy as np

from hybrid import reference as ref
from hybrid._cpu import backend as cpu
from hybrid._cuda import variants
from hybrid.kvpool import HostLayerStorage, LayerTable
from hybrid.placement import Placement

STATS = {"h2d": 0, "d2h": 0}
_TABLES = {}  # K table address -> layer blocks (batched attention finds caches by address)


class EmuArray:
    def __init__(self, data: np.ndarray, index: int):
        assert isinstance(data, np.ndarray) and data.flags.c_contiguous
        self.data, self.index = data, index

    placement = property(lambda self: Placement("cuda", self.index))
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    nbytes = property(lambda self: self.data.nbytes)
    ptr = property(lambda self: self.data.ctypes.data)

    def __len__(self):
        return self.data.shape[0]

    def __array__(self, *a, **k):
        raise TypeError(f"this array lives on {self.placement}; call .to_host()")

    def reshape(self, *shape):
        return EmuArray(self.data.reshape(*shape), self.index)

    def __getitem__(self, key):
        assert isinstance(key, slice) and key.step in (None, 1)
        return EmuArray(self.data[key], self.index)

    def to_host(self, out=None):
        STATS["d2h"] += 1
        if out is None:
            return self.data.copy()
        assert out.shape == self.shape and out.dtype == self.dtype
        np.copyto(out, self.data)
        return out

    def copy_from_host(self, host):
        STATS["h2d"] += 1
        assert isinstance(host, np.ndarray)
        np.copyto(self.data, np.asarray(host).reshape(self.shape))
        return self

    def copy_from(self, src):
        assert isinstance(src, EmuArray) and src.shape == self.shape
        np.copyto(self.data, src.data)
        return self


def _dev(*arrays):
    """Raw storage of arrays that must all be EmuArrays on one device (None passes)."""
    idx = {a.index for a in arrays if a is not None and isinstance(a, EmuArray)}
    for a in arrays:
        assert a is None or isinstance(a, EmuArray), f"a {type(a).__name__} reached a device op"
    assert len(idx) <= 1, f"arrays on several devices: {idx}"
    return [None if a is None else a.data for a in arrays]


def rmsnorm(x, w, eps, out):
    cpu.rmsnorm(*_dev(x, w), eps, _dev(out)[0])


def rope(x, positions, inv_freq, num_heads, head_dim, neox):
    assert isinstance(positions, np.ndarray) and isinstance(inv_freq, np.ndarray)
    cpu.rope(_dev(x)[0], positions, inv_freq, num_heads, head_dim, neox)


def swiglu(g, u, out):
    cpu.swiglu(*_dev(g, u, out))


def add(a, b, out):
    cpu.add(*_dev(a, b, out))


def copy(a, out):
    src, dst = _dev(a, out)
    np.copyto(dst, src)


def linear(x, w, b, out, role="auto"):
    cpu.linear(*_dev(x, w, b, out), role)


class EmuLayerStorage(HostLayerStorage):
    """A cache layer's blocks 'on' the emulated GPU: host storage plus the device-table
    interface of its tables."""

    def new_table(self):
        return EmuLayerTable(self)

    def write(self, table, start, k, v):
        k = k.data if isinstance(k, EmuArray) else np.asarray(k)
        v = v.data if isinstance(v, EmuArray) else np.asarray(v)
        super().write(table, start, k, v)


class EmuLayerTable(LayerTable):
    def device_tables(self):
        nb, index = self.n, self.storage.placement.index
        kt, vt = EmuArray(self.k_ptrs[:nb], index), EmuArray(self.v_ptrs[:nb], index)
        kt.blocks = vt.blocks = self
        return kt, vt

    def table_addresses(self):
        _TABLES[self.k_ptrs.ctypes.data] = self
        return self.k_ptrs.ctypes.data, self.v_ptrs.ctypes.data


def kv_layer_storage(placement, kvh, d, bs, dtype):
    return EmuLayerStorage(placement, kvh, d, bs, dtype)


def _fused(q, blocks, positions, n_keys, rope_arg, heads, kvh, d, scale):
    """Reference attention over unrotated cached keys, rotating q and keys by position."""
    inv, neox = rope_arg
    style = "neox" if neox else "gptj"
    k, v = blocks.dense(n_keys)
    qr = ref.rope(q, positions, inv, heads, d, style)
    kr = ref.rope(k, np.arange(n_keys), inv, kvh, d, style)
    return ref.attention(qr, kr, v, positions, heads, kvh, d, scale)


def paged_attention(q, start, k_table, v_table, heads, kvh, d, bs, head_stride, kv_f16, scale,
                    out, rope=None):
    qd, kt, vt, od = _dev(q, k_table, v_table, out)
    if rope is None:
        cpu.paged_attention(qd, start, kt, vt, heads, kvh, d, bs, head_stride, kv_f16, scale, od)
    else:
        n = qd.shape[0]
        od[...] = _fused(qd, k_table.blocks, np.arange(start, start + n), start + n, rope,
                         heads, kvh, d, scale)


def to_device(array, placement):
    if placement.is_cpu:
        return array.to_host()
    host = array.to_host() if isinstance(array, EmuArray) else np.ascontiguousarray(array)
    STATS["h2d"] += 1
    return EmuArray(host.copy(), placement.index)


def empty(placement, shape, dtype=np.float32):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return EmuArray(np.full(shape, np.nan, dtype=dtype) if np.dtype(dtype).kind == "f"
                    else np.zeros(shape, dtype=dtype), placement.index)


def check_attention(head_dim, group):
    variants.paged_attention(head_dim, group, False, False)


def register(registrar):
    for name in ("rmsnorm", "rope", "swiglu", "add", "copy", "linear", "paged_attention",
                 "to_device", "empty", "kv_layer_storage",
                 "check_attention"):
        registrar.op(name, globals()[name])
