"""What the compiled CPU backend was built with, OpenMP thread control, and a read-bandwidth probe."""
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cdef extern from "omp_compat.h" nogil:
    int hy_have_openmp()
    int hy_omp_max_threads()
    void hy_omp_set_threads(int n)

cdef extern from "simd.h" nogil:
    int hy_simd_level()
    float hy_dot(const float *a, const float *b, long n)


def have_openmp():
    """True when the extension was compiled with OpenMP (False for HYBRID_NO_OPENMP=1 builds)."""
    return bool(hy_have_openmp())


def simd_level():
    """'avx2+fma+f16c', 'avx2+fma' or 'portable': the vector code compiled into the kernels."""
    return {3: "avx512", 2: "avx2+fma+f16c", 1: "avx2+fma", 0: "portable"}[hy_simd_level()]


def omp_max_threads():
    return hy_omp_max_threads()


def omp_set_threads(int n):
    hy_omp_set_threads(n)


def read_sum(const float[::1] x,  # IN [n] float32, ideally far larger than the caches
             int num_threads):
    """Sum of x[i]*x[i] over threads: a streaming read used to measure memory bandwidth."""
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t chunk = 1 << 16
    cdef Py_ssize_t nchunks = (n + chunk - 1) // chunk, c, lo
    cdef double total = 0
    for c in prange(nchunks, nogil=True, num_threads=num_threads, schedule="static"):
        lo = c * chunk
        total += hy_dot(&x[lo], &x[lo], min(chunk, n - lo))
    return total
