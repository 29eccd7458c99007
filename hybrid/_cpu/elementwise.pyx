"""Row-wise CPU kernels of the decoder layer: RMSNorm, RoPE, SwiGLU, residual add.

Each `def` is a thin wrapper: typed memoryviews reject wrong dtypes and non-contiguous arrays,
shapes are checked, then the work runs without the GIL over OpenMP threads.  Callers (hybrid/ops.py)
have already converted and validated user input; these wrappers are the last line of defence.
"""
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cdef extern from "simd.h" nogil:
    void hy_silu_mul(const float *g, const float *u, float *out, long n)

cdef extern from "rowops.h" nogil:
    void hy_rmsnorm_row(const float *x, const float *weight, float eps, float *out, long dim)
    void hy_rope_angles(int64_t position, const double *inv_freq, int half, float *cs, float *sn)
    void hy_rope_apply(float *x, int num_heads, int head_dim, int neox, const float *cs,
                       const float *sn)

cdef enum:
    # Elements per parallel chunk of the flat kernels (SwiGLU, add).
    FLAT_CHUNK = 16384
    # Below this many elements a kernel runs on the calling thread: waking a team costs more
    # than the work (a decode step's norms and RoPE are a few thousand elements).
    PARALLEL_MIN_ELEMENTS = 65536


cdef inline int _threads_for(Py_ssize_t elements, int num_threads) noexcept nogil:
    return num_threads if elements >= PARALLEL_MIN_ELEMENTS else 1


def rmsnorm(const float[:, ::1] x,   # IN  [rows, dim] float32
            const float[::1] weight, # IN  [dim] float32
            float eps,
            float[:, ::1] out,       # OUT [rows, dim] float32 (may be x itself)
            int num_threads):
    """out[r] = x[r] / sqrt(mean(x[r]**2) + eps) * weight, normalised in fp32."""
    cdef Py_ssize_t rows = x.shape[0], dim = x.shape[1]
    if weight.shape[0] != dim:
        raise ValueError(f"rmsnorm: weight has {weight.shape[0]} entries, rows have {dim}")
    if out.shape[0] != rows or out.shape[1] != dim:
        raise ValueError(f"rmsnorm: out shape {tuple(out.shape)[:2]} != x shape {(rows, dim)}")
    if rows == 0 or dim == 0:
        return
    cdef Py_ssize_t r
    for r in prange(rows, nogil=True, num_threads=_threads_for(rows * dim, num_threads),
                    schedule="static"):
        hy_rmsnorm_row(&x[r, 0], &weight[0], eps, &out[r, 0], dim)


def rope_angles(const int64_t[::1] positions,  # IN  [rows] position of each row
                const double[::1] inv_freq,     # IN  [half] angle per position of each pair
                float[:, ::1] cs,               # OUT [rows, half] cos of each angle
                float[:, ::1] sn,               # OUT [rows, half] sin
                int num_threads):
    """Rotary position embedding, step 1: the cos/sin of each row's angles (formed in float64),
    computed once and shared by every layer of a step and by Q and K (rope_apply)."""
    cdef Py_ssize_t rows = positions.shape[0], r
    cdef int half = inv_freq.shape[0]
    if cs.shape[0] != rows or sn.shape[0] != rows or cs.shape[1] != half or sn.shape[1] != half:
        raise ValueError(f"rope_angles: cs and sn must be [{rows}, {half}]")
    if rows == 0 or half == 0:
        return
    for r in prange(rows, nogil=True, num_threads=_threads_for(rows * half * 16, num_threads),
                    schedule="static"):
        hy_rope_angles(positions[r], &inv_freq[0], half, &cs[r, 0], &sn[r, 0])


def rope_apply(float[:, ::1] x,          # IN/OUT [rows, num_heads*head_dim] float32
               const float[:, ::1] cs,   # IN  [rows, head_dim/2] from rope_angles
               const float[:, ::1] sn,   # IN  [rows, head_dim/2]
               int num_heads, int head_dim, bint neox, int num_threads):
    """Rotary position embedding, step 2: rotate each row's heads by its angles' cos/sin
    (neox: pairs (i, i+head_dim/2); otherwise (2i, 2i+1))."""
    cdef Py_ssize_t rows = x.shape[0], r
    if head_dim <= 0 or head_dim % 2 != 0:
        raise ValueError(f"rope_apply: head_dim must be even and positive, got {head_dim}")
    if x.shape[1] != <Py_ssize_t> num_heads * head_dim:
        raise ValueError(f"rope_apply: rows have {x.shape[1]} values, expected num_heads*head_dim "
                         f"= {num_heads * head_dim}")
    if cs.shape[0] != rows or sn.shape[0] != rows or cs.shape[1] != head_dim // 2 \
            or sn.shape[1] != head_dim // 2:
        raise ValueError(f"rope_apply: cs and sn must be [{rows}, {head_dim // 2}]")
    if rows == 0:
        return
    for r in prange(rows, nogil=True, num_threads=_threads_for(rows * x.shape[1], num_threads),
                    schedule="static"):
        hy_rope_apply(&x[r, 0], num_heads, head_dim, neox, &cs[r, 0], &sn[r, 0])


def swiglu(const float[::1] gate,  # IN  [n] float32 (flattened [rows, intermediate])
           const float[::1] up,    # IN  [n] float32
           float[::1] out,         # OUT [n] float32 = silu(gate) * up
           int num_threads):
    """out = gate * sigmoid(gate) * up."""
    cdef Py_ssize_t n = gate.shape[0]
    if up.shape[0] != n or out.shape[0] != n:
        raise ValueError(f"swiglu: gate ({n}), up ({up.shape[0]}) and out ({out.shape[0]}) differ")
    if n == 0:
        return
    cdef Py_ssize_t c, nchunks = (n + FLAT_CHUNK - 1) // FLAT_CHUNK, lo
    for c in prange(nchunks, nogil=True, num_threads=_threads_for(n, num_threads),
                    schedule="static"):
        lo = c * FLAT_CHUNK
        hy_silu_mul(&gate[lo], &up[lo], &out[lo], min(<Py_ssize_t> FLAT_CHUNK, n - lo))


def add(const float[::1] a,   # IN  [n] float32
        const float[::1] b,   # IN  [n] float32
        float[::1] out,       # OUT [n] float32 = a + b (may alias a or b)
        int num_threads):
    """Residual add."""
    cdef Py_ssize_t n = a.shape[0]
    if b.shape[0] != n or out.shape[0] != n:
        raise ValueError(f"add: a ({n}), b ({b.shape[0]}) and out ({out.shape[0]}) differ")
    cdef Py_ssize_t i
    for i in prange(n, nogil=True, num_threads=_threads_for(n, num_threads),
                    schedule="static"):
        out[i] = a[i] + b[i]
