"""Quantizers: float32 rows -> a format's blocks (GGUF layouts), in vectorised NumPy.

They follow llama.cpp's reference quantizers: round-to-nearest with the block maximum for the
32-value formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, identical output), and for the K formats a search
over rounding grids per sub-block, each fitted by least squares (scale and minimum), then 6-bit
(Q4_K/Q5_K) or 8-bit (Q6_K) scales relative to one float16 scale per super-block of 256.  Quantizing happens once, at load or when
asked; the kernels never call this.
"""

from __future__ import annotations

import numpy as np

from .formats import WeightFormat, get_format
from .tensor import QuantizedTensor

_F16 = np.float16


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """[n] float -> [n, 2] uint8 (IEEE binary16, round to nearest even)."""
    return np.ascontiguousarray(v.astype(_F16)).view(np.uint8).reshape(-1, 2)


def _f16_round(v: np.ndarray) -> np.ndarray:
    return v.astype(_F16).astype(np.float32)


def _safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The value of largest magnitude along the last axis, with its sign."""
    i = np.abs(x).argmax(axis=-1)
    return np.take_along_axis(x, i[..., None], axis=-1)[..., 0]


def _pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & 0x0F) | ((hi.astype(np.uint8) & 0x0F) << 4)


def _bits_u32(bit: np.ndarray) -> np.ndarray:
    """[nb, 32] 0/1 -> [nb, 4] uint8: bit j of a little-endian uint32."""
    word = (bit.astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    return np.ascontiguousarray(word.astype("<u4")).view(np.uint8).reshape(-1, 4)


# ------------------------------------------------------------------ 32-value formats
def _q8_0(x):  # x [nb, 32]
    d = np.abs(x).max(axis=1) / 127
    q = np.clip(np.round(x * _safe_inv(d)[:, None]), -127, 127).astype(np.int8)
    return np.hstack([_f16_bytes(d), q.view(np.uint8)])


def _q4_0(x):
    d = _signed_absmax(x) / -8
    q = np.clip(np.trunc(x * _safe_inv(d)[:, None] + 8.5), 0, 15)
    return np.hstack([_f16_bytes(d), _pack_nibbles(q[:, :16], q[:, 16:])])


def _q4_1(x):
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / 15
    q = np.clip(np.trunc((x - lo[:, None]) * _safe_inv(d)[:, None] + 0.5), 0, 15)
    return np.hstack([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q[:, :16], q[:, 16:])])


def _q5_0(x):
    d = _signed_absmax(x) / -16
    q = np.clip(np.trunc(x * _safe_inv(d)[:, None] + 16.5), 0, 31).astype(np.uint8)
    return np.hstack([_f16_bytes(d), _bits_u32(q >> 4), _pack_nibbles(q[:, :16], q[:, 16:])])


def _q5_1(x):
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / 31
    q = np.clip(np.trunc((x - lo[:, None]) * _safe_inv(d)[:, None] + 0.5), 0, 31).astype(np.uint8)
    return np.hstack([_f16_bytes(d), _f16_bytes(lo), _bits_u32(q >> 4),
                      _pack_nibbles(q[:, :16], q[:, 16:])])


# ------------------------------------------------------------------ K formats
def _lstsq_affine(x, L, nmax):
    """Least-squares scale >= 0 and min m >= 0 with x ~ scale*L - m, and its squared error."""
    n = x.shape[-1]
    sL, sLL = L.sum(axis=-1), (L * L).sum(axis=-1)
    sx, sLx = x.sum(axis=-1), (L * x).sum(axis=-1)
    det = n * sLL - sL * sL
    safe = np.where(det > 0, det, 1)
    scale = (n * sLx - sL * sx) / safe
    c = (sLL * sx - sL * sLx) / safe  # x ~ scale*L + c
    pos = (c > 0) | (det <= 0)  # the format needs c = -m <= 0: refit the scale alone
    scale = np.where(pos, sLx / np.where(sLL > 0, sLL, 1), scale)
    c = np.where(pos, 0, c)
    scale = np.maximum(scale, 0)
    err = ((scale[..., None] * L + c[..., None] - x) ** 2).sum(axis=-1)
    return scale.astype(np.float32), (-c).astype(np.float32), err


def _fit_affine(x: np.ndarray, nmax: int, steps: int = 21):
    """Per row of x [..., n]: scale >= 0 and min m >= 0 with x ~ scale*L - m, L in 0..nmax.
    Like llama.cpp's search: try `steps` rounding grids around the range's scale, fit each by
    least squares, keep the best (then one more refit on the best grid)."""
    lo = np.minimum(x.min(axis=-1), 0)
    span = x.max(axis=-1) - lo
    best_scale, best_m, best_err = None, None, None
    for i in range(steps):
        iscale = (nmax - 1.0 + 0.1 * i) * _safe_inv(span)  # grids from nmax-1 to nmax+1 steps
        L = np.clip(np.round((x - lo[..., None]) * iscale[..., None]), 0, nmax)
        scale, m, err = _lstsq_affine(x, L, nmax)
        if best_err is None:
            best_scale, best_m, best_err = scale, m, err
        else:
            better = err < best_err
            best_scale = np.where(better, scale, best_scale)
            best_m = np.where(better, m, best_m)
            best_err = np.where(better, err, best_err)
    L = np.clip(np.round((x + best_m[..., None]) * _safe_inv(best_scale)[..., None]), 0, nmax)
    scale, m, err = _lstsq_affine(x, L, nmax)
    better = err < best_err
    return np.where(better, scale, best_scale), np.where(better, m, best_m)


def _k_scales(scale, m, x, nmax):
    """6-bit sub-block scales and mins under float16 super-block scales; the final L."""
    d = _f16_round(scale.max(axis=1) / 63)
    dmin = _f16_round(m.max(axis=1) / 63)
    sc = np.clip(np.round(scale * _safe_inv(d)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(m * _safe_inv(dmin)[:, None]), 0, 63).astype(np.uint8)
    d_eff = d[:, None] * sc.astype(np.float32)  # [nsb, 8]
    m_eff = dmin[:, None] * mn.astype(np.float32)
    L = np.clip(np.round((x + m_eff[..., None]) * _safe_inv(d_eff)[..., None]), 0, nmax)
    packed = np.empty((sc.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return d, dmin, packed, L.astype(np.uint8)


def _q4_k(x):  # x [nsb, 256]
    xs = x.reshape(-1, 8, 32)
    scale, m = _fit_affine(xs, 15)
    d, dmin, packed, L = _k_scales(scale, m, xs, 15)
    qs = _pack_nibbles(L[:, 0::2, :], L[:, 1::2, :]).reshape(-1, 128)  # [nsb, 4 groups x 32]
    return np.hstack([_f16_bytes(d), _f16_bytes(dmin), packed, qs])


def _q5_k(x):
    xs = x.reshape(-1, 8, 32)
    scale, m = _fit_affine(xs, 31)
    d, dmin, packed, L = _k_scales(scale, m, xs, 31)
    qh = ((L >> 4).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(
        axis=1, dtype=np.uint8)  # [nsb, 32]: bit j of qh[l] = bit 4 of sub-block j's value l
    qs = _pack_nibbles(L[:, 0::2, :], L[:, 1::2, :]).reshape(-1, 128)
    return np.hstack([_f16_bytes(d), _f16_bytes(dmin), packed, qh, qs])


def _q6_k(x):  # x [nsb, 256]
    xs = x.reshape(-1, 16, 16)
    amax = _signed_absmax(xs)
    scale, best_err = None, None
    for i in range(-9, 10):  # llama.cpp's search: grids around max/-32, each refit by least squares
        L = np.clip(np.round(xs * ((-32 + 0.1 * i) * _safe_inv(amax))[..., None]), -32, 31)
        sLL = (L * L).sum(axis=-1)
        s_i = np.where(sLL > 0, (L * xs).sum(axis=-1) / np.where(sLL > 0, sLL, 1), 0)
        err = ((s_i[..., None] * L - xs) ** 2).sum(axis=-1)
        if best_err is None:
            scale, best_err = s_i, err
        else:
            scale, best_err = np.where(err < best_err, s_i, scale), np.minimum(err, best_err)
    d = _f16_round(np.abs(scale).max(axis=1) / 127)
    sc = np.clip(np.round(scale * _safe_inv(d)[:, None]), -128, 127).astype(np.int8)
    eff = d[:, None] * sc.astype(np.float32)
    q = (np.clip(np.round(xs * _safe_inv(eff)[..., None]), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)  # [nsb, half, k, l]: value 128*half + 32*k + l
    ql = np.concatenate([_pack_nibbles(q[:, :, 0], q[:, :, 2]),
                         _pack_nibbles(q[:, :, 1], q[:, :, 3])], axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    return np.hstack([ql, qh, sc.view(np.uint8), _f16_bytes(d)])


# ------------------------------------------------------------------ float formats
def _float16(x):
    return x.astype(_F16).view(np.uint8).reshape(x.shape[0], -1)


def _bfloat16(x):
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded = np.where(np.isnan(x), np.uint16(0x7FC0), rounded)
    return rounded.view(np.uint8).reshape(x.shape[0], -1)


_QUANTIZERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1,
               "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k, "float16": _float16,
               "bfloat16": _bfloat16}


def quantize(array, format) -> QuantizedTensor:
    """Encode a float matrix [out_features, in_features] in ``format`` ("q8_0", "q4_0", "q4_1",
    "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "float16", "bfloat16")."""
    fmt: WeightFormat = get_format(format)
    if not fmt.quantizable:
        raise ValueError(f"hybrid reads {fmt.name} tensors from GGUF files but does not quantize "
                         f"to {fmt.name}; make such a file with llama.cpp's llama-quantize")
    x = np.asarray(array)
    if x.ndim != 2:
        raise ValueError(f"quantize takes a 2-D [out_features, in_features] matrix, got shape "
                         f"{x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"quantize takes a floating-point matrix, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    fmt.row_bytes(n)  # raises when rows do not split into whole blocks
    if fmt.block_values == 1:
        data = _QUANTIZERS[fmt.name](x)
    else:
        if not np.isfinite(x).all():
            raise ValueError(f"cannot quantize to {fmt.name}: the matrix holds NaN or inf")
        blocks = x.reshape(-1, fmt.block_values)
        data = np.empty((blocks.shape[0], fmt.block_bytes), dtype=np.uint8)
        step = (1 << 14) // (8 if fmt.block_values == 256 else 1)  # bounded temporaries
        for lo in range(0, blocks.shape[0], step):
            data[lo:lo + step] = _QUANTIZERS[fmt.name](blocks[lo:lo + step])
    return QuantizedTensor(data.reshape(rows, -1), fmt, (rows, n))


def dequantize(qt) -> np.ndarray:
    """float32 [out_features, in_features] of a QuantizedTensor (a float array is returned as
    float32)."""
    if isinstance(qt, QuantizedTensor):
        return qt.dequantize()
    return np.asarray(qt, dtype=np.float32)
