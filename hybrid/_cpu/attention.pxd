# Shared with quant.pyx, whose whole-step decode runs a RaggedStep's layer work from C.
from libc.stdint cimport int8_t, int32_t, int64_t

cdef extern from "attention_core.h" nogil:
    ctypedef struct hy_attn_shape:
        int num_heads
        int num_kv_heads
        int head_dim
        int block_size
        int kv_type
        long head_stride
        float scale
        long window
        float softcap
    ctypedef struct hy_attn_scratch:
        float *q
        float *kbuf
        float *vbuf
        float *s
        float *m
        float *l
        float *acc
        int8_t *qa
        float *qd
        int32_t *qc
        float *pf
    void hy_attn_task(const hy_attn_shape *sh, hy_attn_scratch *w, const float *q,
                      const int64_t *row_pos, long r0, long r1, const int64_t *kblk,
                      const int64_t *vblk, int g0, int g1, long kb, long ke)


cdef class RaggedStep:
    cdef object _keep
    cdef object tasks, merges, pm_a, pl_a, pacc_a, kp_a, vp_a
    cdef const int64_t[:, ::1] tv
    cdef const int64_t[:, ::1] mv
    cdef hy_attn_shape sh
    cdef int maxnq, nthreads
    cdef long T, nblocks, max_id
    cdef const int64_t *row_pos
    cdef const int64_t *table_ids
    cdef const int64_t *row_block
    cdef const int64_t *row_slot
    cdef float *pm
    cdef float *pl
    cdef float *pacc
    cdef int64_t *kp
    cdef int64_t *vp
    cdef hy_attn_scratch *serial
    cpdef check_tables(self, long k_blocks, long v_blocks)
    cdef int run(self, float *q, const float *k, const float *v, const int64_t *k_addr,
                 const int64_t *v_addr, float *out) noexcept nogil
