/* One task of paged causal attention on the CPU: a tile of query rows of one sequence, one KV
 * head (with every query head of its GQA group), and one contiguous range of key positions.
 * attention.pyx plans the tasks, runs them on OpenMP threads and merges split ranges.
 *
 * KV layout (owned and documented by hybrid/kvcache.py): every block of a layer holds
 *   [num_kv_heads, block_size, head_dim]  float32 or float16, C order,
 * so the rows of one KV head inside a block are contiguous (block_size * head_dim elements).
 * Blocks are reached through per-sequence tables of block base addresses (int64), exactly as the
 * cache hands them out; K and V are never gathered into a contiguous copy.
 *
 * Numerics: one pass of online softmax in float32 (running max m, running sum l, accumulator
 * acc rescaled by exp(m_old - m_new)); float16 rows are converted to float32 one block at a time.
 */
#ifndef HYBRID_ATTENTION_CORE_H
#define HYBRID_ATTENTION_CORE_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

typedef struct {
    int num_heads;     /* query heads H */
    int num_kv_heads;  /* KV heads; H % num_kv_heads == 0 */
    int head_dim;      /* D */
    int block_size;    /* tokens per block */
    int kv_f16;        /* 1: blocks hold IEEE float16, 0: float32 */
    float scale;       /* softmax scale, usually 1/sqrt(D) */
} hy_attn_shape;

/* Per-thread scratch, sized for the largest task (rows_per_tile * group query vectors). */
typedef struct {
    float *q;    /* [nq, D]  scaled queries */
    float *kbuf; /* [HY_MAX_CHUNKS*block_size, D]  converted K rows (portable f16 path only) */
    float *vbuf; /* [HY_MAX_CHUNKS*block_size, D]  converted V rows */
    float *s;    /* [4, HY_MAX_CHUNKS*block_size]  scores, then probabilities */
    float *m;    /* [nq] running max */
    float *l;    /* [nq] running sum */
    float *acc;  /* [nq, D] running weighted sum of V */
} hy_attn_scratch;

enum { HY_ROWS_GENERIC = 0, HY_ROWS_F32 = 1, HY_ROWS_F16 = 2 };

/* Consecutive blocks whose rows one online-softmax update covers: the per-update work (max,
 * exp, rescale of the accumulators) is paid once per HY_MAX_CHUNKS*block_size keys. */
#define HY_MAX_CHUNKS 1

/* The rows of one KV head in up to HY_MAX_CHUNKS consecutive blocks (consecutive positions). */
typedef struct {
    int n;
    const void *k[HY_MAX_CHUNKS];
    const void *v[HY_MAX_CHUNKS];
    int c[HY_MAX_CHUNKS];
} hy_rows;

/* Online-softmax update of query vectors [i0, i0 + cnt) (cnt = 1 or 4) with the first `see`
 * rows of `rows`.  mode HY_ROWS_F32/F16: rows point into cache blocks (SIMD micro-kernels);
 * HY_ROWS_GENERIC: rows are float32 (portable C). */
static inline void hy_attn_update(const hy_attn_shape *sh, hy_attn_scratch *w, int i0, int cnt,
                                  const hy_rows *rows, int see, int mode) {
    const int D = sh->head_dim, ldp = HY_MAX_CHUNKS * sh->block_size;
    const float *q = w->q + (long)i0 * D;
    float *acc = w->acc + (long)i0 * D;
    float alpha[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    int total = 0;
    /* scores s[g, j] = q_g . k_j, chunk by chunk */
    for (int ch = 0; ch < rows->n && total < see; ch++) {
        int c = rows->c[ch] < see - total ? rows->c[ch] : see - total;
        float *s = w->s + total;
        const void *k = rows->k[ch];
#ifdef HY_AVX2
        if (mode == HY_ROWS_F32) {
            if (cnt == 4) hy_qk4_f32(q, (const float *)k, c, D, s, ldp);
            else hy_qk1_f32(q, (const float *)k, c, D, s);
        } else if (mode == HY_ROWS_F16) {
            if (cnt == 4) hy_qk4_f16(q, (const uint16_t *)k, c, D, s, ldp);
            else hy_qk1_f16(q, (const uint16_t *)k, c, D, s);
        } else
#endif
        {
            for (int g = 0; g < cnt; g++)
                for (int j = 0; j < c; j++)
                    s[g * ldp + j] = hy_dot(q + (long)g * D, (const float *)k + (long)j * D, D);
        }
        total += c;
    }
    /* running max and sum; exp(m_old - m_new) rescales what was accumulated so far */
    for (int g = 0; g < cnt; g++) {
        float *s = w->s + g * ldp;
        int i = i0 + g;
        float bm = hy_max(s, total);
        float m_new = w->m[i] > bm ? w->m[i] : bm;
        alpha[g] = w->m[i] - m_new; /* -inf on the first update: exp gives 0 */
        w->m[i] = m_new;
        alpha[4 + g] = hy_exp_shift_sum(s, total, m_new);
    }
    hy_exp_inplace(alpha, 4);
    for (int g = 0; g < cnt; g++) w->l[i0 + g] = w->l[i0 + g] * alpha[g] + alpha[4 + g];
    /* acc_g = alpha_g * acc_g + sum_j p[g, j] * v_j, chunk by chunk */
    int done = 0;
    for (int ch = 0; ch < rows->n && done < total; ch++) {
        int c = rows->c[ch] < total - done ? rows->c[ch] : total - done;
        const float *p = w->s + done;
        const float *al = done == 0 ? alpha : ones;
        const void *v = rows->v[ch];
#ifdef HY_AVX2
        if (mode == HY_ROWS_F32) {
            if (cnt == 4) hy_pv4_f32(acc, al, p, ldp, (const float *)v, c, D);
            else hy_pv1_f32(acc, al[0], p, (const float *)v, c, D);
        } else if (mode == HY_ROWS_F16) {
            if (cnt == 4) hy_pv4_f16(acc, al, p, ldp, (const uint16_t *)v, c, D);
            else hy_pv1_f16(acc, al[0], p, (const uint16_t *)v, c, D);
        } else
#endif
        {
            if (cnt == 4) hy_axpy_rows4(acc, al, p, ldp, (const float *)v, c, D);
            else hy_axpy_rows(acc, al[0], p, (const float *)v, c, D);
        }
        done += c;
    }
}


static inline void hy_prefetch_rows(const char *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}

/* Run one task.
 *   q        [n_rows, H*D] float32, all query rows of the call
 *   row_pos  [n_rows] int64: position of each row; it sees keys 0..row_pos inclusive
 *   r0, r1   the tile's rows; row_pos is non-decreasing inside a tile
 *   kblk/vblk  this sequence's block base addresses
 *   g0, g1   KV heads [g0, g1); KV head g serves query heads g*G .. g*G+G-1
 *   kb, ke   key positions [kb, ke) of this task (ke is clipped to the tile's last position + 1)
 * Blocks are walked in order and, inside a group of blocks, heads in order, so a task that covers
 * every KV head reads K and V as two forward streams.
 * On return w->m, w->l, w->acc hold the unnormalised state of the nq = (g1-g0)*(r1-r0)*G query
 * vectors, vector ((g-g0)*(r1-r0) + (r-r0))*G + h.  One that saw no key keeps m = -inf, l = 0.
 */
static inline void hy_attn_task(const hy_attn_shape *sh, hy_attn_scratch *w, const float *q,
                                const int64_t *row_pos, long r0, long r1, const int64_t *kblk,
                                const int64_t *vblk, int g0, int g1, long kb, long ke) {
    const int D = sh->head_dim, bs = sh->block_size;
    const int G = sh->num_heads / sh->num_kv_heads;
    const long HD = (long)sh->num_heads * D;
    const long nrows = r1 - r0;
    const int nq = (int)((g1 - g0) * nrows * G);
    const size_t esize = sh->kv_f16 ? 2 : 4;
    const size_t piece = (size_t)bs * D * esize; /* one head's rows in one block */
    const int mode = hy_attn_simd_ok(D, sh->kv_f16) ? (sh->kv_f16 ? HY_ROWS_F16 : HY_ROWS_F32)
                                                     : HY_ROWS_GENERIC;

    /* scaled queries, [kv head, row, head in group, D] */
    for (int g = g0; g < g1; g++)
        for (long r = r0; r < r1; r++)
            for (int h = 0; h < G; h++) {
                const float *src = q + r * HD + (long)(g * G + h) * D;
                float *dst = w->q + (((g - g0) * nrows + (r - r0)) * G + h) * (long)D;
                for (int d = 0; d < D; d++) dst[d] = src[d] * sh->scale;
            }
    for (int i = 0; i < nq; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * (size_t)nq * D);

    long last = row_pos[r1 - 1] + 1;
    if (ke > last) ke = last;
    const long b_end = (ke + bs - 1) / bs; /* one past the last block touched */
    for (long b = kb / bs; b < b_end; b += HY_MAX_CHUNKS) {
        int nch = (int)(b_end - b < HY_MAX_CHUNKS ? b_end - b : HY_MAX_CHUNKS);
        long base = (b * bs > kb ? b * bs : kb); /* position of the first row */
        for (int g = g0; g < g1; g++) {
            hy_rows rows;
            rows.n = nch;
            for (int ch = 0; ch < nch; ch++) {
                long bb = b + ch;
                long j0 = (bb * bs > kb ? bb * bs : kb) - bb * bs;
                long j1 = ((bb + 1) * bs < ke ? (bb + 1) * bs : ke) - bb * bs;
                /* rows j0.. of KV head g inside block bb; addresses widened before arithmetic */
                size_t off = ((size_t)g * bs + (size_t)j0) * D * esize;
                rows.k[ch] = (const char *)(intptr_t)kblk[bb] + off;
                rows.v[ch] = (const char *)(intptr_t)vblk[bb] + off;
                rows.c[ch] = (int)(j1 - j0);
                if (mode == HY_ROWS_GENERIC && sh->kv_f16) {
                    float *kc = w->kbuf + (long)ch * bs * D, *vc = w->vbuf + (long)ch * bs * D;
                    hy_f16_to_f32((const uint16_t *)rows.k[ch], kc, (long)rows.c[ch] * D);
                    hy_f16_to_f32((const uint16_t *)rows.v[ch], vc, (long)rows.c[ch] * D);
                    rows.k[ch] = kc;
                    rows.v[ch] = vc;
                }
            }
            /* Software prefetch of this head's V rows and the next piece's K rows, so they arrive
             * while the scores are computed: the rows of one head in consecutive blocks are
             * num_kv_heads pieces apart, a pattern the hardware prefetchers do not follow
             * (without it one thread read 8 GB/s of a 35 GB/s machine; with it 12). */
            hy_prefetch_rows((const char *)rows.v[0], (size_t)rows.c[0] * D * esize);
            if (g + 1 < g1)
                hy_prefetch_rows((const char *)rows.k[0] + piece, (size_t)rows.c[0] * D * esize);
            else if (b + 1 < b_end)
                hy_prefetch_rows((const char *)(intptr_t)kblk[b + 1] + (size_t)g0 * piece, piece);
            for (long r = r0; r < r1; r++) {
                long see = row_pos[r] + 1 - base; /* rows of this group visible to row r */
                if (see <= 0) continue;
                int i = (int)(((g - g0) * nrows + (r - r0)) * G), iend = i + G;
                int cs = see < (long)HY_MAX_CHUNKS * bs ? (int)see : HY_MAX_CHUNKS * bs;
                for (; i + 4 <= iend; i += 4) hy_attn_update(sh, w, i, 4, &rows, cs, mode);
                for (; i < iend; i++) hy_attn_update(sh, w, i, 1, &rows, cs, mode);
            }
        }
    }
}

#endif /* HYBRID_ATTENTION_CORE_H */
