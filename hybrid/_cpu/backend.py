"""The CPU backend: registers the Cython/OpenMP kernels (and BLAS for linear) with the registry.

Every function here receives arrays already validated by hybrid/ops.py (float32, C-contiguous,
consistent shapes) and reads the thread count from hybrid.threads, the one place that sets it.
"""

import numpy as np

from ..threads import get_num_threads

try:
    from . import attention, elementwise
except ImportError as exc:  # the extension was not built (source checkout without build_ext)
    from ..registry import BackendUnavailable

    raise BackendUnavailable(
        f"the compiled CPU kernels are missing ({exc}); install the package with "
        f"'pip install .' or build them with 'python setup.py build_ext --inplace'") from exc


def rmsnorm(x, weight, eps, out):
    elementwise.rmsnorm(x, weight, eps, out, get_num_threads())


def rope(x, positions, inv_freq, num_heads, head_dim, neox):
    elementwise.rope(x, positions, inv_freq, num_heads, head_dim, neox, get_num_threads())


def swiglu(gate, up, out):
    elementwise.swiglu(gate, up, out, get_num_threads())


def add(a, b, out):
    elementwise.add(a, b, out, get_num_threads())


def linear(x, weight, bias, out):
    # [rows, in] @ [in, out] through BLAS (sgemm / sgemv); weight stays [out, in] in memory
    np.matmul(x, weight.T, out=out)
    if bias is not None:
        out += bias


def paged_attention(q, start_pos, k_ptrs, v_ptrs, num_heads, num_kv_heads, head_dim,
                    block_size, head_stride, kv_f16, scale, out):
    attention.paged_attention(q, start_pos, k_ptrs, v_ptrs, num_heads, num_kv_heads, head_dim,
                              block_size, head_stride, kv_f16, scale, out, get_num_threads())


def paged_attention_batch(q, kv_lens, indptr, k_ptrs, v_ptrs, num_heads, num_kv_heads, head_dim,
                          block_size, head_stride, kv_f16, scale, out):
    attention.paged_attention_batch(q, kv_lens, indptr, k_ptrs, v_ptrs, num_heads, num_kv_heads,
                                    head_dim, block_size, head_stride, kv_f16, scale, out,
                                    get_num_threads())


def to_device(array, placement):
    if placement.is_cpu:
        return array
    from ..registry import NoBackendError

    raise NoBackendError(f"the cpu backend cannot move arrays to {placement}")


def register(registrar):
    for name in ("rmsnorm", "rope", "swiglu", "add", "linear", "paged_attention",
                 "paged_attention_batch", "to_device"):
        registrar.op(name, globals()[name])
