"""CPU kernels for weights kept in their file encoding (F16, BF16 and GGUF's block formats).

Weights arrive as uint8 [out_features, row_bytes] arrays (often read-only views of a memory-mapped
file); the format code is one of quant.h's HY_Q_* values, checked against the row size here.
Thin `def` wrappers validate, then `nogil` loops run over OpenMP threads (see quant.h for the
kernels themselves).
"""
from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

cdef extern from "quant.h" nogil:
    const char *hy_q_simd()
    int hy_q_block_values(int type)
    int hy_q_block_bytes(int type)
    void hy_q_decode_row(int type, const uint8_t *row, float *y, long n)
    void hy_q_act(const float *x, long n, int8_t *qa, float *da, float *sa, float *s16)
    void hy_q_matvec_range(int type, const uint8_t *w, long row_bytes, long n, long o0, long o1,
                           int rows, const int8_t *qa, const float *da, const float *sa,
                           const float *s16, const float *x, const float *bias, float *out,
                           long ldo)
    void hy_q_panel_row(int type, const uint8_t *row, long n, uint8_t *v, float *c, float *m)
    int hy_q_gemm_panel_rows()
    void hy_q_half_sums(const int8_t *qa, long n, int32_t *asum16)
    void hy_q_gemm_panel(int type, long rows, long n, const int8_t *qa, const float *da,
                         const float *sa, const int32_t *a16, const uint8_t *v, const float *c,
                         const float *m, int np, uint8_t *vi, float *cT, float *mT, float *out,
                         long ldo)

cdef enum:
    # Output rows per parallel chunk of a mat-vec.
    MATVEC_CHUNK = 16
    # Below this many weight bytes a mat-vec runs on the calling thread: waking a team costs
    # more than streaming the matrix.
    PARALLEL_MIN_BYTES = 49152

# Weight rows decoded into one thread's panel for the int8 GEMM: the lanes of one vector
# (16 with AVX-512, else 8).
cdef int GEMM_PANEL = hy_q_gemm_panel_rows()

INTEGER_FORMATS = frozenset([3, 4, 5, 6, 7, 8, 9, 10])  # quantized with 8-bit activations


cdef long _check(int qtype, const uint8_t[:, ::1] w, Py_ssize_t n_in) except -1:
    cdef int bv = hy_q_block_values(qtype)
    if bv == 0:
        raise ValueError(f"unknown weight format code {qtype}")
    if n_in <= 0 or n_in % bv:
        raise ValueError(f"rows of {n_in} values do not split into blocks of {bv}")
    cdef long row_bytes = n_in // bv * hy_q_block_bytes(qtype)
    if w.shape[1] != row_bytes:
        raise ValueError(f"weight rows hold {w.shape[1]} bytes; {n_in} values need {row_bytes}")
    return row_bytes


def simd():
    """'avx2+vnni', 'avx2' or 'portable': the instructions the quantized-weight kernels use."""
    return hy_q_simd().decode()


def block_shape(int qtype):
    """(values per block, bytes per block) of a format code."""
    return hy_q_block_values(qtype), hy_q_block_bytes(qtype)


def decode_rows(int qtype,
                const uint8_t[:, ::1] w,     # IN  [out, row_bytes] encoded rows
                Py_ssize_t n_in,
                Py_ssize_t r0, Py_ssize_t r1,
                float[:, ::1] out,           # OUT [r1 - r0, n_in] float32
                int num_threads):
    """out[i] = the values of row r0 + i (decoded exactly as gguf.quants does)."""
    _check(qtype, w, n_in)
    if not (0 <= r0 <= r1 <= w.shape[0]):
        raise ValueError(f"row range {r0}:{r1} outside 0:{w.shape[0]}")
    if out.shape[0] != r1 - r0 or out.shape[1] != n_in:
        raise ValueError(f"out has shape {tuple(out.shape)[:2]}, expected {(r1 - r0, n_in)}")
    cdef Py_ssize_t r
    cdef int nt = num_threads if (r1 - r0) * w.shape[1] >= PARALLEL_MIN_BYTES else 1
    for r in prange(r1 - r0, nogil=True, num_threads=nt, schedule="static"):
        hy_q_decode_row(qtype, &w[r0 + r, 0], &out[r, 0], n_in)


def gather_rows(int qtype,
                const uint8_t[:, ::1] w,     # IN  [out, row_bytes]
                Py_ssize_t n_in,
                const int64_t[::1] ids,      # IN  [k] row indices (checked)
                float[:, ::1] out):          # OUT [k, n_in]
    """out[i] = the values of row ids[i] (embedding lookup)."""
    _check(qtype, w, n_in)
    cdef Py_ssize_t i, k = ids.shape[0]
    if out.shape[0] != k or out.shape[1] != n_in:
        raise ValueError(f"out has shape {tuple(out.shape)[:2]}, expected {(k, n_in)}")
    for i in range(k):
        if ids[i] < 0 or ids[i] >= w.shape[0]:
            raise IndexError(f"row {ids[i]} outside 0..{w.shape[0] - 1}")
    with nogil:
        for i in range(k):
            hy_q_decode_row(qtype, &w[ids[i], 0], &out[i, 0], n_in)


def quantize_activations(const float[:, ::1] x,   # IN  [rows, n] float32, n % 32 == 0
                         int8_t[:, ::1] qa,        # OUT [rows, n]
                         float[:, ::1] da,         # OUT [rows, n/32] block scales
                         float[:, ::1] sa):        # OUT [rows, n/32] scale * sum of the block
    """The 8-bit blocks the integer dot products read (exposed for tests)."""
    cdef Py_ssize_t r, rows = x.shape[0], n = x.shape[1]
    if n % 32 or qa.shape[0] != rows or qa.shape[1] != n or da.shape[1] != n // 32 \
            or sa.shape[1] != n // 32 or da.shape[0] != rows or sa.shape[0] != rows:
        raise ValueError("quantize_activations: inconsistent shapes")
    with nogil:
        for r in range(rows):
            hy_q_act(&x[r, 0], n, &qa[r, 0], &da[r, 0], &sa[r, 0], NULL)


def matvec(int qtype,
           const uint8_t[:, ::1] w,          # IN  [out, row_bytes] encoded rows
           const float[:, ::1] x,            # IN  [rows, in] float32 activations
           bias,                             # IN  [out] float32 or None
           float[:, ::1] out,                # OUT [rows, out]
           int num_threads):
    """out = x @ W.T (+ bias), each weight row streamed once for all rows of x.

    Integer formats quantize x once to 8-bit blocks of 32 and use integer dot products; F16 and
    BF16 widen the weights and multiply the float32 x."""
    matvec_many([(qtype, w, bias, out)], x, num_threads)


def gemm(int qtype,
         const uint8_t[:, ::1] w,          # IN  [out, row_bytes] encoded rows (an integer format)
         const float[:, ::1] x,            # IN  [rows, in] float32 activations
         bias,                             # IN  [out] float32 or None
         float[:, ::1] out,                # OUT [rows, out]
         int num_threads):
    """out = x @ W.T (+ bias) for many rows (prefill): 8-bit activations times panels of weight
    rows decoded to 8-bit integers with a factor and an offset per 16 values."""
    cdef Py_ssize_t n_in = x.shape[1], rows = x.shape[0], n_out = w.shape[0]
    _check(qtype, w, n_in)
    if qtype not in INTEGER_FORMATS:
        raise ValueError(f"gemm serves the integer formats, not code {qtype}")
    if out.shape[0] != rows or out.shape[1] != n_out:
        raise ValueError(f"out has shape {tuple(out.shape)[:2]}, expected {(rows, n_out)}")
    cdef const float[::1] b
    cdef const float *bp = NULL
    if bias is not None:
        b = bias
        if b.shape[0] != n_out:
            raise ValueError(f"bias has {b.shape[0]} entries for {n_out} outputs")
        bp = &b[0]
    if rows == 0 or n_out == 0:
        return
    cdef Py_ssize_t nb = n_in // 32, n16 = n_in // 16, r, p, i, j
    cdef Py_ssize_t npanels = (n_out + GEMM_PANEL - 1) // GEMM_PANEL
    cdef int8_t *qa = <int8_t *> malloc(rows * n_in)
    cdef float *da = <float *> malloc(sizeof(float) * rows * nb)
    cdef float *sa = <float *> malloc(sizeof(float) * rows * nb)
    cdef int32_t *a16 = <int32_t *> malloc(sizeof(int32_t) * rows * n16)
    # per thread: one panel of weight rows decoded (v, c, m), then interleaved (vi, cT, mT)
    cdef Py_ssize_t nt = max(1, num_threads)
    cdef Py_ssize_t f_c = 0, f_ct = f_c + GEMM_PANEL * n16, f_m = f_ct + GEMM_PANEL * n16
    cdef Py_ssize_t f_mt = f_m + GEMM_PANEL * n16, nfloats = f_mt + GEMM_PANEL * nb
    cdef Py_ssize_t per_thread = 2 * GEMM_PANEL * n_in + sizeof(float) * nfloats
    cdef uint8_t *scratch = <uint8_t *> malloc(nt * per_thread)
    cdef uint8_t *v
    cdef uint8_t *vi
    cdef float *fl
    cdef int np_, tid
    cdef long o0
    if qa == NULL or da == NULL or sa == NULL or a16 == NULL or scratch == NULL:
        free(qa); free(da); free(sa); free(a16); free(scratch)
        raise MemoryError()
    try:
        with nogil:
            # 8-bit activations: values, scales, scaled block sums, integer sums per 16
            for r in prange(rows, num_threads=num_threads, schedule="static"):
                hy_q_act(&x[r, 0], n_in, qa + r * n_in, da + r * nb, sa + r * nb, NULL)
                hy_q_half_sums(qa + r * n_in, n_in, a16 + r * n16)
            for p in prange(npanels, num_threads=num_threads, schedule="static"):
                tid = threadid()
                fl = <float *> (scratch + tid * per_thread + 2 * GEMM_PANEL * n_in)
                v = scratch + tid * per_thread
                vi = v + GEMM_PANEL * n_in
                o0 = p * GEMM_PANEL
                np_ = <int> min(GEMM_PANEL, n_out - o0)
                if np_ < GEMM_PANEL:  # rows past the matrix: zero values, factors and offsets
                    memset(v, 0, GEMM_PANEL * n_in)
                    memset(fl, 0, sizeof(float) * nfloats)
                for i in range(np_):
                    hy_q_panel_row(qtype, &w[o0 + i, 0], n_in, v + i * n_in, fl + f_c + i * n16,
                                   fl + f_m + i * n16)
                hy_q_gemm_panel(qtype, rows, n_in, qa, da, sa, a16, v, fl + f_c, fl + f_m, np_,
                                vi, fl + f_ct, fl + f_mt, &out[0, o0], n_out)
                if bp != NULL:
                    for r in range(rows):
                        for j in range(np_):
                            out[r, o0 + j] += bp[o0 + j]
    finally:
        free(qa); free(da); free(sa); free(a16); free(scratch)


def matvec_many(list mats,                    # [(code, w [out_i, row_bytes_i] uint8, bias or None,
                                              #   out_i [rows, out_i] float32)], up to 4
                const float[:, ::1] x,        # IN  [rows, in] float32, shared by every matrix
                int num_threads):
    """out_i = x @ W_i.T (+ bias_i) for several weights that read the same x (Q/K/V, gate/up):
    x is quantized once, and one parallel region covers the rows of every matrix."""
    cdef Py_ssize_t n_in = x.shape[1], rows = x.shape[0], nb = n_in // 32
    cdef int k, nm = len(mats)
    if nm < 1 or nm > 4:
        raise ValueError(f"matvec_many takes 1..4 matrices, got {nm}")
    cdef int codes[4]
    cdef const uint8_t *wp[4]
    cdef const float *bp[4]
    cdef float *op[4]
    cdef long rb[4]
    cdef long nout[4]
    cdef long first_chunk[5]
    cdef const uint8_t[:, ::1] w
    cdef const float[::1] b
    cdef float[:, ::1] o
    cdef bint integer = False
    cdef long total_bytes = 0
    first_chunk[0] = 0
    for k in range(nm):
        code, w, bias, o = mats[k]
        codes[k] = code
        rb[k] = _check(code, w, n_in)
        nout[k] = w.shape[0]
        if o.shape[0] != rows or o.shape[1] != nout[k]:
            raise ValueError(f"out {k} has shape {tuple(o.shape)[:2]}, expected {(rows, nout[k])}")
        wp[k] = &w[0, 0]
        op[k] = &o[0, 0]
        bp[k] = NULL
        if bias is not None:
            b = bias
            if b.shape[0] != nout[k]:
                raise ValueError(f"bias {k} has {b.shape[0]} entries for {nout[k]} outputs")
            bp[k] = &b[0]
        integer = integer or code in INTEGER_FORMATS
        total_bytes += nout[k] * rb[k]
        first_chunk[k + 1] = first_chunk[k] + (nout[k] + MATVEC_CHUNK - 1) // MATVEC_CHUNK
    if rows == 0:
        return
    cdef int8_t *qa = NULL
    cdef float *da = NULL
    cdef float *sa = NULL
    cdef float *s16 = NULL
    cdef Py_ssize_t r, c
    cdef long o0, o1
    cdef int nt = num_threads if total_bytes >= PARALLEL_MIN_BYTES else 1
    if integer:
        qa = <int8_t *> malloc(rows * n_in)
        da = <float *> malloc(sizeof(float) * rows * nb)
        sa = <float *> malloc(sizeof(float) * rows * nb)
        s16 = <float *> malloc(sizeof(float) * rows * 2 * nb)
        if qa == NULL or da == NULL or sa == NULL or s16 == NULL:
            free(qa); free(da); free(sa); free(s16)
            raise MemoryError()
    try:
        with nogil:
            if integer:
                for r in range(rows):
                    hy_q_act(&x[r, 0], n_in, qa + r * n_in, da + r * nb, sa + r * nb,
                             s16 + r * 2 * nb)
            for c in prange(first_chunk[nm], num_threads=nt, schedule="static"):
                k = 0
                while c >= first_chunk[k + 1]:
                    k = k + 1
                o0 = (c - first_chunk[k]) * MATVEC_CHUNK
                o1 = min(o0 + MATVEC_CHUNK, nout[k])
                hy_q_matvec_range(codes[k], wp[k], rb[k], n_in, o0, o1, <int> rows, qa, da, sa,
                                  s16, &x[0, 0], bp[k], op[k], nout[k])
    finally:
        free(qa); free(da); free(sa); free(s16)


# ------------------------------------------------------------------ a quantized layer's decode step
cdef extern from "rowops.h" nogil:
    void hy_rmsnorm_row(const float *x, const float *weight, float eps, float *out, long dim)
    void hy_rope_row(float *x, int64_t position, const double *inv_freq, int num_heads,
                     int head_dim, int neox, float *cs, float *sn)

cdef extern from "simd.h" nogil:
    void hy_silu_mul(const float *g, const float *u, float *out, long n)


def decode_prologue(const float[:, ::1] x,      # IN  [1, hidden] the layer's input
                    const float[::1] attn_norm,  # IN  [hidden]
                    float eps,
                    list qkv,                    # [(code, w, bias, out)] for Q, K, V (outs [1, *])
                    float[:, ::1] h,             # scratch [1, hidden]: the normed input
                    float[:, ::1] q,             # the Q out of ``qkv`` [1, H*D]
                    float[:, ::1] k,             # the K out of ``qkv`` [1, KVH*D]
                    q_norm, k_norm,              # [D] float32 or None (Qwen3)
                    inv_freq,                    # [D/2] float64, or None: no RoPE
                    int64_t position, bint neox, int num_heads, int num_kv_heads, int head_dim,
                    int num_threads):
    """The attention block's prologue for one decode row, in one call: RMSNorm, Q/K/V
    projections (one parallel region), QK-norm, RoPE.  The same kernels as the op-by-op path."""
    cdef Py_ssize_t dim = x.shape[1], i
    cdef const float[::1] qn, kn
    cdef const double[::1] f
    cdef float cs[512]
    cdef float sn[512]
    if x.shape[0] != 1 or h.shape[1] != dim or attn_norm.shape[0] != dim or head_dim > 1024:
        raise ValueError("decode_prologue: one row of the layer's width, head_dim <= 1024")
    if q.shape[1] != num_heads * head_dim or k.shape[1] != num_kv_heads * head_dim:
        raise ValueError("decode_prologue: q/k widths do not match the heads")
    with nogil:
        hy_rmsnorm_row(&x[0, 0], &attn_norm[0], eps, &h[0, 0], dim)
    matvec_many(qkv, h, num_threads)
    if q_norm is not None:
        qn = q_norm
        kn = k_norm
        with nogil:
            for i in range(num_heads):
                hy_rmsnorm_row(&q[0, i * head_dim], &qn[0], eps, &q[0, i * head_dim], head_dim)
            for i in range(num_kv_heads):
                hy_rmsnorm_row(&k[0, i * head_dim], &kn[0], eps, &k[0, i * head_dim], head_dim)
    if inv_freq is not None:
        f = inv_freq
        with nogil:
            hy_rope_row(&q[0, 0], position, &f[0], num_heads, head_dim, neox, cs, sn)
            hy_rope_row(&k[0, 0], position, &f[0], num_kv_heads, head_dim, neox, cs, sn)


def decode_epilogue(const float[:, ::1] att,    # IN  [1, H*D] attention output
                    const float[:, ::1] x,      # IN  [1, hidden] the layer's input
                    list wo,                    # [(code, w, None, o)]: o [1, hidden] scratch
                    const float[::1] mlp_norm,  # IN  [hidden]
                    float eps,
                    list gate_up,               # [(code, w_gate, None, gate), (code, w_up, None, up)]
                    list down,                  # [(code, w_down, None, o)]: the same o
                    float[:, ::1] o,            # the scratch named in ``wo`` and ``down``
                    float[:, ::1] x1,           # scratch [1, hidden]: x + attention
                    float[:, ::1] h2,           # scratch [1, hidden]: normed x1
                    float[:, ::1] gate,         # the gate out of ``gate_up`` (SwiGLU in place)
                    float[:, ::1] up,           # the up out of ``gate_up``
                    float[:, ::1] out,          # OUT [1, hidden] (may be x)
                    int num_threads):
    """O projection, residual, RMSNorm, gate/up (one parallel region), SwiGLU, down projection,
    residual: the rest of a decode row's layer step in one call."""
    cdef Py_ssize_t dim = x.shape[1], d, inter = gate.shape[1]
    if x.shape[0] != 1 or out.shape[1] != dim or x1.shape[1] != dim or h2.shape[1] != dim \
            or o.shape[1] != dim or up.shape[1] != inter or mlp_norm.shape[0] != dim:
        raise ValueError("decode_epilogue: inconsistent shapes")
    matvec_many(wo, att, num_threads)
    with nogil:
        for d in range(dim):
            x1[0, d] = x[0, d] + o[0, d]
        hy_rmsnorm_row(&x1[0, 0], &mlp_norm[0], eps, &h2[0, 0], dim)
    matvec_many(gate_up, h2, num_threads)
    with nogil:
        hy_silu_mul(&gate[0, 0], &up[0, 0], &gate[0, 0], inter)
    matvec_many(down, gate, num_threads)
    with nogil:
        for d in range(dim):
            out[0, d] = x1[0, d] + o[0, d]
