"""What the compiled CPU backend was built with, OpenMP thread control, and a read-bandwidth probe."""
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cdef extern from "omp_compat.h" nogil:
    int hy_have_openmp()
    int hy_omp_max_threads()
    void hy_omp_set_threads(int n)

cdef extern from "attention_avx2.h" nogil:
    int hy_attn_pf_mode()

cdef extern from "simd.h" nogil:
    int hy_simd_level()
    float hy_dot(const float *a, const float *b, long n)
    float hy_stream_sum(const float *x, long n)


def have_openmp():
    """True when the extension was compiled with OpenMP (False for HYBRID_NO_OPENMP=1 builds)."""
    return bool(hy_have_openmp())


def simd_level():
    """'avx512', 'avx2+fma+f16c', 'avx2+fma' or 'portable': the widest vector code compiled into
    the float kernels (AVX-512 means F, VL, BW and DQ, with FMA and F16C)."""
    return {3: "avx512", 2: "avx2+fma+f16c", 1: "avx2+fma", 0: "portable"}[hy_simd_level()]


def kernel_paths():
    """{kernel family: the code path it runs on this build}, for `hybrid info` and benchmarks."""
    from . import attention as attention_module, quant

    level = hy_simd_level()
    if level == 3:
        attention = "avx512 (head_dim % 16 == 0), avx2+fma+f16c (head_dim % 8 == 0), else portable C"
    elif level == 2:
        attention = "avx2+fma+f16c (head_dim % 8 == 0), else portable C"
    elif level == 1:
        attention = "avx2+fma (float32 KV, head_dim % 8 == 0), else portable C"
    else:
        attention = "portable C"
    if level > 0:  # the SIMD paths' software prefetch, chosen by the core (attention_avx2.h)
        attention += {0: "; stream prefetched into L2 (AMD, L1D < 48 KiB, no AVX-512)",
                      1: "; stream prefetched into L1, non-temporal (AMD, L1D >= 48 KiB)",
                      2: "; stream prefetched into L1 (Intel)",
                      3: "; stream prefetched into L2, then L1 (AMD, L1D < 48 KiB, AVX-512)",
                      }[hy_attn_pf_mode()]
    attention += f"; q8_0 KV scored in {attention_module.q8_0_scores()}"
    elementwise = {3: "avx512", 2: "avx2+fma", 1: "avx2+fma", 0: "portable C"}[level]
    from .backend import SMALL_F32_GEMM  # (the backend's rule for AVX2 builds)
    prefetch = quant.weight_prefetch()
    stream = quant.stream_arrangement(3)
    return {"attention": attention,
            "elementwise (rmsnorm, swiglu, exp)": elementwise,
            "quantized weights": f"{quant.simd()} ({_rows_per_pass(quant.kernel_traits())})"
                                 + (f"; streams prefetched {prefetch}" if prefetch else "")
                                 + (f"; 3-8 rows of Q4/Q5: the stream kernel's \"{stream}\" "
                                    "arrangement" if stream else ""),
            "float32 weights, prompt rows": {16: "avx512 GEMM",
                                             8: f"avx2 GEMM up to {SMALL_F32_GEMM >> 20} MiB "
                                                "matrices, else BLAS sgemm",
                                             0: "BLAS sgemm"}[quant.GEMM_F32_LANES]}


def omp_max_threads():
    return hy_omp_max_threads()


def omp_set_threads(int n):
    hy_omp_set_threads(n)


def read_sum(const float[::1] x,  # IN [n] float32, ideally far larger than the caches
             int num_threads):
    """Sum of x over threads: a streaming read (software-prefetched like the weight kernels)
    used to measure memory bandwidth."""
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t chunk = 1 << 16
    cdef Py_ssize_t nchunks = (n + chunk - 1) // chunk, c, lo
    cdef double total = 0
    for c in prange(nchunks, nogil=True, num_threads=num_threads, schedule="static"):
        lo = c * chunk
        total += hy_stream_sum(&x[lo], min(chunk, n - lo))
    return total


def _rows_per_pass(traits) -> str:
    """"weight rows per mat-vec pass: 8 q4_0 q4_1 ..., 1 others" from the traits table."""
    groups = {}
    for t in traits.values():
        groups.setdefault(t["rows_per_pass"], []).append(t["name"])
    parts = [f"{r} {' '.join(names)}" for r, names in sorted(groups.items(), reverse=True)]
    return "weight rows per mat-vec pass: " + "; ".join(parts)
