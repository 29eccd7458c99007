"""Paged causal attention on the CPU, straight over the KV cache's blocks.

Queries are float32; blocks are float32 or float16 in the layout documented in hybrid/kvcache.py
(K and V rows of each KV head interleaved inside a block).  Work is cut into tasks of (query-row
tile, range of KV heads, key range); each task loads a K/V row once for every query head of its
GQA group, and a decode task covers every KV head so it reads blocks front to back.  When there
are too few tasks to keep every thread busy (decode at long context with few KV heads), the key
range is split and the partial (max, sum, acc) states are merged in fp32.

A row's key range is cut at fixed positions (every SPLIT_TOKENS keys, rounded up to whole blocks)
that depend on nothing but its length, and the pieces are merged in order: a row's result is
the same bits alone, in any batch, in any prefill tile and on any number of threads (batch
invariance; the split pieces are also what spreads a long decode over the threads).
"""
from cython.parallel cimport parallel, prange
from libc.math cimport expf, INFINITY
from libc.stdint cimport int8_t, int32_t, int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

import numpy as np

cdef extern from "simd.h" nogil:
    void *hy_alloc64(size_t n)
    void hy_q8_rows_to_f32(const unsigned char *src, float *dst, int c, long n)

cdef extern from "attention_core.h" nogil:
    size_t hy_kv_row_bytes(int kv_type, int D)
    size_t hy_kv_unit_bytes(int kv_type)
    void hy_kv_store_row(int kv_type, int key, const float *x, void *head, int slot, int bs, int D)
    int hy_attn_q8_int_scores()
    enum: HY_KV_Q8

_NO_PARTIAL2 = np.zeros((1, 1), dtype=np.float32)
_NO_PARTIAL3 = np.zeros((1, 1, 1), dtype=np.float32)

cdef enum:
    # Query vectors (rows x heads of one GQA group) a task handles at most; bounds scratch to
    # 32 * head_dim floats of accumulator per thread.
    QUERY_VECTORS_PER_TASK = 32
    # Key ranges are cut every this many tokens (rounded up to whole blocks), whatever the batch.
    SPLIT_TOKENS = 512
    # Task columns: r0, r1, table offset, first kv head, end kv head, first key, end key,
    # partial slot (-1: the task covers all keys of its rows and writes out directly)
    NCOL = 8
    # Merge columns: r0, r1, first kv head, end kv head, first partial slot, number of splits
    MCOL = 6
    # Below this many (query vector x key x head_dim) multiply-adds the call runs on one thread.
    PARALLEL_MIN_WORK = 262144


cdef hy_attn_scratch *_alloc_scratch(int nq, int D, int bs) noexcept nogil:
    cdef hy_attn_scratch *w = <hy_attn_scratch *> malloc(sizeof(hy_attn_scratch))
    if w == NULL:
        return NULL
    w.q = <float *> hy_alloc64(sizeof(float) * nq * D)
    w.kbuf = <float *> hy_alloc64(sizeof(float) * bs * D)
    w.vbuf = <float *> hy_alloc64(sizeof(float) * bs * D)
    w.s = <float *> hy_alloc64(sizeof(float) * 4 * bs)
    w.m = <float *> hy_alloc64(sizeof(float) * nq)
    w.l = <float *> hy_alloc64(sizeof(float) * nq)
    w.acc = <float *> hy_alloc64(sizeof(float) * nq * D)
    w.qa = <int8_t *> hy_alloc64(sizeof(int8_t) * nq * D)
    w.qd = <float *> hy_alloc64(sizeof(float) * nq * (D // 32 + 1))
    w.qc = <int32_t *> hy_alloc64(sizeof(int32_t) * nq * (D // 32 + 1))
    w.pf = <float *> hy_alloc64(sizeof(float) * 4 * (D // 32 + 1) * bs)
    return w


cdef bint _scratch_ok(hy_attn_scratch *w) noexcept nogil:
    return (w != NULL and w.q != NULL and w.kbuf != NULL and w.vbuf != NULL and w.s != NULL
            and w.m != NULL and w.l != NULL and w.acc != NULL and w.qa != NULL and w.qd != NULL
            and w.qc != NULL and w.pf != NULL)


cdef void _free_scratch(hy_attn_scratch *w) noexcept nogil:
    if w == NULL:
        return
    free(w.q); free(w.kbuf); free(w.vbuf); free(w.s); free(w.m); free(w.l); free(w.acc)
    free(w.qa); free(w.qd); free(w.qc); free(w.pf)
    free(w)


cdef void _finish_direct(const hy_attn_shape *sh, hy_attn_scratch *w, long r0, long r1,
                         int g0, int g1, float *out) noexcept nogil:
    """out[r, head, :] = acc / l for every query vector of a task that covered all its keys."""
    cdef int D = sh.head_dim
    cdef int G = sh.num_heads // sh.num_kv_heads
    cdef long HD = <long> sh.num_heads * D
    cdef long r, nrows = r1 - r0
    cdef int g, h, d, i
    cdef float inv
    for g in range(g0, g1):
        for r in range(r0, r1):
            for h in range(G):
                i = <int> (((g - g0) * nrows + (r - r0)) * G + h)
                inv = 1.0 / w.l[i] if w.l[i] > 0 else 0.0
                for d in range(D):
                    out[r * HD + (g * G + h) * D + d] = w.acc[i * D + d] * inv


cdef void _merge_splits(const hy_attn_shape *sh, long r0, long r1, int g0, int g1, long slot0,
                        int nsplit, int maxnq, const float *pm, const float *pl,
                        const float *pacc, float *out) noexcept nogil:
    """Combine the (m, l, acc) states of `nsplit` consecutive partial slots into out."""
    cdef int D = sh.head_dim
    cdef int G = sh.num_heads // sh.num_kv_heads
    cdef long HD = <long> sh.num_heads * D
    cdef long r, slot, nrows = r1 - r0
    cdef int g, h, d, i, s
    cdef float mx, lsum, wgt, inv
    cdef float *o
    for g in range(g0, g1):
        for r in range(r0, r1):
            for h in range(G):
                i = <int> (((g - g0) * nrows + (r - r0)) * G + h)
                mx = -INFINITY
                for s in range(nsplit):
                    slot = slot0 + s
                    if pl[slot * maxnq + i] > 0 and pm[slot * maxnq + i] > mx:
                        mx = pm[slot * maxnq + i]
                o = out + r * HD + (g * G + h) * D
                for d in range(D):
                    o[d] = 0
                lsum = 0
                for s in range(nsplit):
                    slot = slot0 + s
                    if pl[slot * maxnq + i] == 0:
                        continue
                    wgt = expf(pm[slot * maxnq + i] - mx)
                    lsum = lsum + pl[slot * maxnq + i] * wgt
                    for d in range(D):
                        o[d] += wgt * pacc[(slot * maxnq + i) * D + d]
                inv = 1.0 / lsum if lsum > 0 else 0.0
                for d in range(D):
                    o[d] *= inv


cdef inline hy_attn_shape _shape(int num_heads, int num_kv_heads, int head_dim, int block_size,
                                long head_stride, int kv_type, float scale,
                                long window, float softcap) noexcept nogil:
    cdef hy_attn_shape sh
    sh.num_heads, sh.num_kv_heads, sh.head_dim = num_heads, num_kv_heads, head_dim
    sh.block_size, sh.kv_type, sh.head_stride, sh.scale = block_size, kv_type, head_stride, scale
    sh.window, sh.softcap = window, softcap
    return sh


cdef inline int _heads_per_task(int num_kv_heads, int tile, int group) noexcept nogil:
    """KV heads a task of `tile` query rows takes (its query vectors <= QUERY_VECTORS_PER_TASK)."""
    return <int> max(1, min(num_kv_heads, QUERY_VECTORS_PER_TASK // (tile * group)))


cdef inline bint _one_thread(long work, int num_heads) noexcept nogil:
    """Whether `work` (query rows x the keys each sees, summed) is too little for a parallel
    region: below PARALLEL_MIN_WORK multiply-adds at head_dim 64."""
    return work * num_heads * 64 < PARALLEL_MIN_WORK


cdef object _plan(const int64_t[::1] row_pos, const int64_t[::1] seg_rows,
                  const int64_t[::1] seg_table, int num_kv_heads, int group, int block_size,
                  int nthreads):
    """Cut the work into tasks.

    A tile of query rows of one sequence x a range of KV heads x a range of keys.  Decode rows
    (one per sequence) take every KV head in one task, so a task streams whole blocks; prefill
    tiles take one head and up to QUERY_VECTORS_PER_TASK query vectors.  Each tile's keys are
    split at fixed positions (_splits), so the tasks of a long row spread over the threads.
    Returns (tasks [n, NCOL], merges [m, MCOL], n_partial, max query vectors per task, threads).
    """
    cdef int nseg = seg_rows.shape[0] - 1
    cdef long max_rows = 0
    cdef int s
    for s in range(nseg):
        max_rows = max(max_rows, seg_rows[s + 1] - seg_rows[s])
    cdef int tile = max(1, QUERY_VECTORS_PER_TASK // group)
    if max_rows < tile:
        tile = <int> max(1, max_rows)
    cdef int heads = _heads_per_task(num_kv_heads, tile, group)
    cdef long work = 0
    for s in range(nseg):
        work += (seg_rows[s + 1] - seg_rows[s]) * (row_pos[seg_rows[s + 1] - 1] + 1)
    if _one_thread(work, num_kv_heads * group):
        nthreads = 1

    # pass 1: key ranges per tile, and the sizes of the tables
    cdef long ranges = 0, split_tiles = 0
    cdef long r0, r1, keys, chunk, kb
    cdef int nsplit, g0, g1, rt
    cdef double best, cost
    _count_ranges(row_pos, seg_rows, tile, block_size, &ranges, &split_tiles)
    if ranges * ((num_kv_heads + heads - 1) // heads) < nthreads:
        # too few tasks for the threads (a sequence's few verify rows): fewer KV heads a task
        # (each head's sums are the same whichever task holds it)
        heads = <int> max(1, num_kv_heads * ranges // nthreads)
    if nthreads > 1 and tile > 1 and ranges * ((num_kv_heads + heads - 1) // heads) < 2 * nthreads:
        # too few tasks to share evenly (one sequence's few verify rows): the row tile whose
        # tasks of one KV head finish soonest, counted in passes of four query vectors (each
        # row's sums are the same whichever tile holds it)
        best = _tile_cost(row_pos, seg_rows, tile, heads, num_kv_heads, group, block_size,
                          nthreads)
        for rt in range(tile, 0, -1):
            cost = _tile_cost(row_pos, seg_rows, rt, 1, num_kv_heads, group, block_size,
                              nthreads)
            if cost < best:
                best, tile, heads = cost, rt, 1
        ranges = split_tiles = 0
        _count_ranges(row_pos, seg_rows, tile, block_size, &ranges, &split_tiles)
    cdef int head_groups = (num_kv_heads + heads - 1) // heads
    cdef long n_tasks = ranges * head_groups, n_merges = split_tiles * head_groups, n_partial = 0
    tasks = np.empty((n_tasks, NCOL), dtype=np.int64)
    merges = np.empty((n_merges, MCOL), dtype=np.int64)
    cdef int64_t[:, ::1] tv = tasks
    cdef int64_t[:, ::1] mv = merges
    # pass 2: fill them
    cdef long t = 0, m = 0
    for s in range(nseg):
        r0 = seg_rows[s]
        while r0 < seg_rows[s + 1]:
            r1 = min(r0 + tile, seg_rows[s + 1])
            keys = row_pos[r1 - 1] + 1
            nsplit = _splits(keys, block_size, &chunk)
            g0 = 0
            while g0 < num_kv_heads:
                g1 = min(g0 + heads, num_kv_heads)
                if nsplit > 1:
                    mv[m, 0] = r0; mv[m, 1] = r1; mv[m, 2] = g0; mv[m, 3] = g1
                    mv[m, 4] = n_partial; mv[m, 5] = nsplit
                    m += 1
                kb = 0
                while kb < keys:
                    tv[t, 0] = r0; tv[t, 1] = r1; tv[t, 2] = seg_table[s]; tv[t, 3] = g0
                    tv[t, 4] = g1; tv[t, 5] = kb; tv[t, 6] = min(kb + chunk, keys)
                    if nsplit > 1:
                        tv[t, 7] = n_partial
                        n_partial += 1
                    else:
                        tv[t, 7] = -1
                    t += 1
                    kb += chunk
                g0 = g1
            r0 = r1
    return tasks, merges, n_partial, tile * heads * group, nthreads


cdef void _count_ranges(const int64_t[::1] row_pos, const int64_t[::1] seg_rows, int tile,
                       int block_size, long *ranges, long *split_tiles) noexcept:
    """Key ranges over every tile of `tile` rows, and how many tiles have more than one."""
    cdef long r0, r1, chunk
    cdef int s, nsplit
    for s in range(seg_rows.shape[0] - 1):
        r0 = seg_rows[s]
        while r0 < seg_rows[s + 1]:
            r1 = min(r0 + tile, seg_rows[s + 1])
            nsplit = _splits(row_pos[r1 - 1] + 1, block_size, &chunk)
            ranges[0] += nsplit
            split_tiles[0] += nsplit > 1
            r0 = r1


cdef double _tile_cost(const int64_t[::1] row_pos, const int64_t[::1] seg_rows, int tile,
                       int heads, int num_kv_heads, int group, int block_size,
                       int nthreads) noexcept:
    """Estimated time of a plan with row tiles of `tile` rows and `heads` KV heads a task, in
    passes of four query vectors over one block of keys: its tasks handed in order to the first
    free thread, as the dynamic schedule does, each costing its passes and one more for its
    setup."""
    cdef double free_at[64]
    cdef long r0, r1, chunk
    cdef int s, nsplit, k, i, first, n = min(nthreads, 64)
    cdef long groups = (num_kv_heads + heads - 1) // heads
    cdef double passes, end = 0
    for i in range(n):
        free_at[i] = 0
    for s in range(seg_rows.shape[0] - 1):
        r0 = seg_rows[s]
        while r0 < seg_rows[s + 1]:
            r1 = min(r0 + tile, seg_rows[s + 1])
            nsplit = _splits(row_pos[r1 - 1] + 1, block_size, &chunk)
            # (the last range may be shorter: counted whole, as the estimate needs no more)
            passes = 1 + heads * (((r1 - r0) * group + 3) // 4) * \
                ((min(chunk, row_pos[r1 - 1] + 1) + block_size - 1) // block_size)
            for k in range(nsplit * groups):
                first = 0
                for i in range(1, n):
                    if free_at[i] < free_at[first]:
                        first = i
                free_at[first] += passes
                end = max(end, free_at[first])
            r0 = r1
    return end


cdef inline int _splits(long keys, int block_size, long *chunk) noexcept:
    """How many key ranges of SPLIT_TOKENS (rounded up to whole blocks) cover `keys`."""
    cdef long c = (SPLIT_TOKENS + block_size - 1) // block_size * block_size
    chunk[0] = c
    return <int> max(1, (keys + c - 1) // c)


cdef inline void _task(const hy_attn_shape *sh, hy_attn_scratch *w, const float *q,
                       const int64_t *row_pos, const int64_t *kptr, const int64_t *vptr,
                       const int64_t[:, ::1] tasks, long t, int maxnq, float *pm, float *pl,
                       float *pacc, float *out) noexcept nogil:
    """Task t, then its output (direct) or its partial state (into its slot)."""
    cdef int i, D = sh.head_dim
    cdef long slot
    hy_attn_task(sh, w, q, row_pos, tasks[t, 0], tasks[t, 1], kptr + tasks[t, 2],
                 vptr + tasks[t, 2], <int> tasks[t, 3], <int> tasks[t, 4], tasks[t, 5], tasks[t, 6])
    slot = tasks[t, 7]
    if slot < 0:
        _finish_direct(sh, w, tasks[t, 0], tasks[t, 1], <int> tasks[t, 3], <int> tasks[t, 4], out)
    else:
        i = <int> ((tasks[t, 1] - tasks[t, 0]) * (tasks[t, 4] - tasks[t, 3])
                   * (sh.num_heads // sh.num_kv_heads))
        memcpy(pm + slot * maxnq, w.m, sizeof(float) * i)
        memcpy(pl + slot * maxnq, w.l, sizeof(float) * i)
        memcpy(pacc + slot * maxnq * D, w.acc, sizeof(float) * i * D)


cdef void _run(const hy_attn_shape *sh, const float *q, const int64_t *row_pos,
               const int64_t *kptr, const int64_t *vptr, const int64_t[:, ::1] tasks,
               const int64_t[:, ::1] merges, int maxnq, float *pm, float *pl, float *pacc,
               float *out, int nthreads, int *failed, hy_attn_scratch *serial=NULL) noexcept nogil:
    """Run the tasks on nthreads threads, then the merges.  With one thread and a caller's
    scratch (``serial``) no parallel region is opened and nothing is allocated."""
    cdef hy_attn_scratch *w = NULL
    cdef long t
    cdef long n_tasks = tasks.shape[0]
    cdef long n_merges = merges.shape[0]
    if nthreads == 1 and serial != NULL:
        for t in range(n_tasks):
            _task(sh, serial, q, row_pos, kptr, vptr, tasks, t, maxnq, pm, pl, pacc, out)
        for t in range(n_merges):
            _merge_splits(sh, merges[t, 0], merges[t, 1], <int> merges[t, 2], <int> merges[t, 3],
                          merges[t, 4], <int> merges[t, 5], maxnq, pm, pl, pacc, out)
        return
    with parallel(num_threads=nthreads):
        w = _alloc_scratch(maxnq, sh.head_dim, sh.block_size)
        if not _scratch_ok(w):
            failed[0] = 1
        for t in prange(n_tasks, schedule="dynamic"):
            if failed[0]:
                continue
            _task(sh, w, q, row_pos, kptr, vptr, tasks, t, maxnq, pm, pl, pacc, out)
        _free_scratch(w)
    if n_merges > 0 and not failed[0]:
        for t in prange(n_merges, schedule="dynamic", num_threads=nthreads):
            _merge_splits(sh, merges[t, 0], merges[t, 1], <int> merges[t, 2], <int> merges[t, 3],
                          merges[t, 4], <int> merges[t, 5], maxnq, pm, pl, pacc, out)


cdef _attend(float[:, ::1] q, const int64_t[::1] row_pos, const int64_t[::1] seg_rows,
             const int64_t[::1] seg_table, const int64_t[::1] k_ptrs, const int64_t[::1] v_ptrs,
             int num_heads, int num_kv_heads, int head_dim, int block_size, long head_stride,
             int kv_type, float scale, float[:, ::1] out, int num_threads, long window=0,
             float softcap=0):
    cdef hy_attn_shape sh = _shape(num_heads, num_kv_heads, head_dim, block_size, head_stride,
                                   kv_type, scale, window, softcap)
    cdef int group = num_heads // num_kv_heads
    tasks, merges, n_partial, maxnq_o, num_threads = _plan(row_pos, seg_rows, seg_table,
                                                          num_kv_heads, group, block_size,
                                                          num_threads)
    cdef int maxnq = maxnq_o
    if n_partial:
        pm_a = np.empty((n_partial, maxnq), dtype=np.float32)
        pl_a = np.empty((n_partial, maxnq), dtype=np.float32)
        pacc_a = np.empty((n_partial, maxnq, head_dim), dtype=np.float32)
    else:  # no split: the partial buffers are never touched
        pm_a, pl_a, pacc_a = _NO_PARTIAL2, _NO_PARTIAL2, _NO_PARTIAL3
    cdef float[:, ::1] pm = pm_a
    cdef float[:, ::1] pl = pl_a
    cdef float[:, :, ::1] pacc = pacc_a
    cdef const int64_t[:, ::1] tv = tasks
    cdef const int64_t[:, ::1] mv = merges
    cdef int failed = 0
    if tv.shape[0] == 0:
        return
    with nogil:
        _run(&sh, &q[0, 0], &row_pos[0], &k_ptrs[0], &v_ptrs[0], tv, mv, maxnq, &pm[0, 0],
             &pl[0, 0], &pacc[0, 0, 0], &out[0, 0], num_threads, &failed)
    if failed:
        raise MemoryError("paged attention: could not allocate per-thread scratch")


def q8_0_scores():
    """How this build scores a q8_0 KV cache (its queries quantized to 8 bits either way)."""
    cdef int how = hy_attn_q8_int_scores()
    if how == 2:
        return "int8 block dot products (vpdpbusd, 16 keys per pass)"
    if how == 1:
        return "int8 block dot products (maddubs, 8 keys per pass)"
    return "float32 on the dequantized 8-bit query"


def _check_common(q, out, int num_heads, int num_kv_heads, int head_dim, int block_size,
                  long head_stride):
    if head_stride < <long> block_size * head_dim:
        raise ValueError(f"head_stride ({head_stride}) is smaller than block_size*head_dim "
                         f"({block_size * head_dim}): heads' rows would overlap")
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of "
                         f"num_kv_heads ({num_kv_heads})")
    if head_dim <= 0 or block_size <= 0:
        raise ValueError(f"head_dim ({head_dim}) and block_size ({block_size}) must be positive")
    if q.shape[1] != num_heads * head_dim:
        raise ValueError(f"q has {q.shape[1]} columns, expected num_heads*head_dim = "
                         f"{num_heads * head_dim}")
    if out.shape[0] != q.shape[0] or out.shape[1] != q.shape[1]:
        raise ValueError(f"out shape {tuple(out.shape)} != q shape {tuple(q.shape)}")


def paged_attention(float[:, ::1] q,            # IN  [n_rows, num_heads*head_dim] float32
                    long start_pos,             # IN  position of query row 0
                    const int64_t[::1] k_ptrs,  # IN  [n_blocks] base address of each K block
                    const int64_t[::1] v_ptrs,  # IN  [n_blocks] base address of each V block
                    int num_heads, int num_kv_heads, int head_dim, int block_size,
                    long head_stride,           # elements (q8_0: bytes) between KV heads' rows
                    int kv_type,                # 0 float32, 1 float16, 2 q8_0 (kvpool.KV_CODES)
                    float scale,
                    float[:, ::1] out,          # OUT [n_rows, num_heads*head_dim] float32
                    int num_threads, long window=0, float softcap=0):
    """Causal attention of one sequence: row i sees key positions 0 .. start_pos + i (with a
    sliding ``window`` > 0, the last ``window`` of them)."""
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: none), got {window}")
    if not softcap >= 0:
        raise ValueError(f"softcap must be >= 0 (0: none), got {softcap}")
    _check_common(q, out, num_heads, num_kv_heads, head_dim, block_size, head_stride)
    cdef long n = q.shape[0]
    if n == 0:
        return
    if start_pos < 0:
        raise ValueError(f"start_pos must be >= 0, got {start_pos}")
    cdef long need = (start_pos + n + block_size - 1) // block_size
    if k_ptrs.shape[0] < need or v_ptrs.shape[0] < need:
        raise ValueError(f"block tables hold {min(k_ptrs.shape[0], v_ptrs.shape[0])} blocks, "
                         f"{start_pos + n} keys need {need}")
    cdef hy_attn_shape sh
    cdef long chunk
    cdef int failed = 0
    if n == 1 and _splits(start_pos + 1, block_size, &chunk) == 1 and (
            num_threads <= 1 or _one_thread(start_pos + 1, num_heads)):
        sh = _shape(num_heads, num_kv_heads, head_dim, block_size, head_stride, kv_type, scale,
                    window, softcap)
        with nogil:
            failed = _decode_row_serial(&sh, &q[0, 0], start_pos, &k_ptrs[0], &v_ptrs[0],
                                        &out[0, 0])
        if failed:
            raise MemoryError("paged attention: could not allocate scratch")
        return
    row_pos = np.arange(start_pos, start_pos + n, dtype=np.int64)
    seg_rows = np.array([0, n], dtype=np.int64)
    seg_table = np.zeros(1, dtype=np.int64)
    _attend(q, row_pos, seg_rows, seg_table, k_ptrs, v_ptrs, num_heads, num_kv_heads, head_dim,
            block_size, head_stride, kv_type, scale, out, num_threads, window, softcap)


cdef int _decode_row_serial(const hy_attn_shape *sh, const float *q, int64_t pos,
                            const int64_t *kptr, const int64_t *vptr, float *out) noexcept nogil:
    """One decode row that _plan would give one thread and one key range: its tasks (a group of
    KV heads each) run here in _plan's order with the same calls, without the task tables, the
    parallel region or the numpy arrays (what a short context's step costs otherwise).
    Returns 1 when scratch allocation failed."""
    cdef int group = sh.num_heads // sh.num_kv_heads
    cdef int heads = _heads_per_task(sh.num_kv_heads, 1, group)
    cdef int g0 = 0, g1
    cdef hy_attn_scratch *w = _alloc_scratch(heads * group, sh.head_dim, sh.block_size)
    if not _scratch_ok(w):
        _free_scratch(w)
        return 1
    while g0 < sh.num_kv_heads:
        g1 = min(g0 + heads, sh.num_kv_heads)
        hy_attn_task(sh, w, q, &pos, 0, 1, kptr, vptr, g0, g1, 0, pos + 1)
        _finish_direct(sh, w, 0, 1, g0, g1, out)
        g0 = g1
    _free_scratch(w)
    return 0


def plan(long n_rows, long start_pos, int num_kv_heads, int group, int block_size,
         int num_threads):
    """The task table paged_attention would run for one sequence (introspection and tests).

    Returns (tasks [n, 8]: r0, r1, table offset, kv head begin, kv head end, key begin, key end,
    partial slot; threads used).
    """
    row_pos = np.arange(start_pos, start_pos + n_rows, dtype=np.int64)
    tasks, merges, n_partial, maxnq, threads = _plan(
        row_pos, np.array([0, n_rows], dtype=np.int64), np.zeros(1, dtype=np.int64),
        num_kv_heads, group, block_size, num_threads)
    return tasks, threads


cdef class RaggedStep:
    """One ragged step's attention, planned once and run for every layer (FlashInfer's plan /
    run): the tasks, merges and partial buffers depend on the rows, not on the layer.

    ``layer(q, k, v, k_addr, v_addr, out)`` writes each row's K/V (float32 in, converted to the
    cache dtype here) into its slot and attends: the block addresses of a layer come from its
    address table (block id -> K / V address) and the step's block ids, gathered in C."""
    def __init__(self, const int64_t[::1] row_pos,    # [T] position of each row
                 const int64_t[::1] seg_rows,         # [S+1]
                 const int64_t[::1] seg_table,        # [S] offsets into table_ids
                 const int64_t[::1] table_ids,        # [blocks] block ids, sequence after sequence
                 const int64_t[::1] row_block,        # [T] block id holding each row
                 const int64_t[::1] row_slot,         # [T] slot of each row in its block
                 int num_heads, int num_kv_heads, int head_dim, int block_size, long head_stride,
                 int kv_type, float scale, int num_threads, long window=0, float softcap=0):
        cdef long T = row_pos.shape[0], S = seg_table.shape[0], s, i, nblk, b
        if head_stride < <long> block_size * head_dim or num_heads <= 0 or num_kv_heads <= 0 \
                or num_heads % num_kv_heads or head_dim <= 0 or block_size <= 0:
            raise ValueError("ragged step: inconsistent heads, head_dim, block_size or head_stride")
        if seg_rows.shape[0] != S + 1 or seg_rows[0] != 0 or seg_rows[S] != T \
                or row_block.shape[0] != T or row_slot.shape[0] != T or T == 0:
            raise ValueError("ragged step: row_pos, row_block and row_slot need T > 0 entries, "
                             "seg_rows S+1 from 0 to T")
        self.max_id = -1
        for b in range(table_ids.shape[0]):
            if table_ids[b] < 0:
                raise ValueError(f"ragged step: negative block id {table_ids[b]}")
            self.max_id = max(self.max_id, table_ids[b])
        for s in range(S):
            if seg_rows[s + 1] < seg_rows[s]:
                raise ValueError(f"ragged step: seg_rows decreases at sequence {s}")
            for i in range(seg_rows[s], seg_rows[s + 1]):
                nblk = row_pos[i] // block_size + 1
                if row_pos[i] < 0 or seg_table[s] < 0 or seg_table[s] + nblk > table_ids.shape[0]:
                    raise ValueError(f"ragged step: row {i} (position {row_pos[i]}) needs {nblk} "
                                     f"blocks from table offset {seg_table[s]}, the table holds "
                                     f"{table_ids.shape[0]}")
                if row_slot[i] < 0 or row_slot[i] >= block_size or row_block[i] < 0 \
                        or row_block[i] != table_ids[seg_table[s] + row_pos[i] // block_size]:
                    raise ValueError(f"ragged step: row {i} is not stored where its position "
                                     f"puts it")
        if window < 0:
            raise ValueError(f"window must be >= 0 (0: none), got {window}")
        self.sh = _shape(num_heads, num_kv_heads, head_dim, block_size, head_stride, kv_type, scale,
                         window, softcap)
        self.tasks, self.merges, n_partial, maxnq, self.nthreads = _plan(
            row_pos, seg_rows, seg_table, num_kv_heads, num_heads // num_kv_heads, block_size,
            num_threads)
        self.maxnq = maxnq
        if n_partial:
            self.pm_a = np.empty((n_partial, maxnq), dtype=np.float32)
            self.pl_a = np.empty((n_partial, maxnq), dtype=np.float32)
            self.pacc_a = np.empty((n_partial, maxnq, head_dim), dtype=np.float32)
        else:
            self.pm_a, self.pl_a, self.pacc_a = _NO_PARTIAL2, _NO_PARTIAL2, _NO_PARTIAL3
        self.nblocks = table_ids.shape[0]
        self.kp_a = np.empty(max(1, self.nblocks), dtype=np.int64)
        self.vp_a = np.empty(max(1, self.nblocks), dtype=np.int64)
        self._keep = (row_pos, seg_rows, seg_table, table_ids, row_block, row_slot)
        self.T = T
        self.row_pos, self.table_ids = &row_pos[0], &table_ids[0] if self.nblocks else NULL
        self.row_block, self.row_slot = &row_block[0], &row_slot[0]
        self.tv, self.mv = self.tasks, self.merges
        cdef float[:, ::1] pm = self.pm_a
        cdef float[:, ::1] pl = self.pl_a
        cdef float[:, :, ::1] pacc = self.pacc_a
        cdef int64_t[::1] kp = self.kp_a
        cdef int64_t[::1] vp = self.vp_a
        self.pm, self.pl, self.pacc = &pm[0, 0], &pl[0, 0], &pacc[0, 0, 0]
        self.kp, self.vp = &kp[0], &vp[0]
        self.serial = NULL
        if self.nthreads == 1:  # run on the calling thread with this scratch, every layer
            self.serial = _alloc_scratch(self.maxnq, head_dim, block_size)
            if not _scratch_ok(self.serial):
                _free_scratch(self.serial)
                self.serial = NULL
                raise MemoryError("paged attention: could not allocate scratch")

    def __dealloc__(self):
        _free_scratch(self.serial)

    def layer(self, float[:, ::1] q,          # IN  [T, num_heads*head_dim]
              const float[:, ::1] k,          # IN  [T, num_kv_heads*head_dim] float32
              const float[:, ::1] v,          # IN  [T, num_kv_heads*head_dim] float32
              const int64_t[::1] k_addr,      # IN  [pool blocks] this layer's K block addresses
              const int64_t[::1] v_addr,      # IN  [pool blocks] its V block addresses
              float[:, ::1] out):             # OUT [T, num_heads*head_dim]
        """Write the step's K/V rows of one layer into their slots, then attend."""
        cdef int D = self.sh.head_dim
        cdef long kvd = <long> self.sh.num_kv_heads * D
        cdef int failed
        if q.shape[0] != self.T or k.shape[0] != self.T or v.shape[0] != self.T \
                or out.shape[0] != self.T or q.shape[1] != self.sh.num_heads * D \
                or out.shape[1] != q.shape[1] or k.shape[1] != kvd or v.shape[1] != kvd:
            raise ValueError("ragged step: q/out [T, H*D] and k/v [T, KVH*D] for the planned T")
        self.check_tables(k_addr.shape[0], v_addr.shape[0])
        with nogil:
            failed = self.run(&q[0, 0], &k[0, 0], &v[0, 0], &k_addr[0], &v_addr[0], &out[0, 0])
        if failed:
            raise MemoryError("paged attention: could not allocate per-thread scratch")

    cpdef check_tables(self, long k_blocks, long v_blocks):
        """The address tables must cover every block id the step uses."""
        if k_blocks <= self.max_id or v_blocks <= self.max_id:
            raise ValueError(f"ragged step: the address tables hold {k_blocks} blocks, "
                             f"the step uses block {self.max_id}")

    cdef int run(self, float *q, const float *k, const float *v, const int64_t *k_addr,
                 const int64_t *v_addr, float *out) noexcept nogil:
        """The layer's work on checked arguments (q/out [T, H*D], k/v [T, KVH*D] contiguous;
        the address tables cover the step's blocks).  Returns 1 when scratch allocation failed."""
        cdef int D = self.sh.head_dim, KVH = self.sh.num_kv_heads, h
        cdef long r, b, kvd = <long> KVH * D
        cdef size_t hs = <size_t> self.sh.head_stride * hy_kv_unit_bytes(self.sh.kv_type)
        cdef int slot, bs = self.sh.block_size
        cdef char *kd
        cdef char *vd
        cdef int failed = 0
        for b in range(self.nblocks):
            self.kp[b] = k_addr[self.table_ids[b]]
            self.vp[b] = v_addr[self.table_ids[b]]
        for r in range(self.T):  # row r's K/V heads into its slot (head h: h*hs further)
            slot = <int> self.row_slot[r]
            kd = <char *> <size_t> k_addr[self.row_block[r]]
            vd = <char *> <size_t> v_addr[self.row_block[r]]
            for h in range(KVH):
                hy_kv_store_row(self.sh.kv_type, 1, k + r * kvd + h * D, kd + h * hs, slot, bs, D)
                hy_kv_store_row(self.sh.kv_type, 0, v + r * kvd + h * D, vd + h * hs, slot, bs, D)
        _run(&self.sh, q, self.row_pos, self.kp, self.vp, self.tv, self.mv, self.maxnq,
             self.pm, self.pl, self.pacc, out, self.nthreads, &failed, self.serial)
        return failed



def store_rows_q8_0(const float[:, ::1] k,              # IN  [n, KVH*D] float32 K rows
                    const float[:, ::1] v,              # IN  [n, KVH*D] float32 V rows
                    unsigned char[:, :, :, ::1] block,  # OUT [KVH, 2, bs, D/32*34] one q8_0 block
                    int slot):                          # the first row's slot
    """Rows slot .. slot+n-1 of a q8_0 cache block written as a step writes them (kv_q8.h)."""
    cdef int kvh = block.shape[0], bs = block.shape[2], D
    cdef Py_ssize_t n = k.shape[0], r
    cdef int h
    D = block.shape[3] // 34 * 32
    if block.shape[1] != 2 or block.shape[3] != D // 32 * 34 or k.shape[1] != kvh * D \
            or v.shape[0] != n or v.shape[1] != kvh * D or slot < 0 or slot + n > bs:
        raise ValueError(f"q8_0 rows: k, v [n, KVH*D] into slots {slot}.. of a block "
                         f"{tuple(block.shape)[:4]}, got {tuple(k.shape)[:2]}, {tuple(v.shape)[:2]}")
    with nogil:
        for r in range(n):
            for h in range(kvh):
                hy_kv_store_row(HY_KV_Q8, 1, &k[r, h * D], &block[h, 0, 0, 0], <int> (slot + r), bs, D)
                hy_kv_store_row(HY_KV_Q8, 0, &v[r, h * D], &block[h, 1, 0, 0], <int> (slot + r), bs, D)


def dequantize_rows_q8_0(const unsigned char[:, ::1] q,  # IN  [n, d / 32 * 34] q8_0 rows
                         float[:, ::1] out):             # OUT [n, d] float32
    """q8_0 rows widened to float32 as the attention kernels widen them."""
    cdef Py_ssize_t n = q.shape[0], d = out.shape[1]
    if d % 32 or out.shape[0] != n or q.shape[1] != d // 32 * 34:
        raise ValueError(f"q8_0 rows: q [n, d/32*34] and out [n, d] with d % 32 == 0, got "
                         f"{tuple(q.shape)[:2]} and {tuple(out.shape)[:2]}")
    if n:
        with nogil:
            hy_q8_rows_to_f32(&q[0, 0], &out[0, 0], <int> n, d)
