"""A quantized CPU layer's decode row in native code: DecodeLayer binds a layer's weights and
scratch once and runs the attention block's prologue and the rest of the layer as two calls;
decode_stack runs one decode row through a whole stack of them, with the planned step's K/V
writes and attention in between, without returning to Python.  The mat-vecs are quant.pyx's
(matvec_group), the attention attention.pyx's (RaggedStep): the same kernels in the same order
as the layer's op-by-op path, so both give the same bits.
"""
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp

from hybrid._cpu.attention cimport RaggedStep
from hybrid._cpu.quant cimport QuantMat, acts_bytes, check_weight, matvec_group

cdef extern from "rowops.h" nogil:
    void hy_rmsnorm_row(const float *x, const float *weight, float eps, float *out, long dim)
    void hy_rope_angles(int64_t position, const double *inv_freq, int half, float *cs, float *sn)
    void hy_rope_apply(float *x, int num_heads, int head_dim, int neox, const float *cs,
                       const float *sn)

cdef extern from "simd.h" nogil:
    void *hy_alloc64(size_t n)
    void hy_silu_mul(const float *g, const float *u, float *out, long n)



cdef const float *_fptr(a) except? NULL:
    """Address of a C-contiguous float32 array (None: NULL)."""
    cdef const float[::1] v
    if a is None:
        return NULL
    v = a.reshape(-1)
    return &v[0]


cdef class DecodeLayer:
    """A quantized CPU layer's decode row bound once to its weights and scratch: the attention
    block's prologue (RMSNorm, Q/K/V in one parallel region, QK-norm, RoPE) and the rest of the
    layer (O, residual, RMSNorm, gate/up in one parallel region, SwiGLU, down, residual) as two
    calls that run in C from start to end: weight pointers, shapes and the 8-bit activation
    buffers are set up here, not per call.  The same kernels in the same order as the op-by-op
    path (matvec_many and the row kernels), so both give the same bits."""
    cdef object _keep
    cdef QuantMat mats[7]          # Q, K, V | O | gate, up | down
    cdef long dim, inter, max_in
    cdef int max_rows              # rows one call may carry (the buffers' first dimension)
    cdef int H, KVH, D, neox
    cdef int q_span, k_span        # values each QK-norm covers: head_dim, or all of Q (K)
    cdef float eps
    cdef const float *attn_norm
    cdef const float *mlp_norm
    cdef const float *q_norm
    cdef const float *k_norm
    cdef const double *inv_freq
    cdef float *h
    cdef float *q
    cdef float *k
    cdef float *o
    cdef float *x1
    cdef float *gate
    cdef float *up
    cdef uint8_t *acts

    def __cinit__(self):
        self.acts = NULL

    def __init__(self, list mats,     # 7 x (code, w [out, row_bytes] uint8, bias or None, out [M, out])
                 attn_norm, mlp_norm, q_norm, k_norm,   # [dim], [dim], [D] (per head) or [H*D] / [KVH*D] (whole), or None
                 inv_freq,            # [D/2] float64 or None
                 h, o, x1,            # scratch [M, dim]
                 float eps, bint neox, int num_heads, int num_kv_heads, int head_dim,
                 int max_rows=1):     # M
        cdef int i
        cdef const uint8_t[:, ::1] w
        cdef float[:, ::1] ov
        cdef const double[::1] f
        if len(mats) != 7:
            raise ValueError("DecodeLayer takes the 7 projections Q, K, V, O, gate, up, down")
        if max_rows < 1:
            raise ValueError("DecodeLayer: max_rows >= 1")
        self.max_rows = max_rows
        self._keep = (mats, attn_norm, mlp_norm, q_norm, k_norm, inv_freq, h, o, x1)
        self.H, self.KVH, self.D, self.neox, self.eps = num_heads, num_kv_heads, head_dim, neox, eps
        self.dim = attn_norm.shape[0]
        self.inter = mats[4][1].shape[0]
        ins = [self.dim, self.dim, self.dim, num_heads * head_dim, self.dim, self.dim, self.inter]
        for i in range(7):
            code, w, bias, out = mats[i]
            self.mats[i].code = code
            self.mats[i].row_bytes = check_weight(code, w, ins[i])
            self.mats[i].n_out = w.shape[0]
            self.mats[i].w = &w[0, 0]
            ov = out  # float32, C-contiguous, or a TypeError / ValueError
            if ov.shape[0] != max_rows or ov.shape[1] != w.shape[0]:
                raise ValueError(f"projection {i}: out must be [{max_rows}, {w.shape[0]}]")
            self.mats[i].out = &ov[0, 0]
            if bias is not None and bias.shape != (w.shape[0],):
                raise ValueError(f"projection {i}: bias must have {w.shape[0]} entries")
            self.mats[i].bias = _fptr(bias)
        if self.mats[0].n_out != num_heads * head_dim or self.mats[1].n_out != num_kv_heads * head_dim \
                or self.mats[2].n_out != num_kv_heads * head_dim or self.mats[3].n_out != self.dim \
                or self.mats[5].n_out != self.inter or self.mats[6].n_out != self.dim:
            raise ValueError("DecodeLayer: projection shapes do not match the heads and widths")
        if head_dim > 1024:
            raise ValueError("DecodeLayer: head_dim <= 1024")
        self.attn_norm, self.mlp_norm = _fptr(attn_norm), _fptr(mlp_norm)
        self.q_norm, self.k_norm = _fptr(q_norm), _fptr(k_norm)
        self.q_span = head_dim if q_norm is None else q_norm.shape[0]
        self.k_span = head_dim if k_norm is None else k_norm.shape[0]
        if self.q_span not in (head_dim, num_heads * head_dim) \
                or self.k_span not in (head_dim, num_kv_heads * head_dim):
            raise ValueError("DecodeLayer: q_norm / k_norm must cover one head or all heads")
        self.inv_freq = NULL
        if inv_freq is not None:
            f = inv_freq
            self.inv_freq = &f[0]
        for a in (h, o, x1):
            if a.shape != (max_rows, self.dim):
                raise ValueError(f"DecodeLayer: h, o and x1 must be [{max_rows}, {self.dim}]")
        self.h, self.o, self.x1 = <float *> _fptr(h), <float *> _fptr(o), <float *> _fptr(x1)
        self.q, self.k = self.mats[0].out, self.mats[1].out
        self.gate, self.up = self.mats[4].out, self.mats[5].out
        self.max_in = max(ins)
        self.acts = <uint8_t *> hy_alloc64(acts_bytes(max_rows, self.max_in))
        if self.acts == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.acts)

    cdef void _project(self, int first, int count, const float *x, long n_in, int rows,
                       int num_threads) noexcept nogil:
        """out_i = x @ W_i.T (+ bias_i) for mats [first, first+count): matvec_many for the
        rows (each row's bits as alone)."""
        matvec_group(&self.mats[first], count, x, n_in, rows, self.acts, num_threads)

    def prologue(self, const float[:, ::1] x,   # IN  [1, hidden] the layer's input
                 int64_t position, int num_threads):
        """RMSNorm, Q/K/V, QK-norm, RoPE into the bound q, k, v buffers."""
        if x.shape[0] != 1 or x.shape[1] != self.dim:
            raise ValueError(f"decode prologue: x must be [1, {self.dim}], got {tuple(x.shape)[:2]}")
        cdef float cs[512]
        cdef float sn[512]
        with nogil:
            if self.inv_freq != NULL:
                hy_rope_angles(position, self.inv_freq, self.D // 2, cs, sn)
            self.prologue_c(&x[0, 0], 1, cs, sn, num_threads)

    cdef void prologue_c(self, const float *x, int rows, const float *cs, const float *sn,
                         int num_threads) noexcept nogil:
        """x [rows, dim]; cs, sn [rows, 512]: row r's RoPE angles' cos/sin at r*512
        (hy_rope_angles)."""
        cdef int i, r, D = self.D
        cdef long qn = self.mats[0].n_out, kn = self.mats[1].n_out
        for r in range(rows):
            hy_rmsnorm_row(x + r * self.dim, self.attn_norm, self.eps, self.h + r * self.dim, self.dim)
        self._project(0, 3, self.h, self.dim, rows, num_threads)
        for r in range(rows):
            if self.q_norm != NULL:  # per head, or over all heads (OLMoE)
                for i in range(qn // self.q_span):
                    hy_rmsnorm_row(self.q + r * qn + i * self.q_span, self.q_norm, self.eps,
                                   self.q + r * qn + i * self.q_span, self.q_span)
            if self.k_norm != NULL:
                for i in range(kn // self.k_span):
                    hy_rmsnorm_row(self.k + r * kn + i * self.k_span, self.k_norm, self.eps,
                                   self.k + r * kn + i * self.k_span, self.k_span)
            if self.inv_freq != NULL:
                hy_rope_apply(self.q + r * qn, self.H, D, self.neox, cs + r * 512, sn + r * 512)
                hy_rope_apply(self.k + r * kn, self.KVH, D, self.neox, cs + r * 512, sn + r * 512)

    def epilogue(self, const float[:, ::1] att,   # IN  [1, H*D] attention output
                 const float[:, ::1] x,           # IN  [1, hidden] the layer's input
                 float[:, ::1] out,               # OUT [1, hidden] (may be x)
                 int num_threads):
        """O, residual, RMSNorm, gate/up, SwiGLU, down, residual into out."""
        if att.shape[0] != 1 or att.shape[1] != self.H * self.D or x.shape[0] != 1 \
                or x.shape[1] != self.dim or out.shape[0] != 1 or out.shape[1] != self.dim:
            raise ValueError("decode epilogue: att [1, H*D], x and out [1, hidden]")
        with nogil:
            self.epilogue_c(&att[0, 0], &x[0, 0], &out[0, 0], 1, num_threads)

    cdef void epilogue_c(self, const float *att, const float *x, float *out, int rows,
                         int num_threads) noexcept nogil:
        """att [rows, H*D], x and out [rows, dim] (out may be x)."""
        cdef Py_ssize_t d, r, dim = self.dim
        self._project(3, 1, att, self.H * self.D, rows, num_threads)
        for d in range(rows * dim):
            self.x1[d] = x[d] + self.o[d]
        for r in range(rows):
            hy_rmsnorm_row(self.x1 + r * dim, self.mlp_norm, self.eps, self.h + r * dim, dim)
        self._project(4, 2, self.h, dim, rows, num_threads)
        hy_silu_mul(self.gate, self.up, self.gate, rows * self.inter)
        self._project(6, 1, self.gate, self.inter, rows, num_threads)
        for d in range(rows * dim):
            out[d] = self.x1[d] + self.o[d]


def decode_stack(list layers,            # [L] DecodeLayer, in order
                 RaggedStep plan,        # the step's attention (its R rows)
                 list k_addrs, list v_addrs,   # [L] each layer's K / V block address tables
                 float[:, ::1] x,        # IN/OUT [R, hidden]: the step's input, then its output
                 float[:, ::1] att,      # scratch [R, H*D]
                 const int64_t[::1] positions,  # [R] each row's position
                 int num_threads):
    """R generated rows (R <= every layer's max_rows) through every layer of a quantized CPU
    stack without returning to Python: per layer the prologue, the K/V writes and attention of
    the planned step, the epilogue (the same calls DecoderLayer.forward_step makes one by one,
    so the same bits).  The GIL is released around each layer's work."""
    cdef Py_ssize_t i, r, n = len(layers), R = x.shape[0]
    cdef DecodeLayer L
    cdef const int64_t[::1] ka
    cdef const int64_t[::1] va
    cdef int failed = 0
    if len(k_addrs) != n or len(v_addrs) != n:
        raise ValueError("decode_stack: one K and one V address table per layer")
    for i in range(n):  # every check before any layer runs: a bad argument changes nothing
        L = layers[i]
        if R < 1 or R > L.max_rows or x.shape[1] != L.dim or att.shape[0] != R \
                or att.shape[1] != L.H * L.D or plan.T != R or positions.shape[0] != R:
            raise ValueError("decode_stack: x [R, hidden], att [R, H*D], R positions and an "
                             "R-row plan, R <= the layers' max_rows")
        plan.check_tables(len(k_addrs[i]), len(v_addrs[i]))
    # the RoPE angles once for the step: layers with the same frequencies share them
    cdef float *cs = <float *> malloc(sizeof(float) * 512 * R)
    cdef float *sn = <float *> malloc(sizeof(float) * 512 * R)
    if cs == NULL or sn == NULL:
        free(cs); free(sn)
        raise MemoryError()
    cdef const double *freq = NULL
    cdef int half = 0
    try:
        for i in range(n):
            L = layers[i]
            ka = k_addrs[i]
            va = v_addrs[i]
            with nogil:
                if L.inv_freq != NULL and (freq == NULL or half != L.D // 2
                                           or memcmp(freq, L.inv_freq, sizeof(double) * half) != 0):
                    freq, half = L.inv_freq, L.D // 2
                    for r in range(R):
                        hy_rope_angles(positions[r], freq, half, cs + r * 512, sn + r * 512)
                L.prologue_c(&x[0, 0], <int> R, cs, sn, num_threads)
                failed = plan.run(L.q, L.k, L.mats[2].out, &ka[0], &va[0], &att[0, 0])
                if not failed:
                    L.epilogue_c(&att[0, 0], &x[0, 0], &x[0, 0], <int> R, num_threads)
            if failed:
                raise MemoryError("paged attention: could not allocate per-thread scratch")
    finally:
        free(cs); free(sn)
