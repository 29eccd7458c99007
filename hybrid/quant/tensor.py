"""QuantizedTensor: a weight matrix [out_features, in_features] kept in its encoding.

The data is a uint8 array [out_features, row_bytes] of the format's blocks, row by row (GGUF's
layout), usually a read-only view of a memory-mapped file: nothing is copied or decoded on load.
Kernels read it in place; ``dequantize()`` and ``rows(ids)`` decode to float32 when asked.
"""

from __future__ import annotations

import numpy as np

from ..threads import get_num_threads
from .formats import WeightFormat, get_format


class QuantizedTensor:
    """A 2-D weight in ``format``; ``shape`` is the logical (out_features, in_features)."""

    __slots__ = ("format", "shape", "data")
    ndim = 2

    def __init__(self, data: np.ndarray, format, shape):
        fmt = get_format(format)
        out_features, in_features = (int(s) for s in shape)
        if out_features <= 0 or in_features <= 0:
            raise ValueError(f"a quantized weight needs positive dimensions, got {tuple(shape)}")
        row_bytes = fmt.row_bytes(in_features)
        data = np.asarray(data)
        if data.dtype != np.uint8:
            data = data.view(np.uint8) if data.flags.c_contiguous else data.astype(np.uint8)
        data = data.reshape(out_features, row_bytes) if data.size == out_features * row_bytes \
            else data
        if data.shape != (out_features, row_bytes):
            raise ValueError(f"{fmt.name} weight {out_features}x{in_features} needs "
                             f"{out_features * row_bytes} bytes as [{out_features}, {row_bytes}], "
                             f"got an array of shape {data.shape}")
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        self.format: WeightFormat = fmt
        self.shape = (out_features, in_features)
        self.data = data

    # ------------------------------------------------------------------ array-like facts
    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def dtype(self):  # what a float32 consumer would get
        return np.dtype(np.float32)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def __len__(self) -> int:
        return self.shape[0]

    # ------------------------------------------------------------------ decoding
    def dequantize(self, rows: "slice | None" = None) -> np.ndarray:
        """float32 [out_features, in_features] (or the rows of ``rows``, a step-1 slice)."""
        from .._cpu import quant

        r0, r1, step = (rows or slice(None)).indices(self.shape[0])
        if step != 1:
            raise ValueError("dequantize takes a contiguous row range")
        out = np.empty((max(r1 - r0, 0), self.shape[1]), dtype=np.float32)
        quant.decode_rows(self.format.kernel_code, self.data, self.shape[1], r0, max(r1, r0), out,
                          get_num_threads())
        return out

    def rows(self, ids) -> np.ndarray:
        """float32 [len(ids), in_features]: the decoded rows ``ids`` (an embedding lookup)."""
        from .._cpu import quant

        idx = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        out = np.empty((idx.shape[0], self.shape[1]), dtype=np.float32)
        quant.gather_rows(self.format.kernel_code, self.data, self.shape[1], idx, out)
        return out

    def take_rows(self, index) -> "QuantizedTensor":
        """A new QuantizedTensor of the rows ``index`` (a permutation, a slice): a copy."""
        data = np.ascontiguousarray(self.data[index])
        return QuantizedTensor(data, self.format, (data.shape[0], self.shape[1]))

    def __array__(self, dtype=None, copy=None):
        a = self.dequantize()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return (f"QuantizedTensor({self.format.name}, shape={self.shape}, "
                f"{self.nbytes / 2**20:.2f} MiB, {self.format.bits_per_weight:.2f} bits/weight)")


def is_quantized(w) -> bool:
    return isinstance(w, QuantizedTensor)
