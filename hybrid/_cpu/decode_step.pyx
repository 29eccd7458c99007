"""A quantized CPU layer's decode row in native code: DecodeLayer binds a layer's weights and
scratch once and runs the attention block's prologue and the rest of the layer (a dense SwiGLU
MLP, or a mixture of experts through MoeBlock) as two calls;
decode_stack runs one decode row through a whole stack of them, with the planned step's K/V
writes and attention in between, without returning to Python.  The mat-vecs are quant.pyx's
(matvec_group), the attention attention.pyx's (RaggedStep): the same kernels in the same order
as the layer's op-by-op path, so both give the same bits.
"""
from libc.math cimport exp, isnan
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

import numpy as np

from hybrid._cpu.attention cimport RaggedStep
from hybrid._cpu.quant cimport (QuantMat, SetInput, acts_bytes, check_weight, matvec_group,
                                matvec_sets_run, sets_work_bytes)

cdef extern from "quant.h" nogil:
    enum: HY_Q_F32

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


cdef inline bint _ranks_above(float a, float b) noexcept nogil:
    """Whether score a ranks before score b: the larger first, a NaN after every number."""
    return a > b or (isnan(b) and not isnan(a))


cdef void route_row(const float *s, int E, int k, bint normalize, int64_t *ids,
                    float *w) noexcept nogil:
    """One row's experts from its router scores s [E]: ids [k], best first (ties: the lower
    id), and their weights [k], the softmax probabilities in float64 (rescaled to sum to 1 when
    ``normalize``).  The only routing there is: every row of every step goes through it."""
    cdef double mx = s[0], total = 0.0, picked = 0.0
    cdef double p[1024]
    cdef int j, r, best, q
    cdef bint taken
    for j in range(1, E):
        if s[j] > mx:
            mx = s[j]
    for j in range(E):
        total += exp(<double> s[j] - mx)
    for r in range(k):
        best = -1
        for j in range(E):
            taken = False
            for q in range(r):
                if ids[q] == j:
                    taken = True
                    break
            if not taken and (best < 0 or _ranks_above(s[j], s[best])):
                best = j
        ids[r] = best
        p[r] = exp(<double> s[best] - mx) / total
        picked += p[r]
    for r in range(k):
        w[r] = <float> (p[r] / picked if normalize else p[r])


MAX_TOP_K = 1024


def moe_route(const float[:, ::1] scores, int top_k, bint normalize):
    """(ids [n, top_k] int64, weights [n, top_k] float32) of each row of router scores
    [n, E] (route_row: the routing every mixture-of-experts step uses)."""
    cdef Py_ssize_t n = scores.shape[0], r
    cdef int E = <int> scores.shape[1]
    if not 1 <= top_k <= min(E, MAX_TOP_K):
        raise ValueError(f"top_k must be in [1, {min(E, MAX_TOP_K)}], got {top_k}")
    ids = np.empty((n, top_k), dtype=np.int64)
    weights = np.empty((n, top_k), dtype=np.float32)
    cdef int64_t[:, ::1] iv = ids
    cdef float[:, ::1] wv = weights
    with nogil:
        for r in range(n):
            route_row(&scores[r, 0], E, top_k, normalize, &iv[r, 0], &wv[r, 0])
    return ids, weights


cdef class MoeBlock:
    """A mixture-of-experts MLP's rows in C, bound once to the layer's router, its experts'
    encoded matrices and scratch: router scores (the float32 mat-vec), route_row, every
    chosen expert's gate and up in one parallel region, SwiGLU, every down in one more, each
    output times its weight, and each row's outputs added in its own ranking's order.  With
    several rows, the (row, rank) pairs are grouped by expert, rows ascending, so each expert's
    weights are read once.  The same kernels and order as hybrid/moe.py's moe_forward, so both
    give the same bits."""
    cdef object _keep
    cdef QuantMat router
    cdef QuantMat *mats            # [3E]: gate, up, down of expert e at e, E + e, 2E + e
    cdef int E, k, normalize, max_rows
    cdef long dim, inter
    cdef float *scores             # [max_rows, E]
    cdef float *xg                 # [P, dim] each pair's row, grouped by expert
    cdef float *g                  # [P, inter] gate, then SwiGLU's output
    cdef float *u                  # [P, inter]
    cdef float *d                  # [P, dim] down
    cdef int64_t *counts           # [E] rows routed to each expert (the layer's)
    cdef int64_t *ids              # [max_rows * k]: row r's experts at r*k, best first
    cdef float *w                  # [max_rows * k] their weights
    cdef int *pair_row             # [P] pair p (expert order) -> its row
    cdef int *pair_rank            # [P] -> its rank in that row's ranking
    cdef int *pair_of              # [max_rows * k] (row, rank) -> its pair
    cdef int *first                # [E + 1] first pair of each expert
    cdef int *span_first           # [P + 1] pairs of span s (one expert): [span_first[s], s + 1's)
    cdef int *span_expert          # [P]
    cdef QuantMat *call            # [2P] one call's matrices
    cdef int *set_of               # [2P]
    cdef SetInput *ins             # [P]
    cdef uint8_t *work             # matvec_sets_run's activations for P rows
    cdef Py_ssize_t work_bytes

    def __cinit__(self):
        self.mats = NULL
        self.ids = NULL
        self.w = NULL
        self.pair_row = self.pair_rank = self.pair_of = self.first = self.set_of = NULL
        self.span_first = self.span_expert = NULL
        self.call = NULL
        self.ins = NULL
        self.work = NULL

    def __init__(self, router,        # [E, dim] float32
                 list gate, list up, list down,   # E x (code, w [out, row_bytes] uint8)
                 int top_k, bint normalize,
                 counts,              # [E] int64, incremented by the rows routed to each expert
                 scores, xg, g, u, d,     # scratch [M, E], [M*k, dim], [M*k, I] x 2, [M*k, dim]
                 int max_rows=1):
        cdef const float[:, ::1] rv = router
        cdef const uint8_t[:, ::1] wv
        cdef int64_t[::1] cv = counts
        cdef int e, i, P
        E, dim = rv.shape[0], rv.shape[1]
        if not (len(gate) == len(up) == len(down) == E) or E < 1:
            raise ValueError("MoeBlock: one gate, up and down matrix per router row")
        if not 1 <= top_k <= min(E, MAX_TOP_K) or max_rows < 1:
            raise ValueError("MoeBlock: top_k in [1, E] and max_rows >= 1")
        if cv.shape[0] != E:
            raise ValueError("MoeBlock: counts must have one entry per expert")
        self.E, self.k, self.normalize, self.max_rows, self.dim = E, top_k, normalize, max_rows, dim
        self.inter = gate[0][1].shape[0]
        P = max_rows * top_k
        for name, a, shape in (("scores", scores, (max_rows, E)), ("xg", xg, (P, dim)),
                               ("g", g, (P, self.inter)), ("u", u, (P, self.inter)),
                               ("d", d, (P, dim))):
            if a.dtype != np.float32 or not a.flags.c_contiguous or a.shape != shape:
                raise ValueError(f"MoeBlock: {name} must be float32 {shape}, C-contiguous")
        self._keep = (router, gate, up, down, counts, scores, xg, g, u, d)
        self.router.code, self.router.w = HY_Q_F32, <const uint8_t *> &rv[0, 0]
        self.router.row_bytes, self.router.n_out = dim * sizeof(float), E
        self.router.bias = NULL
        self.scores = <float *> _fptr(scores)
        self.xg, self.g, self.u, self.d = (<float *> _fptr(xg), <float *> _fptr(g),
                                           <float *> _fptr(u), <float *> _fptr(d))
        self.counts = &cv[0]
        self.mats = <QuantMat *> malloc(sizeof(QuantMat) * 3 * E)
        self.ids = <int64_t *> malloc(sizeof(int64_t) * P)
        self.w = <float *> malloc(sizeof(float) * P)
        self.pair_row = <int *> malloc(sizeof(int) * P)
        self.pair_rank = <int *> malloc(sizeof(int) * P)
        self.pair_of = <int *> malloc(sizeof(int) * P)
        self.span_first = <int *> malloc(sizeof(int) * (P + 1))
        self.span_expert = <int *> malloc(sizeof(int) * P)
        self.first = <int *> malloc(sizeof(int) * (E + 1))
        self.call = <QuantMat *> malloc(sizeof(QuantMat) * 2 * P)
        self.set_of = <int *> malloc(sizeof(int) * 2 * P)
        self.ins = <SetInput *> malloc(sizeof(SetInput) * P)
        self.work_bytes = sets_work_bytes(P, P, max(dim, self.inter))
        self.work = <uint8_t *> hy_alloc64(self.work_bytes)
        if self.mats == NULL or self.ids == NULL or self.w == NULL or self.pair_row == NULL \
                or self.pair_rank == NULL or self.pair_of == NULL or self.first == NULL \
                or self.span_first == NULL or self.span_expert == NULL or self.call == NULL \
                or self.set_of == NULL or self.ins == NULL or self.work == NULL:
            raise MemoryError()
        for i, (mats, n_in, n_out) in enumerate(((gate, dim, self.inter), (up, dim, self.inter),
                                                 (down, self.inter, dim))):
            for e in range(E):
                code, wv = mats[e]
                self.mats[i * E + e].code = code
                self.mats[i * E + e].row_bytes = check_weight(code, wv, n_in)
                if wv.shape[0] != n_out:
                    raise ValueError(f"MoeBlock: expert {e}'s matrices do not fit [{n_out}, {n_in}]")
                self.mats[i * E + e].n_out = n_out
                self.mats[i * E + e].w = &wv[0, 0]
                self.mats[i * E + e].bias = NULL
                self.mats[i * E + e].out = NULL

    def __dealloc__(self):
        free(self.mats); free(self.ids); free(self.w); free(self.pair_row); free(self.pair_rank)
        free(self.pair_of); free(self.first); free(self.span_first); free(self.span_expert)
        free(self.call); free(self.set_of); free(self.ins); free(self.work)

    def forward(self, const float[:, ::1] h,   # IN  [rows, dim] after the MLP norm
                float[:, ::1] out,             # OUT [rows, dim]
                int num_threads):
        """out = the experts' weighted outputs for the rows of h (rows <= max_rows)."""
        cdef int rows = <int> h.shape[0], failed
        if not 1 <= rows <= self.max_rows or h.shape[1] != self.dim \
                or out.shape[0] != rows or out.shape[1] != self.dim:
            raise ValueError(f"MoeBlock: h and out [rows, {self.dim}], 1 <= rows <= {self.max_rows}")
        with nogil:
            failed = self.run(&h[0, 0], rows, &out[0, 0], num_threads)
        if failed:
            raise MemoryError("mixture of experts: no memory for the 8-bit activations")

    cdef int run(self, const float *h, int rows, float *out, int nt) noexcept nogil:
        """forward's work (its activations in the block's own work buffer); -1 when memory for
        them could not be had (out and the counts untouched), else 0."""
        cdef int E = self.E, k = self.k, P = rows * k, r, j, e, p, a, b, s, ns = 0
        cdef long c, dim = self.dim, inter = self.inter
        cdef float wp
        cdef float *o
        cdef const float *src
        self.router.out = self.scores
        matvec_group(&self.router, 1, h, dim, rows, NULL, nt)
        for r in range(rows):
            route_row(self.scores + r * E, E, k, self.normalize, self.ids + r * k, self.w + r * k)
        if rows == 1:  # the row's experts are distinct: a span per rank, in rank order
            for j in range(k):
                self.pair_row[j], self.pair_rank[j], self.pair_of[j] = 0, j, j
                self.span_first[j], self.span_expert[j] = j, <int> self.ids[j]
            ns = k
        else:  # pairs by expert, rows ascending within one (a counting sort); a span per expert
            for e in range(E + 1):
                self.first[e] = 0
            for p in range(P):
                self.first[self.ids[p] + 1] += 1
            for e in range(E):
                if self.first[e + 1]:
                    self.span_first[ns], self.span_expert[ns] = self.first[e], e
                    ns += 1
                self.first[e + 1] += self.first[e]
            for r in range(rows):
                for j in range(k):
                    p = self.first[self.ids[r * k + j]]
                    self.first[self.ids[r * k + j]] += 1
                    self.pair_row[p], self.pair_rank[p], self.pair_of[r * k + j] = r, j, p
                    memcpy(self.xg + p * dim, h + r * dim, sizeof(float) * dim)
        self.span_first[ns] = P
        for s in range(ns):  # gate and up of every span: one set per span, or h once for one row
            a, e = self.span_first[s], self.span_expert[s]
            self.call[2 * s] = self.mats[e]
            self.call[2 * s].out = self.g + a * inter
            self.call[2 * s + 1] = self.mats[E + e]
            self.call[2 * s + 1].out = self.u + a * inter
            self.set_of[2 * s] = self.set_of[2 * s + 1] = 0 if rows == 1 else s
            self.ins[s].x, self.ins[s].n_in = (h if rows == 1 else self.xg + a * dim), dim
            self.ins[s].rows = self.span_first[s + 1] - a
        if matvec_sets_run(self.call, 2 * ns, self.set_of, self.ins, 1 if rows == 1 else ns,
                           self.work, self.work_bytes, nt):
            return -1
        hy_silu_mul(self.g, self.u, self.g, P * inter)
        for s in range(ns):  # down of every span, on its SwiGLU rows
            a, b, e = self.span_first[s], self.span_first[s + 1], self.span_expert[s]
            self.call[s] = self.mats[2 * E + e]
            self.call[s].out = self.d + a * dim
            self.set_of[s] = s
            self.ins[s].x, self.ins[s].rows, self.ins[s].n_in = self.g + a * inter, b - a, inter
        if matvec_sets_run(self.call, ns, self.set_of, self.ins, ns, self.work,
                           self.work_bytes, nt):
            return -1
        for p in range(P):  # each pair's output times its weight
            wp = self.w[self.pair_row[p] * k + self.pair_rank[p]]
            for c in range(dim):
                self.d[p * dim + c] *= wp
        for r in range(rows):  # each row's outputs added in its ranking's order
            o = out + r * dim
            memcpy(o, self.d + self.pair_of[r * k] * dim, sizeof(float) * dim)
            for j in range(1, k):
                src = self.d + self.pair_of[r * k + j] * dim
                for c in range(dim):
                    o[c] += src[c]
        for p in range(P):  # (last: a failed call leaves the counts as they were)
            self.counts[self.ids[p]] += 1
        return 0


cdef class DecodeLayer:
    """A quantized CPU layer's decode row bound once to its weights and scratch: the attention
    block's prologue (RMSNorm, Q/K/V in one parallel region, QK-norm, RoPE) and the rest of the
    layer (O, residual, RMSNorm, the MLP: gate/up in one parallel region, SwiGLU, down, or a
    MoeBlock; residual) as two calls that run in C from start to end: weight pointers, shapes
    and the 8-bit activation buffers are set up here, not per call.  The same kernels in the
    same order as the op-by-op path (matvec_many, moe_forward and the row kernels), so both
    give the same bits."""
    cdef object _keep
    cdef QuantMat mats[7]          # Q, K, V | O | gate, up | down (a MoeBlock: the first 4)
    cdef MoeBlock moe
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
                                      # (with moe: Q, K, V, O only)
                 attn_norm, mlp_norm, q_norm, k_norm,   # [dim], [dim], [D] (per head) or [H*D] / [KVH*D] (whole), or None
                 inv_freq,            # [D/2] float64 or None
                 h, o, x1,            # scratch [M, dim]
                 float eps, bint neox, int num_heads, int num_kv_heads, int head_dim,
                 int max_rows=1,      # M
                 MoeBlock moe=None):  # the MLP as a mixture of experts (max_rows >= M)
        cdef int i
        cdef const uint8_t[:, ::1] w
        cdef float[:, ::1] ov
        cdef const double[::1] f
        cdef int count = 7 if moe is None else 4
        if len(mats) != count:
            raise ValueError("DecodeLayer takes the 7 projections Q, K, V, O, gate, up, down "
                             "(with a MoeBlock: Q, K, V, O)")
        if max_rows < 1 or (moe is not None and moe.max_rows < max_rows):
            raise ValueError("DecodeLayer: max_rows >= 1, and no more than the MoeBlock's")
        self.max_rows = max_rows
        self.moe = moe
        self._keep = (mats, attn_norm, mlp_norm, q_norm, k_norm, inv_freq, h, o, x1)
        self.H, self.KVH, self.D, self.neox, self.eps = num_heads, num_kv_heads, head_dim, neox, eps
        self.dim = attn_norm.shape[0]
        self.inter = mats[4][1].shape[0] if moe is None else moe.inter
        ins = [self.dim, self.dim, self.dim, num_heads * head_dim, self.dim, self.dim, self.inter]
        if moe is not None and moe.dim != self.dim:
            raise ValueError("DecodeLayer: the MoeBlock's width is not the layer's")
        for i in range(count):
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
                or (moe is None and (self.mats[5].n_out != self.inter
                                     or self.mats[6].n_out != self.dim)):
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
        self.gate = self.up = NULL
        if moe is None:
            self.gate, self.up = self.mats[4].out, self.mats[5].out
        self.max_in = max(ins[:count])
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
        cdef int failed
        with nogil:
            failed = self.epilogue_c(&att[0, 0], &x[0, 0], &out[0, 0], 1, num_threads)
        if failed:
            raise MemoryError("mixture of experts: no memory for the 8-bit activations")

    cdef int epilogue_c(self, const float *att, const float *x, float *out, int rows,
                        int num_threads) noexcept nogil:
        """att [rows, H*D], x and out [rows, dim] (out may be x).  -1 when the experts' call
        found no memory (out untouched), else 0."""
        cdef Py_ssize_t d, r, dim = self.dim
        self._project(3, 1, att, self.H * self.D, rows, num_threads)
        for d in range(rows * dim):
            self.x1[d] = x[d] + self.o[d]
        for r in range(rows):
            hy_rmsnorm_row(self.x1 + r * dim, self.mlp_norm, self.eps, self.h + r * dim, dim)
        if self.moe is not None:
            if self.moe.run(self.h, rows, self.o, num_threads):
                return -1
        else:
            self._project(4, 2, self.h, dim, rows, num_threads)
            hy_silu_mul(self.gate, self.up, self.gate, rows * self.inter)
            self._project(6, 1, self.gate, self.inter, rows, num_threads)
        for d in range(rows * dim):
            out[d] = self.x1[d] + self.o[d]
        return 0


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
                if not failed and L.epilogue_c(&att[0, 0], &x[0, 0], &x[0, 0], <int> R,
                                               num_threads):
                    failed = 2
            if failed == 2:
                raise MemoryError("mixture of experts: no memory for the 8-bit activations")
            if failed:
                raise MemoryError("paged attention: could not allocate per-thread scratch")
    finally:
        free(cs); free(sn)
