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
    enum: HY_Q_F16, HY_Q_F32, HY_Q_LAST
    ctypedef struct hy_q_traits:
        const char *name
        int block_values
        int block_bytes
        int integer
        int rows_per_pass
    const hy_q_traits *hy_q_traits_of(int type)
    const char *hy_q_simd()
    int hy_q_block_values(int type)
    int hy_q_block_bytes(int type)
    void hy_q_decode_row(int type, const uint8_t *row, float *y, long n)
    void hy_q_act(const float *x, long n, int8_t *qa, float *da, float *sa, float *s16)
    void hy_q_matvec_range(int type, const uint8_t *w, long row_bytes, long n, long o0, long o1,
                           int rows, const int8_t *qa, const float *da, const float *sa,
                           const float *s16, const uint8_t *prep, const float *x,
                           const float *bias, float *out, long ldo)
    long hy_q_stream_bytes(long n)
    int hy_q_uses_stream(int type)
    void hy_q_stream_acts(const int8_t *qa, const float *da, const float *sa, long n,
                          uint8_t *prep)
    void hy_q_panel_row(int type, const uint8_t *row, long n, uint8_t *v, float *c, float *m)
    int hy_q_gemm_panel_rows()
    void hy_q_half_sums(const int8_t *qa, long n, int32_t *asum16)
    void hy_q_gemm_panel(int type, long rows, long n, const int8_t *qa, const float *da,
                         const float *sa, const int32_t *a16, const uint8_t *v, const float *c,
                         const float *m, int np, uint8_t *vi, float *cT, float *mT, float *out,
                         long ldo)

cdef extern from "omp_compat.h" nogil:
    long hy_claim(long *counter, long n)

cdef extern from "gemm_f32.h" nogil:
    int hy_gemm_f32_available()
    void hy_gemm_f32_range(const float *x, long rows, const float *w, long n, long o0, long o1,
                           const float *bias, float *out, long ldo)

cdef enum:
    # Weight rows per parallel chunk of the float32 GEMM (a multiple of its 6-row tile).
    GEMM_F32_CHUNK = 48
    # A mat-vec's threads share its output rows in chunks of this many, so that a chunk is
    # one group of the 16-row kernels whatever the thread count.
    MATVEC_CHUNK = 16
    # Below this many weight bytes a mat-vec runs on the calling thread: waking a team costs
    # more than streaming the matrix.
    PARALLEL_MIN_BYTES = 49152
    # A mat-vec thread claims its share of the chunks in this many pieces (matvec_claimed)...
    PIECES_PER_SHARE = 8
    # ... of at least this many weight bytes.
    MIN_PIECE_BYTES = 262144
    # Threads whose claim counters live on the stack (more: on the heap).
    MAX_OWN_COUNTERS = 64

# Weight rows decoded into one thread's panel for the int8 GEMM: the lanes of one vector
# (16 with AVX-512, else 8).
cdef int GEMM_PANEL = hy_q_gemm_panel_rows()



def kernel_traits():
    """The C traits table (quant_traits.h) of every stored format, by kernel code: its name,
    values and bytes per block, whether its dot products take 8-bit activations, and the weight
    rows one pass of this build's mat-vec reads."""
    cdef const hy_q_traits *t
    table = {}
    for code in range(HY_Q_F16, HY_Q_LAST + 1):
        t = hy_q_traits_of(code)
        if t.block_values == 0:  # float32: the mat-vec's own rows, not a stored format
            continue
        table[code] = {"name": t.name.decode(), "block_values": t.block_values,
                       "block_bytes": t.block_bytes, "integer": bool(t.integer),
                       "rows_per_pass": t.rows_per_pass}
    return table


# the codes of the formats quantized with 8-bit activations
INTEGER_FORMATS = frozenset(c for c, t in kernel_traits().items() if t["integer"])

# Whether this build has its own float32 GEMM (AVX-512); without it BLAS multiplies float32 rows.
GEMM_F32 = bool(hy_gemm_f32_available())


cdef long check_weight(int qtype, const uint8_t[:, ::1] w, Py_ssize_t n_in) except -1:
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


def decode_rows(int qtype,
                const uint8_t[:, ::1] w,     # IN  [out, row_bytes] encoded rows
                Py_ssize_t n_in,
                Py_ssize_t r0, Py_ssize_t r1,
                float[:, ::1] out,           # OUT [r1 - r0, n_in] float32
                int num_threads):
    """out[i] = the values of row r0 + i (decoded exactly as gguf.quants does)."""
    check_weight(qtype, w, n_in)
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
    check_weight(qtype, w, n_in)
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


cdef const float *_bias_ptr(bias, Py_ssize_t n_out, str who) except? NULL:
    """Address of a float32 bias of n_out entries (None: NULL); the caller keeps `bias` alive."""
    cdef const float[::1] b
    if bias is None:
        return NULL
    b = bias
    if b.shape[0] != n_out:
        raise ValueError(f"{who}bias has {b.shape[0]} entries for {n_out} outputs")
    if n_out == 0:
        return NULL
    return &b[0]


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
    check_weight(qtype, w, n_in)
    if qtype not in INTEGER_FORMATS:
        raise ValueError(f"gemm serves the integer formats, not code {qtype}")
    if out.shape[0] != rows or out.shape[1] != n_out:
        raise ValueError(f"out has shape {tuple(out.shape)[:2]}, expected {(rows, n_out)}")
    cdef const float *bp = NULL
    bp = _bias_ptr(bias, n_out, "")
    if rows == 0 or n_out == 0:
        return
    cdef Py_ssize_t nb = n_in // 32, n16 = n_in // 16, r, p, i, j
    cdef Py_ssize_t npanels = (n_out + GEMM_PANEL - 1) // GEMM_PANEL
    cdef int8_t *qa = <int8_t *> hy_alloc64(rows * n_in)
    cdef float *da = <float *> hy_alloc64(sizeof(float) * rows * nb)
    cdef float *sa = <float *> hy_alloc64(sizeof(float) * rows * nb)
    cdef int32_t *a16 = <int32_t *> hy_alloc64(sizeof(int32_t) * rows * n16)
    # per thread: one panel of weight rows decoded (v, c, m), then interleaved (vi, cT, mT)
    cdef Py_ssize_t nt = max(1, num_threads)
    cdef Py_ssize_t f_c = 0, f_ct = f_c + GEMM_PANEL * n16, f_m = f_ct + GEMM_PANEL * n16
    cdef Py_ssize_t f_mt = f_m + GEMM_PANEL * n16, nfloats = f_mt + GEMM_PANEL * n16
    cdef Py_ssize_t per_thread = (2 * GEMM_PANEL * n_in + sizeof(float) * nfloats + 63) // 64 * 64
    cdef uint8_t *scratch = <uint8_t *> hy_alloc64(nt * per_thread)
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
            # panels handed out one at a time: when one core is slowed (a shared machine) the
            # other takes more panels; a panel's result does not depend on the thread
            for p in prange(npanels, num_threads=num_threads, schedule="dynamic"):
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


cdef inline bint _integer(int code) noexcept nogil:
    """Formats quantized with 8-bit activations (INTEGER_FORMATS)."""
    cdef const hy_q_traits *t = hy_q_traits_of(code)
    return t != NULL and t.integer != 0


cdef void matvec_group(const QuantMat *mats, int count, const float *x, long n_in, int rows,
                       int8_t *qa, float *da, float *sa, float *s16, uint8_t *prep,
                       int num_threads) noexcept nogil:
    """out_i = x @ W_i.T (+ bias_i) for `count` (<= 4) matrices reading the same x [rows, n_in]:
    x quantized once into qa/da/sa/s16 (rows * n_in, rows * n_in/32, the same, twice that) and,
    for the formats the stream kernel serves, laid out for it in prep (rows *
    hy_q_stream_bytes(n_in)), then the chunks of MATVEC_CHUNK rows of every matrix shared by
    the threads (matvec_claimed), or all on this thread when the matrices are small.  Each
    output row takes the same operations however the rows are shared."""
    cdef long first_chunk[5]
    cdef long total = 0, nb = n_in // 32
    cdef int i, r, integer = 0, stream = 0
    cdef long pstride = hy_q_stream_bytes(n_in)
    first_chunk[0] = 0
    for i in range(count):
        total += mats[i].n_out * mats[i].row_bytes
        integer = integer or _integer(mats[i].code)
        stream = stream or hy_q_uses_stream(mats[i].code)
        first_chunk[i + 1] = first_chunk[i] + (mats[i].n_out + MATVEC_CHUNK - 1) // MATVEC_CHUNK
    if integer:
        for r in range(rows):
            hy_q_act(x + r * n_in, n_in, qa + r * n_in, da + r * nb, sa + r * nb, s16 + r * 2 * nb)
            if stream:
                hy_q_stream_acts(qa + r * n_in, da + r * nb, sa + r * nb, n_in, prep + r * pstride)
    if total < PARALLEL_MIN_BYTES or num_threads <= 1:  # no parallel region at all
        for i in range(count):
            hy_q_matvec_range(mats[i].code, mats[i].w, mats[i].row_bytes, n_in, 0, mats[i].n_out,
                              rows, qa, da, sa, s16, prep, x, mats[i].bias, mats[i].out,
                              mats[i].n_out)
        return
    _matvec_claimed(mats, count, first_chunk, total, n_in, rows, qa, da, sa, s16, prep, x,
                    num_threads)


cdef void _matvec_claimed(const QuantMat *mats, int count, const long *first_chunk, long total,
                          long n_in, int rows, const int8_t *qa, const float *da,
                          const float *sa, const float *s16, const uint8_t *prep,
                          const float *x, int nt) noexcept nogil:
    """The C = first_chunk[count] chunks of matvec_group's matrices (total bytes) over nt
    threads.  Thread t owns the chunks [C*t/nt, C*(t+1)/nt) and claims them front to back in
    pieces from a counter of its own, so that it reads one forward stream, as a static split
    would; when its share is done it claims the pieces left in the other threads' shares.  On a
    shared machine one core is often slowed for a while, and a static split then waits at the
    region's end for the slow core's whole share.  A piece is an eighth of a share, or
    MIN_PIECE_BYTES if that is more (smaller pieces would make the kernels read short
    streams)."""
    cdef long own[MAX_OWN_COUNTERS * 8]   # thread u's next chunk at counter[8u] (its own line)
    cdef long *counter = own
    cdef long c, c_end, hi, o0, o1
    cdef int k, u, m
    cdef Py_ssize_t t
    cdef long C = first_chunk[count]
    cdef long piece = max((C // nt + PIECES_PER_SHARE - 1) // PIECES_PER_SHARE,
                          MIN_PIECE_BYTES * C // total + 1)
    if nt > MAX_OWN_COUNTERS:
        counter = <long *> malloc(sizeof(long) * 8 * nt)
        if counter == NULL:  # no memory for the counters: the first MAX_OWN_COUNTERS threads
            counter, nt = own, MAX_OWN_COUNTERS
    for u in range(nt):
        counter[8 * u] = C * u // nt
    for t in prange(nt, num_threads=nt, schedule="static"):
        for k in range(nt):  # its own share first, then the others'
            u = (t + k) % nt
            hi = C * (u + 1) // nt
            while True:
                c = hy_claim(&counter[8 * u], piece)
                if c >= hi:
                    break
                c_end = min(c + piece, hi)
                m = 0
                while c < c_end:  # the piece's part in each matrix it covers
                    while c >= first_chunk[m + 1]:
                        m = m + 1
                    o0 = (c - first_chunk[m]) * MATVEC_CHUNK
                    o1 = min((min(c_end, first_chunk[m + 1]) - first_chunk[m]) * MATVEC_CHUNK,
                             mats[m].n_out)
                    hy_q_matvec_range(mats[m].code, mats[m].w, mats[m].row_bytes, n_in, o0, o1,
                                      rows, qa, da, sa, s16, prep, x, mats[m].bias,
                                      mats[m].out, mats[m].n_out)
                    c = min(c_end, first_chunk[m + 1])
    if counter != own:
        free(counter)


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
    cdef QuantMat ms[4]
    cdef const uint8_t[:, ::1] w
    cdef float[:, ::1] o
    cdef bint integer = False
    for k in range(nm):
        code, w, bias, o = mats[k]
        ms[k].code = code
        ms[k].row_bytes = check_weight(code, w, n_in)
        ms[k].n_out = w.shape[0]
        if o.shape[0] != rows or o.shape[1] != ms[k].n_out:
            raise ValueError(f"out {k} has shape {tuple(o.shape)[:2]}, expected "
                             f"{(rows, ms[k].n_out)}")
        ms[k].w = &w[0, 0]
        ms[k].out = &o[0, 0]
        ms[k].bias = NULL
        ms[k].bias = _bias_ptr(bias, ms[k].n_out, f"matrix {k}: ")
        integer = integer or _integer(code)
    if rows == 0:
        return
    cdef int8_t *qa = NULL
    cdef float *da = NULL
    cdef float *sa = NULL
    cdef float *s16 = NULL
    cdef uint8_t *prep = NULL
    if integer:
        qa = <int8_t *> hy_alloc64(rows * n_in)
        da = <float *> hy_alloc64(sizeof(float) * rows * nb)
        sa = <float *> hy_alloc64(sizeof(float) * rows * nb)
        s16 = <float *> hy_alloc64(sizeof(float) * rows * 2 * nb)
        prep = <uint8_t *> hy_alloc64(rows * hy_q_stream_bytes(n_in) + 1)
        if qa == NULL or da == NULL or sa == NULL or s16 == NULL or prep == NULL:
            free(qa); free(da); free(sa); free(s16); free(prep)
            raise MemoryError()
    try:
        with nogil:
            matvec_group(ms, nm, &x[0, 0], n_in, <int> rows, qa, da, sa, s16, prep, num_threads)
    finally:
        free(qa); free(da); free(sa); free(s16); free(prep)


cdef extern from "simd.h" nogil:
    void *hy_alloc64(size_t n)
    float hy_dot_stream(const float *a, const float *b, long n)


cdef const float *_f32_args(const float[:, ::1] w, const float[:, ::1] x, bias, float[:, :] out,
                            str who) except? NULL:
    """Checks the float32 kernels' arguments (out [rows, out] with contiguous rows); returns the
    bias address (NULL: none).  With no input values out is just the bias (or zeros)."""
    cdef Py_ssize_t r, o
    cdef const float *bp
    if w.shape[1] != x.shape[1] or out.shape[0] != x.shape[0] or out.shape[1] != w.shape[0]:
        raise ValueError(f"{who}: w {tuple(w.shape)[:2]}, x {tuple(x.shape)[:2]}, "
                         f"out {tuple(out.shape)[:2]} do not fit")
    if out.shape[1] > 0 and out.strides[1] != sizeof(float):
        raise ValueError(f"{who}: out's rows must be contiguous")
    bp = _bias_ptr(bias, w.shape[0], who + ": ")
    if x.shape[1] == 0:
        for r in range(out.shape[0]):
            for o in range(out.shape[1]):
                out[r, o] = bp[o] if bp != NULL else 0.0
    return bp


def matvec_f32(const float[:, ::1] w,   # IN  [out, in] float32 weight rows
               const float[:, ::1] x,   # IN  [rows, in] float32 activations
               bias,                    # IN  [out] float32 or None
               float[:, ::1] out,       # OUT [rows, out]
               int num_threads):
    """out = x @ W.T (+ bias) for float32 weights, each weight row streamed from memory once
    (prefetched) for all rows of x, the rows shared by the threads as the quantized formats'
    (matvec_group); every row's sums in the same order whatever the row or thread count."""
    cdef Py_ssize_t n = x.shape[1], rows = x.shape[0]
    cdef const float *bp = _f32_args(w, x, bias, out, "matvec_f32")
    if rows == 0 or w.shape[0] == 0 or n == 0:
        return
    cdef QuantMat m
    m.code = HY_Q_F32
    m.w = <const uint8_t *> &w[0, 0]
    m.row_bytes = n * sizeof(float)
    m.n_out = w.shape[0]
    m.bias = bp
    m.out = &out[0, 0]
    with nogil:
        matvec_group(&m, 1, &x[0, 0], n, <int> rows, NULL, NULL, NULL, NULL, NULL, num_threads)


def gemm_f32(const float[:, ::1] w,   # IN  [out, in] float32 weight rows
             const float[:, ::1] x,   # IN  [rows, in] float32 activations
             bias,                    # IN  [out] float32 or None
             float[:, :] out,         # OUT [rows, out], rows contiguous (a column slice is fine)
             int num_threads):
    """out = x @ W.T (+ bias) for many rows (prefill) with the AVX-512 tile of gemm_f32.h, threads
    over chunks of weight rows.  Each output's sums run in a fixed order that depends on neither
    the number of rows nor the thread count.  Only where GEMM_F32 is true."""
    cdef Py_ssize_t n = x.shape[1], rows = x.shape[0], n_out = w.shape[0], c
    if not GEMM_F32:
        raise RuntimeError("gemm_f32: this build has no AVX-512 float32 GEMM (use BLAS)")
    cdef const float *bp = _f32_args(w, x, bias, out, "gemm_f32")
    if rows == 0 or n_out == 0 or n == 0:
        return
    cdef Py_ssize_t nchunks = (n_out + GEMM_F32_CHUNK - 1) // GEMM_F32_CHUNK
    cdef long ldo = out.strides[0] // sizeof(float)
    # chunks handed out one at a time, as the integer GEMM's panels
    for c in prange(nchunks, nogil=True, num_threads=num_threads, schedule="dynamic"):
        hy_gemm_f32_range(&x[0, 0], rows, &w[0, 0], n, c * GEMM_F32_CHUNK,
                          min((c + 1) * GEMM_F32_CHUNK, n_out), bp, &out[0, 0], ldo)
