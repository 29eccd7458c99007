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
    float *kbuf; /* [block_size, D]  converted K rows (float16 caches only) */
    float *vbuf; /* [block_size, D]  converted V rows */
    float *s;    /* [4, block_size]  scores, then probabilities */
    float *m;    /* [nq] running max */
    float *l;    /* [nq] running sum */
    float *acc;  /* [nq, D] running weighted sum of V */
} hy_attn_scratch;

/* Online-softmax update of query vectors [i0, i0 + cnt) (cnt = 1 or 4, all seeing the first `c`
 * rows of k/v) with those rows. */
static inline void hy_attn_update(const hy_attn_shape *sh, hy_attn_scratch *w, int i0, int cnt,
                                  const float *k, const float *v, int c) {
    const int D = sh->head_dim;
    float alpha[4];
    /* scores of the chunk: s[g, j] = q_g . k_j */
    if (cnt == 4) {
        float t[4];
        for (int j = 0; j < c; j++) {
            hy_dot4(w->q + (long)i0 * D, k + (long)j * D, D, t);
            for (int g = 0; g < 4; g++) w->s[g * sh->block_size + j] = t[g];
        }
    } else {
        for (int j = 0; j < c; j++) w->s[j] = hy_dot(w->q + (long)i0 * D, k + (long)j * D, D);
    }
    /* running max, rescale factor, probabilities and running sum */
    for (int g = 0; g < cnt; g++) {
        float *s = w->s + g * sh->block_size;
        int i = i0 + g;
        float bm = s[0];
        for (int j = 1; j < c; j++) bm = s[j] > bm ? s[j] : bm;
        float m_old = w->m[i];
        float m_new = m_old > bm ? m_old : bm;
        alpha[g] = (m_old == -INFINITY) ? 0.0f : expf(m_old - m_new);
        for (int j = 0; j < c; j++) s[j] -= m_new;
        hy_exp_inplace(s, c);
        float ps = 0.0f;
        for (int j = 0; j < c; j++) ps += s[j];
        w->l[i] = w->l[i] * alpha[g] + ps;
        w->m[i] = m_new;
    }
    if (cnt == 4)
        hy_axpy_rows4(w->acc + (long)i0 * D, alpha, w->s, sh->block_size, v, c, D);
    else
        hy_axpy_rows(w->acc + (long)i0 * D, alpha[0], w->s, v, c, D);
}

/* Run one task.
 *   q        [n_rows, H*D] float32, all query rows of the call
 *   row_pos  [n_rows] int64: position of each row; it sees keys 0..row_pos inclusive
 *   r0, r1   the tile's rows; row_pos is non-decreasing inside a tile
 *   kblk/vblk  this sequence's block base addresses
 *   kv_head  the KV head g; its query heads are g*G .. g*G+G-1
 *   kb, ke   key positions [kb, ke) of this task (ke is clipped to the tile's last position + 1)
 * On return w->m, w->l, w->acc hold the unnormalised state of the nq = (r1-r0)*G query vectors,
 * ordered row-major (row, head in group).  A query vector that saw no key keeps m = -inf, l = 0.
 */
static inline void hy_attn_task(const hy_attn_shape *sh, hy_attn_scratch *w, const float *q,
                                const int64_t *row_pos, long r0, long r1, const int64_t *kblk,
                                const int64_t *vblk, int kv_head, long kb, long ke) {
    const int D = sh->head_dim, bs = sh->block_size;
    const int G = sh->num_heads / sh->num_kv_heads;
    const long HD = (long)sh->num_heads * D;
    const int nq = (int)(r1 - r0) * G;
    const size_t esize = sh->kv_f16 ? 2 : 4;

    /* scaled queries of the tile, [row, head in group, D] */
    for (long r = r0; r < r1; r++)
        for (int h = 0; h < G; h++) {
            const float *src = q + r * HD + (long)(kv_head * G + h) * D;
            float *dst = w->q + ((r - r0) * G + h) * (long)D;
            for (int d = 0; d < D; d++) dst[d] = src[d] * sh->scale;
        }
    for (int i = 0; i < nq; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * (size_t)nq * D);

    long last = row_pos[r1 - 1] + 1;
    if (ke > last) ke = last;
    for (long b = kb / bs; b * bs < ke; b++) {
        long j0 = (b * bs > kb ? b * bs : kb) - b * bs;       /* first row inside the block */
        long j1 = ((b + 1) * bs < ke ? (b + 1) * bs : ke) - b * bs; /* one past the last row */
        int c = (int)(j1 - j0);
        /* rows j0.. of KV head kv_head inside block b; block ids are widened before arithmetic */
        size_t off = ((size_t)kv_head * bs + (size_t)j0) * D * esize;
        const char *kp = (const char *)(intptr_t)kblk[b] + off;
        const char *vp = (const char *)(intptr_t)vblk[b] + off;
        const float *k, *v;
        if (sh->kv_f16) {
            hy_f16_to_f32((const uint16_t *)kp, w->kbuf, (long)c * D);
            hy_f16_to_f32((const uint16_t *)vp, w->vbuf, (long)c * D);
            k = w->kbuf;
            v = w->vbuf;
        } else {
            k = (const float *)kp;
            v = (const float *)vp;
        }
        long base = b * bs + j0; /* position of row 0 of k/v */
        for (long r = r0; r < r1; r++) {
            long see = row_pos[r] + 1 - base; /* rows of this chunk visible to row r */
            if (see <= 0) continue;
            int cr = see < c ? (int)see : c;
            int i = (int)(r - r0) * G, iend = i + G;
            for (; i + 4 <= iend; i += 4) hy_attn_update(sh, w, i, 4, k, v, cr);
            for (; i < iend; i++) hy_attn_update(sh, w, i, 1, k, v, cr);
        }
    }
}

#endif /* HYBRID_ATTENTION_CORE_H */
