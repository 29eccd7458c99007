/* One task of paged causal attention on the CPU: a tile of query rows of one sequence, one KV
 * head (with every query head of its GQA group), and one contiguous range of key positions.
 * attention.pyx plans the tasks, runs them on OpenMP threads and merges split ranges.
 *
 * KV layout (owned and documented by hybrid/kvcache.py): inside a K (or V) block, the rows of
 * one KV head are contiguous (block_size * head_dim elements) and consecutive heads are
 * head_stride elements apart.  The cache interleaves K and V per head ([num_kv_heads, 2,
 * block_size, head_dim]), so head_stride = 2*block_size*head_dim and one task reads a block as a
 * single forward stream: K of head 0, V of head 0, K of head 1, ...
 * Blocks are reached through per-sequence tables of block base addresses (int64), exactly as the
 * cache hands them out; K and V are never gathered into a contiguous copy.
 *
 * Numerics: one pass of online softmax in float32 (running max m, running sum l, accumulator
 * acc rescaled by exp(m_old - m_new)); float16 rows are converted to float32 one block at a time
 * (or on the fly by the SIMD kernels), q8_0 rows one block at a time into the scratch.
 * Over q8_0 rows each scaled query is first quantized to 8 bits exactly as the integer mat-vec
 * quantizes activations (quant_activations.h; reference.quantize_activations), and the scores
 * are the dot products of those blocks with the cached blocks, as llama.cpp scores a q8_0 K
 * cache: in integers where the build has AVX2 (with F16C) or AVX-512, both giving the same
 * scores, and in float32 on the query's dequantized values in portable builds
 * (reference.attention, kv_dtype "q8_0").
 */
#ifndef HYBRID_ATTENTION_CORE_H
#define HYBRID_ATTENTION_CORE_H

#include <math.h>
#include <stdint.h>

#include "simd.h"
#include "attention_avx2.h"
#include "quant_activations.h"

typedef struct {
    int num_heads;     /* query heads H */
    int num_kv_heads;  /* KV heads; H % num_kv_heads == 0 */
    int head_dim;      /* D */
    int block_size;    /* tokens per block */
    int kv_type;       /* HY_KV_F32, HY_KV_F16 (IEEE float16) or HY_KV_Q8 (ggml's q8_0 rows) */
    long head_stride;  /* elements (bytes for q8_0) from one KV head's rows to the next head's */
    float scale;       /* softmax scale, usually 1/sqrt(D) */
    long window;       /* > 0: a row at position p sees keys p - window + 1 .. p only */
    float softcap;     /* > 0: scores s become softcap * tanh(s / softcap) (Gemma 2) */
} hy_attn_shape;

/* Per-thread scratch, sized for the largest task (rows_per_tile * group query vectors). */
typedef struct {
    float *q;    /* [nq, D]  scaled queries */
    float *kbuf; /* [block_size, D]  converted K rows (portable float16 path only) */
    float *vbuf; /* [block_size, D]  converted V rows */
    float *s;    /* [4, block_size]  scores, then probabilities */
    float *m;    /* [nq] running max */
    float *l;    /* [nq] running sum */
    float *acc;  /* [nq, D] running weighted sum of V */
    /* q8_0 rows only: the scaled queries in 8 bits (hy_attn_quantize_queries) */
    int8_t *qa;   /* [nq, D] values */
    float *qd;    /* [nq, D/32] their block scales */
    int32_t *qc;  /* [nq, D/32] -128 times each block's sum (the offset of u8 x s8 products) */
    float *pf;    /* [4, D/32, block_size] probabilities times each V row's block scales */
} hy_attn_scratch;

enum { HY_ROWS_GENERIC = 0, HY_ROWS_F32 = 1, HY_ROWS_F16 = 2, HY_ROWS_Q8 = 3 };

/* What a KV block holds: float32, float16, or q8_0 rows (34 bytes per 32 values, by plane: kv_q8.h) */
enum { HY_KV_F32 = 0, HY_KV_F16 = 1, HY_KV_Q8 = 2 };

#include "attention_avx512.h" /* (after the scratch it updates) */

/* How q8_0 rows are scored: 2 in integers by AVX-512 VNNI, 1 in integers by AVX2 (the same
 * scores), 0 in float32 (portable builds) */
static inline int hy_attn_q8_int_scores(void) {
#if defined(HY512_VNNI)
    return 2;
#elif defined(HY_AVX2) && defined(HY_F16C)
    return 1;
#else
    return 0;
#endif
}

/* bytes of one cached row of one KV head, and of one unit of head_stride */
static inline size_t hy_kv_row_bytes(int kv_type, int D) {
    return kv_type == HY_KV_Q8 ? (size_t)D / 32 * 34 : (size_t)D * (kv_type == HY_KV_F16 ? 2 : 4);
}
static inline size_t hy_kv_unit_bytes(int kv_type) {
    return kv_type == HY_KV_Q8 ? 1 : kv_type == HY_KV_F16 ? 2 : 4;
}

/* one row of D float32 values into row `slot` of one KV head's K (key != 0) or V rows in a block
 * of bs rows starting at head (the K/V a step writes; q8_0 rows in kv_q8.h's layout) */
static inline void hy_kv_store_row(int kv_type, int key, const float *x, void *head, int slot,
                                   int bs, int D) {
    char *dst = (char *)head + (size_t)slot * hy_kv_row_bytes(kv_type, D);
    if (kv_type == HY_KV_F16) hy_f32_to_f16(x, (uint16_t *)dst, D);
    else if (kv_type == HY_KV_Q8) hy_q8kv_store(key, x, head, slot, bs, D);
    else memcpy(dst, x, sizeof(float) * (size_t)D);
}

/* Online-softmax update of query vectors [i0, i0 + cnt) (cnt = 1 or 4) with rows j .. j+c-1 of
 * k and v.  mode HY_ROWS_F32/F16/Q8: k, v are one KV head's rows in a cache block (SIMD
 * micro-kernels); HY_ROWS_GENERIC: k, v are float32 rows (portable C). */
static inline void hy_attn_update(const hy_attn_shape *sh, hy_attn_scratch *w, int i0, int cnt,
                                  const void *kh, const void *vh, int j, int c, int mode) {
    const int D = sh->head_dim, ldp = sh->block_size;
    const size_t rb = (size_t)D * (mode == HY_ROWS_F16 ? 2 : 4); /* (float rows) */
    const void *k = (const char *)kh + (mode == HY_ROWS_Q8 ? 0 : j * rb);
    const void *v = (const char *)vh + (mode == HY_ROWS_Q8 ? 0 : j * rb);
    const float *q = w->q + (long)i0 * D;
    float *acc = w->acc + (long)i0 * D;
    float alpha[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sums[4];
    /* scores s[g, j] = q_g . k_j */
#ifdef HY_AVX2
    if (mode == HY_ROWS_F32) {
        if (cnt == 4) hy_qk4_f32(q, (const float *)k, c, D, w->s, ldp);
        else hy_qk1_f32(q, (const float *)k, c, D, w->s);
    } else if (mode == HY_ROWS_F16) {
        if (cnt == 4) hy_qk4_f16(q, (const uint16_t *)k, c, D, w->s, ldp);
        else hy_qk1_f16(q, (const uint16_t *)k, c, D, w->s);
    } else
#endif
#if defined(HY_AVX2) && defined(HY_F16C)
    if (mode == HY_ROWS_Q8) {
        const int8_t *qa = w->qa + (long)i0 * D;
        const float *qd = w->qd + (long)i0 * (D / 32);
        if (cnt == 4) hy_qk4_q8(qa, qd, kh, j, ldp, c, D, w->s, ldp);
        else hy_qk1_q8(qa, qd, kh, j, ldp, c, D, w->s);
    } else
#endif
    {
        for (int g = 0; g < cnt; g++)
            for (int j = 0; j < c; j++)
                w->s[g * ldp + j] = hy_dot(q + (long)g * D, (const float *)k + (long)j * D, D);
    }
    if (sh->softcap > 0) { /* capped scores: softcap * tanh(s / softcap) */
        const float cap = sh->softcap;
        for (int g = 0; g < cnt; g++)
            for (int j = 0; j < c; j++) w->s[g * ldp + j] = cap * tanhf(w->s[g * ldp + j] / cap);
    }
    /* running max and sum; exp(m_old - m_new) rescales what was accumulated so far */
    for (int g = 0; g < cnt; g++) {
        float *s = w->s + g * ldp;
        int i = i0 + g;
        float bm = hy_max(s, c);
        float m_new = w->m[i] > bm ? w->m[i] : bm;
        alpha[g] = w->m[i] - m_new; /* -inf on the first update: exp gives 0 */
        w->m[i] = m_new;
        sums[g] = hy_exp_shift_sum(s, c, m_new);
    }
    hy_exp_inplace(alpha, 8); /* one vector exp for all of them */
    for (int g = 0; g < cnt; g++) w->l[i0 + g] = w->l[i0 + g] * alpha[g] + sums[g];
    /* acc_g = alpha_g * acc_g + sum_j p[g, j] * v_j */
#ifdef HY_AVX2
    if (mode == HY_ROWS_F32) {
        if (cnt == 4) hy_pv4_f32(acc, alpha, w->s, ldp, (const float *)v, c, D);
        else hy_pv1_f32(acc, alpha[0], w->s, (const float *)v, c, D);
        return;
    }
    if (mode == HY_ROWS_F16) {
        if (cnt == 4) hy_pv4_f16(acc, alpha, w->s, ldp, (const uint16_t *)v, c, D);
        else hy_pv1_f16(acc, alpha[0], w->s, (const uint16_t *)v, c, D);
        return;
    }
#endif
#if defined(HY_AVX2) && defined(HY_F16C)
    if (mode == HY_ROWS_Q8) {  /* probabilities times the rows' factors, then the 8-bit values */
        const uint8_t *vr = (const uint8_t *)hy_q8kv_values(vh, D, ldp) + (long)j * D;
        hy_q8_weights(cnt, w->s, ldp, vh, j, ldp, c, D, w->pf);
        if (cnt == 4) hy_pv4_q8(acc, alpha, w->pf, ldp, vr, c, D);
        else hy_pv1_q8(acc, alpha[0], w->pf, ldp, vr, c, D);
        return;
    }
#endif
    if (cnt == 4) hy_axpy_rows4(acc, alpha, w->s, ldp, (const float *)v, c, D);
    else hy_axpy_rows(acc, alpha[0], w->s, (const float *)v, c, D);
}

/* The nq scaled queries in w->q to 8 bits for q8_0 rows (qa, qd, qc), as hy_q_act quantizes
 * activations; w->q becomes their dequantized values (value times block scale), which the float
 * paths score with. */
static inline void hy_attn_quantize_queries(hy_attn_scratch *w, int nq, int D) {
    const int nb = D / 32;
    for (int i = 0; i < nq; i++) {
        float *q = w->q + (long)i * D;
        const int8_t *qa = w->qa + (long)i * D;
        hy_q_act(q, D, 32, w->qa + (long)i * D, w->qd + i * nb, NULL, NULL);
        for (int b = 0; b < nb; b++) {
            int sum = 0;
            for (int t = 32 * b; t < 32 * b + 32; t++) {
                sum += qa[t];
                q[t] = (float)qa[t] * w->qd[i * nb + b];
            }
            w->qc[i * nb + b] = -128 * sum;
        }
    }
}

/* Run one task.
 *   q        [n_rows, H*D] float32, all query rows of the call
 *   row_pos  [n_rows] int64: position of each row; it sees keys 0..row_pos inclusive (with a
 *            sliding window, row_pos - window + 1 .. row_pos)
 *   r0, r1   the tile's rows; row_pos is non-decreasing inside a tile
 *   kblk/vblk  this sequence's K and V block addresses
 *   g0, g1   KV heads [g0, g1); KV head g serves query heads g*G .. g*G+G-1
 *   kb, ke   key positions [kb, ke) of this task (ke is clipped to the tile's last position + 1)
 * Blocks are walked in order and, inside a block, heads in order: with the cache's interleaved
 * layout a task that covers every KV head reads its key range as one forward stream.
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
    const int f16 = sh->kv_type == HY_KV_F16, q8 = sh->kv_type == HY_KV_Q8;
    const size_t stride = (size_t)sh->head_stride * hy_kv_unit_bytes(sh->kv_type); /* head g to g+1 */
    /* q8_0 rows are widened to float32 in the scratch, then take the float32 kernels */
    int mode = hy_attn_simd_ok(D, f16) ? (f16 ? HY_ROWS_F16 : HY_ROWS_F32) : HY_ROWS_GENERIC;
#ifdef HY_AVX512  /* the AVX-512 many-row pass reads the block in place, q8_0 rows too */
    const int fused512 = mode != HY_ROWS_GENERIC && D % 16 == 0 && sh->window <= 0 && sh->softcap <= 0;
#else
    const int fused512 = 0;
#endif
#if defined(HY_AVX2) && defined(HY_F16C)  /* the AVX2 kernels read q8_0 rows in place too */
    if (q8 && mode != HY_ROWS_GENERIC) mode = HY_ROWS_Q8;
#endif
    const int widen = q8 && !fused512 && mode != HY_ROWS_Q8;  /* q8_0 rows through the scratch */

    /* scaled queries, [kv head, row, head in group, D] */
    for (int g = g0; g < g1; g++)
        for (long r = r0; r < r1; r++)
            for (int h = 0; h < G; h++) {
                const float *src = q + r * HD + (long)(g * G + h) * D;
                float *dst = w->q + (((g - g0) * nrows + (r - r0)) * G + h) * (long)D;
                for (int d = 0; d < D; d++) dst[d] = src[d] * sh->scale;
            }
    if (q8) hy_attn_quantize_queries(w, nq, D);
    for (int i = 0; i < nq; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * (size_t)nq * D);

    long last = row_pos[r1 - 1] + 1;
    if (ke > last) ke = last;
    for (long b = kb / bs; b * bs < ke; b++) {
        long j0 = (b * bs > kb ? b * bs : kb) - b * bs;             /* first row inside the block */
        long j1 = ((b + 1) * bs < ke ? (b + 1) * bs : ke) - b * bs; /* one past the last row */
        int c = (int)(j1 - j0);
        long base = b * bs + j0; /* position of row j0 */
        for (int g = g0; g < g1; g++) {
            /* KV head g's rows inside block b (its rows jk.. are this chunk's); addresses widened
             * before arithmetic */
            size_t off = (size_t)g * stride;
            const void *k = (const char *)(intptr_t)kblk[b] + off;
            const void *v = (const char *)(intptr_t)vblk[b] + off;
            int jk = (int)j0;
            if (widen) {  /* (the SIMD kernels widen q8_0 rows in registers) */
                hy_q8kv_to_f32(1, k, bs, jk, c, D, w->kbuf);
                hy_q8kv_to_f32(0, v, bs, jk, c, D, w->vbuf);
                k = w->kbuf;
                v = w->vbuf;
                jk = 0;
            } else if (mode == HY_ROWS_GENERIC && f16) {
                hy_f16_to_f32((const uint16_t *)k + (size_t)jk * D, w->kbuf, (long)c * D);
                hy_f16_to_f32((const uint16_t *)v + (size_t)jk * D, w->vbuf, (long)c * D);
                k = w->kbuf;
                v = w->vbuf;
                jk = 0;
            }
#ifdef HY_AVX512
            if (fused512) {
                /* rows that see part of the chunk one by one, then every row that sees all of
                 * it as one run of query vectors, four per pass (the layout of w->q keeps a KV
                 * head's vectors of consecutive rows contiguous) */
                long r = r0;
                for (; r < r1; r++) {
                    long see = row_pos[r] + 1 - base;
                    if (see >= c) break;
                    if (see <= 0) continue;
                    int i = (int)(((g - g0) * nrows + (r - r0)) * G), iend = i + G;
                    for (; i < iend; i += 4)
                        hy512_update(iend - i < 4 ? iend - i : 4, sh->kv_type, w, i, bs, k, v,
                                     jk, (int)see, D);
                }
                int i = (int)(((g - g0) * nrows + (r - r0)) * G);
                const int iend = (int)(((g - g0) * nrows + nrows) * G);
                for (; i < iend; i += 4)
                    hy512_update(iend - i < 4 ? iend - i : 4, sh->kv_type, w, i, bs, k, v, jk, c, D);
                continue;
            }
#endif
            for (long r = r0; r < r1; r++) {
                long see = row_pos[r] + 1 - base; /* rows of this chunk visible to row r */
                if (see <= 0) continue;
                int cr = see < c ? (int)see : c, jr = jk;
                if (sh->window > 0) { /* rows before the window: skipped */
                    long skip = row_pos[r] - sh->window + 1 - base;
                    if (skip >= cr) continue;
                    if (skip > 0) {
                        jr += (int)skip;
                        cr -= (int)skip;
                    }
                }
                int i = (int)(((g - g0) * nrows + (r - r0)) * G), iend = i + G;
                for (; i + 4 <= iend; i += 4) hy_attn_update(sh, w, i, 4, k, v, jr, cr, mode);
                for (; i < iend; i++) hy_attn_update(sh, w, i, 1, k, v, jr, cr, mode);
            }
        }
    }
}

#endif /* HYBRID_ATTENTION_CORE_H */
