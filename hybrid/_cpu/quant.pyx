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
    int hy_q_weight_pf()
    int hy_q_stream_many(int rows)
    void hy_q_stream_force(int many)
    int hy_q_block_values(int type)
    int hy_q_block_bytes(int type)
    void hy_q_decode_row(int type, const uint8_t *row, float *y, long n)
    void hy_q_act(const float *x, long n, long group, int8_t *qa, float *da, float *sa,
                  float *s16)
    int hy_q_act_group(int type)
    void hy_q_matvec_range(int type, const uint8_t *w, long row_bytes, long n, long o0, long o1,
                           int rows, const int8_t *qa, const float *da, const float *sa,
                           const float *s16, const uint8_t *prep, const float *x,
                           const float *bias, float *out, long ldo)
    long hy_q_prep_bytes(long n)
    int hy_q_prep_flags(int type)
    void hy_q_prep_acts(const int8_t *qa, const float *da, const float *sa, long n, int rows,
                        int flags, uint8_t *prep)
    int hy_q_gemm_panel_rows()
    void hy_q_half_sums(const int8_t *qa, long n, int32_t *asum16)
    void hy_q_gemm_panel(int type, long rows, long n, const int8_t *qa, const float *da,
                         const float *sa, const int32_t *a16, const uint8_t *w, long row_bytes,
                         int np, uint8_t *tmp, uint8_t *vi, float *cT, float *mT, float *out,
                         long ldo, const uint8_t *next, long next_bytes)

cdef extern from "omp_compat.h" nogil:
    long hy_claim(long *counter, long n)

cdef extern from "gemm_f32.h" nogil:
    int hy_gemm_f32_lanes()
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
GEMM_F32_LANES = hy_gemm_f32_lanes()  # 16: AVX-512, 8: AVX2, 0: none (BLAS)
GEMM_F32 = GEMM_F32_LANES > 0


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


def weight_prefetch():
    """How the kernels prefetch a weight stream on this core: '' (portable builds, none), 'far
    into L1' or 'near into L1 and far into L2 (Intel)'."""
    return {0: "", 1: "far into L1", 2: "near into L1 and far into L2 (Intel)"}[hy_q_weight_pf()]


def stream_arrangement(int rows):
    """The arrangement of the AVX-512 Q4_0/Q4_1/Q5_0/Q5_1 stream kernel (quant_stream.h) for a
    call of `rows` activation rows on this core: 'few', 'many', or '' (no such kernel here)."""
    return {-1: "", 0: "few", 1: "many"}[hy_q_stream_many(rows)]


def _force_stream_arrangement(many):
    """For tests: later calls take the "many" arrangement from three rows (True), "few" always
    (False), or the core's choice (None)."""
    hy_q_stream_force(-1 if many is None else int(bool(many)))


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


def quantize_activations(const float[:, ::1] x,   # IN  [rows, n] float32, n % group == 0
                         int8_t[:, ::1] qa,        # OUT [rows, n]
                         float[:, ::1] da,         # OUT [rows, n/32] scale of each block's group
                         float[:, ::1] sa,         # OUT [rows, n/32] scale * sum of the block
                         int group=32):            # values per scale: 32 or 256
    """The 8-bit activations the integer dot products read (exposed for tests)."""
    cdef Py_ssize_t r, rows = x.shape[0], n = x.shape[1]
    if group not in (32, 256):
        raise ValueError(f"quantize_activations: group {group} is neither 32 nor 256")
    if n % group or qa.shape[0] != rows or qa.shape[1] != n or da.shape[1] != n // 32 \
            or sa.shape[1] != n // 32 or da.shape[0] != rows or sa.shape[0] != rows:
        raise ValueError("quantize_activations: inconsistent shapes")
    with nogil:
        for r in range(rows):
            hy_q_act(&x[r, 0], n, group, &qa[r, 0], &da[r, 0], &sa[r, 0], NULL)


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


cdef int _fill_mat(QuantMat *m, code, const uint8_t[:, ::1] w, bias, float[:, ::1] o,
                   Py_ssize_t n_in, Py_ssize_t rows, str who) except -1:
    """m from one (code, w, bias, out) argument tuple, checked against x [rows, n_in]; the
    ValueError (after ``who``) names what does not fit."""
    m.code = code
    m.row_bytes = check_weight(code, w, n_in)
    m.n_out = w.shape[0]
    if o.shape[0] != rows or o.shape[1] != m.n_out:
        raise ValueError(f"{who}out has shape {tuple(o.shape)[:2]}, expected {(rows, m.n_out)}")
    m.w = &w[0, 0] if m.n_out else NULL
    m.out = &o[0, 0] if m.n_out and rows else NULL
    m.bias = _bias_ptr(bias, m.n_out, who)
    return 0


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
    gemm_sets([(x, [(qtype, w, bias, out)])], num_threads)


cdef struct GemmMat:
    # one matrix of gemm_sets, and the 8-bit activations of the set it belongs to
    int code
    const uint8_t *w
    long row_bytes
    long n_out
    const float *bias
    float *out
    long n_in
    long rows
    int group             # values per activation scale (hy_q_act_group)
    const int8_t *qa
    const float *da
    const float *sa
    const int32_t *a16
    long first_panel      # this matrix's panels are [first_panel, next matrix's first_panel)


cdef inline int _act_kind(int code) noexcept nogil:
    """Which of the two activation forms a format reads: 0 scales per 32 values, 1 per 256."""
    return 1 if hy_q_act_group(code) == 256 else 0


cdef int _set_kinds(list mats_) except -1:
    """Bit k set where a matrix of the list reads activation form k (_act_kind)."""
    cdef int kinds = 0
    for m_ in mats_:
        kinds |= 1 << _act_kind(m_[0])
    return kinds


def gemm_sets(list sets,   # [(x [rows_i, in_i] float32, [(code, w, bias or None, out), ...])]
              int num_threads):
    """out = x_i @ W.T (+ bias) for every matrix of every set (integer formats), each set's x
    quantized once per activation form its matrices read, and one parallel region over the
    panels of all the matrices (mixture of experts: each expert's prompt rows).  Each output
    has the bits gemm gives it."""
    cdef int ns = len(sets), nm = 0, i, m, kind, kinds
    cdef Py_ssize_t total_rows = 0, a_bytes = 0, max_in = 32
    for x_, mats_ in sets:  # sizes first: the activations' buffer
        nm += len(mats_)
        kinds = _set_kinds(mats_)
        for kind in range(2):
            if kinds >> kind & 1:
                total_rows += x_.shape[0]
                a_bytes += _act_bytes(x_.shape[0], x_.shape[1])
        max_in = max(max_in, x_.shape[1])
    if nm == 0:
        return
    cdef GemmMat *ms = <GemmMat *> malloc(sizeof(GemmMat) * (nm + 1))
    cdef GemmMat *row_set = <GemmMat *> malloc(sizeof(GemmMat) * (total_rows + 1))
    cdef const float **row_x = <const float **> malloc(sizeof(float *) * (total_rows + 1))
    cdef uint8_t *acts = NULL
    cdef uint8_t *scratch = NULL
    cdef const uint8_t[:, ::1] w
    cdef const float[:, ::1] x
    cdef float[:, ::1] o
    cdef Py_ssize_t rows, n_in, nb, n16, total_panels = 0, per_thread, p, r, j, q
    cdef Py_ssize_t nt = max(1, num_threads), k = 0, off = 0
    cdef long o0, on, next_bytes
    cdef int np_, tid
    cdef const uint8_t *next_w
    cdef GemmMat *gn
    cdef uint8_t *tmp
    cdef uint8_t *vi
    cdef float *ct
    cdef GemmMat *g
    cdef GemmMat a[2]
    cdef QuantMat qm
    try:
        acts = <uint8_t *> hy_alloc64(a_bytes + 64)
        # per thread: one panel of weight rows interleaved (vi, factors cT, offsets mT), built
        # block by block through tmp
        per_thread = (32 * GEMM_PANEL + GEMM_PANEL * max_in
                      + 2 * sizeof(float) * GEMM_PANEL * (max_in // 16) + 63) // 64 * 64
        scratch = <uint8_t *> hy_alloc64(nt * per_thread)
        if ms == NULL or row_set == NULL or row_x == NULL or acts == NULL or scratch == NULL:
            raise MemoryError()
        m = 0
        for i in range(ns):  # check everything, and place each set's activations
            x, mats_ = sets[i]
            rows, n_in = x.shape[0], x.shape[1]
            nb, n16 = n_in // 32, n_in // 16
            kinds = _set_kinds(mats_)
            for kind in range(2):
                if not kinds >> kind & 1:
                    continue
                a[kind].n_in, a[kind].rows, a[kind].group = n_in, rows, 256 if kind else 32
                a[kind].qa = <int8_t *> (acts + off)
                a[kind].da = <float *> (acts + off + rows * n_in)
                a[kind].sa = a[kind].da + rows * nb
                a[kind].a16 = <int32_t *> (a[kind].sa + rows * nb)
                off += _act_bytes(rows, n_in)
                for r in range(rows):
                    row_set[k] = a[kind]
                    row_set[k].qa, row_set[k].da = a[kind].qa + r * n_in, a[kind].da + r * nb
                    row_set[k].sa, row_set[k].a16 = a[kind].sa + r * nb, a[kind].a16 + r * n16
                    row_x[k] = &x[r, 0]
                    k += 1
            for code, w, bias, o in mats_:
                _fill_mat(&qm, code, w, bias, o, n_in, rows, "")
                if code not in INTEGER_FORMATS:
                    raise ValueError(f"gemm serves the integer formats, not code {code}")
                g = &ms[m]
                g[0] = a[_act_kind(code)]
                g.code, g.w, g.row_bytes, g.n_out = qm.code, qm.w, qm.row_bytes, qm.n_out
                g.bias, g.out = qm.bias, qm.out
                g.first_panel = total_panels
                if rows:
                    total_panels += (g.n_out + GEMM_PANEL - 1) // GEMM_PANEL
                m += 1
        ms[nm].first_panel = total_panels
        with nogil:
            # 8-bit activations of every row of every set in each form: values, scales, scaled
            # block sums, integer sums per 16
            for q in prange(total_rows, num_threads=num_threads, schedule="static"):
                g = &row_set[q]
                hy_q_act(row_x[q], g.n_in, g.group, <int8_t *> g.qa, <float *> g.da,
                         <float *> g.sa, NULL)
                hy_q_half_sums(g.qa, g.n_in, <int32_t *> g.a16)
            # panels handed out one at a time: when one core is slowed (a shared machine) the
            # other takes more panels; a panel's result does not depend on the thread
            for p in prange(total_panels, num_threads=num_threads, schedule="dynamic"):
                tid = threadid()
                g = &ms[_matrix_of_panel(ms, nm, p)]
                tmp = scratch + tid * per_thread
                vi = tmp + 32 * GEMM_PANEL
                ct = <float *> (vi + GEMM_PANEL * g.n_in)
                o0 = (p - g.first_panel) * GEMM_PANEL
                np_ = <int> min(GEMM_PANEL, g.n_out - o0)
                # this thread's likely next panel: the threads take panels about in turn
                next_w = NULL
                next_bytes = 0
                if p + num_threads < total_panels:
                    gn = &ms[_matrix_of_panel(ms, nm, p + num_threads)]
                    on = (p + num_threads - gn.first_panel) * GEMM_PANEL
                    next_w = gn.w + on * gn.row_bytes
                    next_bytes = min(GEMM_PANEL, gn.n_out - on) * gn.row_bytes
                hy_q_gemm_panel(g.code, g.rows, g.n_in, g.qa, g.da, g.sa, g.a16,
                                g.w + o0 * g.row_bytes, g.row_bytes, np_, tmp, vi, ct,
                                ct + GEMM_PANEL * (g.n_in // 16), g.out + o0, g.n_out,
                                next_w, next_bytes)
                if g.bias != NULL:
                    for r in range(g.rows):
                        for j in range(np_):
                            g.out[r * g.n_out + o0 + j] += g.bias[o0 + j]
    finally:
        free(ms); free(row_set); free(row_x); free(acts); free(scratch)


cdef inline Py_ssize_t _act_bytes(Py_ssize_t rows, Py_ssize_t n_in) noexcept:
    """Bytes of rows 8-bit activation rows of n_in values with their scales, scaled block sums
    and integer sums per 16 (64-byte aligned)."""
    return (rows * n_in + sizeof(float) * 2 * rows * (n_in // 32)
            + sizeof(int32_t) * rows * (n_in // 16) + 63) // 64 * 64


cdef inline Py_ssize_t _matrix_of_panel(const GemmMat *ms, int nm, Py_ssize_t p) noexcept nogil:
    """The matrix whose panels include p (binary search over first_panel)."""
    cdef int lo = 0, hi = nm - 1, mid
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ms[mid].first_panel <= p:
            lo = mid
        else:
            hi = mid - 1
    return lo


cdef inline bint _integer(int code) noexcept nogil:
    """Formats quantized with 8-bit activations (INTEGER_FORMATS)."""
    cdef const hy_q_traits *t = hy_q_traits_of(code)
    return t != NULL and t.integer != 0


cdef struct QuantActs:
    # one input of a mat-vec: x [rows, n_in] and its 8-bit forms (hy_q_act) for integer
    # formats, [kind] as _act_kind: scales per 32 values, per 256
    long n_in
    int rows
    const float *x
    const int8_t *qa[2]
    const float *da[2]
    const float *sa[2]
    const float *s16[2]
    const uint8_t *prep


cdef struct ActNeeds:
    # what a mat-vec's formats read of their input: the forms (bit k: kind k) and the
    # prepared layouts of each form (hy_q_prep_flags)
    int kinds
    int prep[2]


cdef inline void _need(ActNeeds *n, int code) noexcept nogil:
    """n plus what format `code` reads."""
    cdef int k = _act_kind(code)
    if _integer(code):
        n.kinds |= 1 << k
        n.prep[k] |= hy_q_prep_flags(code)


cdef Py_ssize_t acts_bytes(long rows, long n_in) noexcept nogil:
    """Bytes of _place_acts' buffer for rows x n_in values: both 8-bit forms with their scales
    and sums, and the prepared layouts."""
    return (2 * (rows * n_in + 4 * sizeof(float) * rows * (n_in // 32))
            + rows * hy_q_prep_bytes(n_in) + 127) // 64 * 64


cdef void _place_acts(QuantActs *a, uint8_t *buf) noexcept nogil:
    """a's activation arrays inside buf (acts_bytes(a.rows, a.n_in) bytes; NULL: none)."""
    cdef long rows = a.rows, nb = a.n_in // 32
    cdef int k
    a.prep = NULL
    for k in range(2):
        a.qa[k] = NULL; a.da[k] = a.sa[k] = a.s16[k] = NULL
        if buf == NULL:
            continue
        a.qa[k] = <int8_t *> buf
        a.da[k] = <float *> (buf + rows * a.n_in)
        a.sa[k] = a.da[k] + rows * nb
        a.s16[k] = a.sa[k] + rows * nb
        buf += rows * a.n_in + 4 * sizeof(float) * rows * nb
    if buf != NULL:
        a.prep = buf


cdef void _quantize_acts(const QuantActs *a, const ActNeeds *need) noexcept nogil:
    """a's 8-bit activations from its x, row by row, in the forms `need` names, and the
    prepared layouts it names."""
    cdef long n = a.n_in, nb = a.n_in // 32, pstride = hy_q_prep_bytes(a.n_in)
    cdef int r, k
    for k in range(2):
        if not need.kinds >> k & 1:
            continue
        for r in range(a.rows):
            hy_q_act(a.x + r * n, n, 256 if k else 32, <int8_t *> a.qa[k] + r * n,
                     <float *> a.da[k] + r * nb, <float *> a.sa[k] + r * nb,
                     <float *> a.s16[k] + r * 2 * nb)
            if need.prep[k]:
                hy_q_prep_acts(a.qa[k] + r * n, a.da[k] + r * nb, a.sa[k] + r * nb, n, a.rows,
                               need.prep[k], <uint8_t *> a.prep + r * pstride)


cdef inline void _matvec_rows(const QuantMat *m, const QuantActs *a, long o0,
                              long o1) noexcept nogil:
    cdef int k = _act_kind(m.code)
    hy_q_matvec_range(m.code, m.w, m.row_bytes, a.n_in, o0, o1, a.rows, a.qa[k], a.da[k],
                      a.sa[k], a.s16[k], a.prep, a.x, m.bias, m.out, m.n_out)


cdef void _matvec_run(const QuantMat *mats, int count, const QuantActs *acts, const int *act_of,
                      int num_threads) noexcept nogil:
    """out_i = x_i @ W_i.T (+ bias_i) for `count` matrices whose inputs are already quantized:
    matrix i reads acts[act_of[i]] (act_of NULL: acts[0]).  The chunks of MATVEC_CHUNK rows of
    every matrix are shared by the threads (matvec_claimed), or all run on this thread when the
    matrices are small.  Each output row takes the same operations however the rows are
    shared."""
    cdef long own_first[9]
    cdef long *first_chunk = own_first
    cdef long total = 0
    cdef int i
    for i in range(count):
        total += mats[i].n_out * mats[i].row_bytes
    if total < PARALLEL_MIN_BYTES or num_threads <= 1:  # no parallel region at all
        for i in range(count):
            _matvec_rows(&mats[i], &acts[act_of[i] if act_of != NULL else 0], 0, mats[i].n_out)
        return
    if count > 8:
        first_chunk = <long *> malloc(sizeof(long) * (count + 1))
        if first_chunk == NULL:  # no memory for the table: one matrix at a time
            for i in range(count):
                _matvec_run(&mats[i], 1, &acts[act_of[i] if act_of != NULL else 0], NULL,
                            num_threads)
            return
    first_chunk[0] = 0
    for i in range(count):
        first_chunk[i + 1] = first_chunk[i] + (mats[i].n_out + MATVEC_CHUNK - 1) // MATVEC_CHUNK
    _matvec_claimed(mats, count, first_chunk, total, acts, act_of, num_threads)
    if first_chunk != own_first:
        free(first_chunk)


cdef void matvec_group(const QuantMat *mats, int count, const float *x, long n_in, int rows,
                       uint8_t *acts, int num_threads) noexcept nogil:
    """out_i = x @ W_i.T (+ bias_i) for `count` (<= 4) matrices reading the same x [rows, n_in]:
    x quantized once in each form the formats read, and laid out for the kernels that read
    prepared activations, in acts (acts_bytes(rows, n_in) bytes; NULL for float formats only),
    then _matvec_run."""
    cdef QuantActs a
    cdef ActNeeds need
    cdef int i
    need.kinds = need.prep[0] = need.prep[1] = 0
    for i in range(count):
        _need(&need, mats[i].code)
    a.n_in, a.rows, a.x = n_in, rows, x
    _place_acts(&a, acts)
    _quantize_acts(&a, &need)
    _matvec_run(mats, count, &a, NULL, num_threads)


cdef void _matvec_claimed(const QuantMat *mats, int count, const long *first_chunk, long total,
                          const QuantActs *acts, const int *act_of, int nt) noexcept nogil:
    """The C = first_chunk[count] chunks of _matvec_run's matrices (total bytes) over nt
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
                    _matvec_rows(&mats[m], &acts[act_of[m] if act_of != NULL else 0], o0, o1)
                    c = min(c_end, first_chunk[m + 1])
    if counter != own:
        free(counter)


def matvec_many(list mats,                    # [(code, w [out_i, row_bytes_i] uint8, bias or None,
                                              #   out_i [rows, out_i] float32)], up to 4
                const float[:, ::1] x,        # IN  [rows, in] float32, shared by every matrix
                int num_threads):
    """out_i = x @ W_i.T (+ bias_i) for several weights that read the same x (Q/K/V, gate/up):
    x is quantized once, and one parallel region covers the rows of every matrix."""
    cdef Py_ssize_t n_in = x.shape[1], rows = x.shape[0]
    cdef int k, nm = len(mats)
    if nm < 1 or nm > 4:
        raise ValueError(f"matvec_many takes 1..4 matrices, got {nm}")
    cdef QuantMat ms[4]
    cdef const uint8_t[:, ::1] w
    cdef float[:, ::1] o
    cdef bint integer = False
    for k in range(nm):
        code, w, bias, o = mats[k]
        _fill_mat(&ms[k], code, w, bias, o, n_in, rows, f"matrix {k}: ")
        integer = integer or _integer(code)
    if rows == 0:
        return
    cdef uint8_t *acts = NULL
    if integer:
        acts = <uint8_t *> hy_alloc64(acts_bytes(rows, n_in))
        if acts == NULL:
            raise MemoryError()
    try:
        with nogil:
            matvec_group(ms, nm, &x[0, 0], n_in, <int> rows, acts, num_threads)
    finally:
        free(acts)


def matvec_sets(list sets,   # [(x [rows_i, in_i] float32, [(code, w, bias or None, out), ...])]
                int num_threads):
    """out = x_i @ W.T (+ bias) for every matrix of every set, each set's x quantized once, and
    one parallel region over the rows of all the matrices (mixture-of-experts decode: each
    expert's gate and up, or down, read their own rows).  Each output row has the bits that
    matvec gives it."""
    cdef int ns = len(sets), nm = 0, i, m, failed
    for x_, mats_ in sets:
        nm += len(mats_)
    if nm == 0:
        return
    cdef QuantMat *ms = <QuantMat *> malloc(sizeof(QuantMat) * nm)
    cdef int *set_of = <int *> malloc(sizeof(int) * nm)
    cdef SetInput *ins = <SetInput *> malloc(sizeof(SetInput) * ns)
    cdef const float[:, ::1] x
    try:
        if ms == NULL or set_of == NULL or ins == NULL:
            raise MemoryError()
        m = 0
        for i in range(ns):
            x, mats_ = sets[i]
            if x.shape[0] == 0:
                raise ValueError(f"set {i} has no rows")
            ins[i].x, ins[i].rows, ins[i].n_in = &x[0, 0], <int> x.shape[0], x.shape[1]
            for code, w, bias, o in mats_:
                _fill_mat(&ms[m], code, w, bias, o, x.shape[1], x.shape[0], f"set {i}: ")
                set_of[m] = i
                m += 1
        with nogil:
            failed = matvec_sets_run(ms, nm, set_of, ins, ns, NULL, 0, num_threads)
        if failed:
            raise MemoryError()
    finally:
        free(ms); free(set_of); free(ins)


cdef inline Py_ssize_t _sets_head_bytes(int ns) noexcept nogil:
    """Bytes at the front of a matvec_sets_run work buffer: ns QuantActs and ActNeeds, to 64."""
    return ((sizeof(QuantActs) + sizeof(ActNeeds)) * ns + 63) // 64 * 64


cdef Py_ssize_t sets_work_bytes(int ns, long rows, long n_in) noexcept nogil:
    """Bytes of a matvec_sets_run work buffer that serves up to ns sets of `rows` rows in all,
    each at most n_in wide (each set's 8-bit activations round up by less than 128 bytes)."""
    return _sets_head_bytes(ns) + acts_bytes(rows, n_in) + 128 * ns


cdef int matvec_sets_run(const QuantMat *mats, int count, const int *set_of,
                         const SetInput *ins, int ns, uint8_t *work, Py_ssize_t work_bytes,
                         int num_threads) noexcept nogil:
    """matvec_sets from C: matrix i reads ins[set_of[i]]; each set's x quantized once (in the
    forms its matrices read), then one parallel region over the rows of every matrix.  ``work``
    (64-byte aligned, work_bytes long; sets_work_bytes) holds the activations when it is large
    enough, else (or NULL) they are allocated here.  Returns -1 when there is no memory for the
    8-bit activations (nothing is written), else 0."""
    cdef Py_ssize_t off = 0, need
    cdef uint8_t *own = NULL
    cdef uint8_t *buf
    cdef QuantActs *acts
    cdef ActNeeds *needs
    cdef long rows = 0, n_in = 0
    cdef int i
    for i in range(ns):
        rows += ins[i].rows
        n_in = max(n_in, ins[i].n_in)
    need = sets_work_bytes(ns, rows, n_in)
    if work == NULL or work_bytes < need:
        own = work = <uint8_t *> hy_alloc64(need)
        if work == NULL:
            return -1
    acts = <QuantActs *> work
    needs = <ActNeeds *> (work + sizeof(QuantActs) * ns)
    buf = work + _sets_head_bytes(ns)
    for i in range(ns):
        acts[i].n_in, acts[i].rows, acts[i].x = ins[i].n_in, ins[i].rows, ins[i].x
        _place_acts(&acts[i], NULL)
        needs[i].kinds = needs[i].prep[0] = needs[i].prep[1] = 0
    for i in range(count):
        _need(&needs[set_of[i]], mats[i].code)
    for i in range(ns):
        if needs[i].kinds:
            _place_acts(&acts[i], buf + off)
            off += acts_bytes(ins[i].rows, ins[i].n_in)
    for i in range(ns):
        _quantize_acts(&acts[i], &needs[i])
    _matvec_run(mats, count, acts, set_of, num_threads)
    free(own)
    return 0


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
        matvec_group(&m, 1, &x[0, 0], n, <int> rows, NULL, num_threads)


def gemm_f32(const float[:, ::1] w,   # IN  [out, in] float32 weight rows
             const float[:, ::1] x,   # IN  [rows, in] float32 activations
             bias,                    # IN  [out] float32 or None
             float[:, :] out,         # OUT [rows, out], rows contiguous (a column slice is fine)
             int num_threads):
    """out = x @ W.T (+ bias) for many rows (prefill) with the tile of gemm_f32.h, threads
    over chunks of weight rows.  Each output's sums run in a fixed order that depends on neither
    the number of rows nor the thread count.  Only where GEMM_F32 is true."""
    cdef Py_ssize_t n = x.shape[1], rows = x.shape[0], n_out = w.shape[0], c
    if not GEMM_F32:
        raise RuntimeError("gemm_f32: this build has no float32 GEMM (use BLAS)")
    cdef const float *bp = _f32_args(w, x, bias, out, "gemm_f32")
    if rows == 0 or n_out == 0 or n == 0:
        return
    cdef Py_ssize_t nchunks = (n_out + GEMM_F32_CHUNK - 1) // GEMM_F32_CHUNK
    cdef long ldo = out.strides[0] // sizeof(float)
    # chunks handed out one at a time, as the integer GEMM's panels
    for c in prange(nchunks, nogil=True, num_threads=num_threads, schedule="dynamic"):
        hy_gemm_f32_range(&x[0, 0], rows, &w[0, 0], n, c * GEMM_F32_CHUNK,
                          min((c + 1) * GEMM_F32_CHUNK, n_out), bp, &out[0, 0], ldo)
