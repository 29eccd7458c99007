/* The AVX-512 online-softmax update of paged attention: up to four query vectors against `c`
 * rows of one KV head, rows read in place from a cache block (float32, or float16 converted in
 * registers).  Used by attention_core.h when the build targets AVX-512 (F, VL, BW, DQ) and the
 * head dimension is a multiple of 16; AVX2 (simd.h) and portable C serve everything else.
 *
 * Steps, for NQ query vectors (1..4) of one KV head:
 *   1. scores   s[g, j] = q_g . k_j       two keys per pass, 16 lanes, one FMA chain per (g, key);
 *                                         four chains reduced together (hy512_hsum4)
 *   2. softmax  m_new = max(m, max_j s),  p = exp(s - m_new),  l = l*alpha + sum p,
 *               alpha = exp(m - m_new)    16 scores per vector, masked tails; the NQ vectors
 *                                         side by side, their maxima and sums reduced in one
 *                                         transposed tree (one block's softmax per vector
 *                                         would be one long latency chain)
 *   3. values   acc_g = alpha_g*acc_g + sum_j p[g, j] v_j     64 dimensions at a time held in
 *                                         registers for all NQ queries across the c rows
 *
 * q8_0 rows are widened in registers (factor times value, as the scalar widening forms it).
 *
 * Every query vector goes through exactly the same operations whatever NQ is and whichever other
 * vectors share the pass, so a query's result does not depend on how the caller groups queries
 * (batch invariance: see hybrid/kernel_role.py).
 */
#ifndef HYBRID_ATTENTION_AVX512_H
#define HYBRID_ATTENTION_AVX512_H

#include "simd.h"

#ifdef HY_AVX512

#define HY512_AI static inline __attribute__((always_inline))

/* kv: what the rows hold, attention_core.h's HY_KV_F32 (0), HY_KV_F16 (1), HY_KV_Q8 (2) */
#define HY512_Q8 2

/* bytes of one row of D values */
HY512_AI long hy512_row_bytes(const int kv, int D) {
    return kv == HY512_Q8 ? (long)D / 32 * 34 : (long)D * (kv ? 2 : 4);
}

/* the 16 values of row j starting at column d (d % 16 == 0), as float32; q8_0: factor * value,
 * the product the scalar widening (simd.h, hy_q8_rows_to_f32) forms */
HY512_AI __m512 hy512_ld(const void *base, long j, int d, int D, const int kv) {
    if (kv == HY512_Q8) {
        const uint8_t *blk = (const uint8_t *)base + j * hy512_row_bytes(kv, D) + 34 * (d >> 5);
        short h;
        memcpy(&h, blk, 2);
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_set1_epi16(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(blk + 2 + (d & 31))))));
    }
    if (kv) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + j * D + d)));
    return _mm512_loadu_ps((const float *)base + j * D + d);
}

/* the 32 values of row j's q8_0 block at column d (d % 32 == 0), the two halves of
 * hy512_ld's, with the factor read once */
HY512_AI void hy512_ld_q8_block(const void *base, long j, int d, int D, __m512 *lo, __m512 *hi) {
    const uint8_t *blk = (const uint8_t *)base + j * hy512_row_bytes(HY512_Q8, D) + 34 * (d >> 5);
    short h;
    memcpy(&h, blk, 2);  /* (the factor broadcast as float16, then widened) */
    const __m512 f = _mm512_cvtph_ps(_mm256_set1_epi16(h));
    *lo = _mm512_mul_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
    *hi = _mm512_mul_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
}

/* [sum(a), sum(b), sum(c), sum(d)] with one fixed reduction order for every lane */
HY512_AI __m128 hy512_hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    return hy_hsum4x256(a8, b8, c8, d8);
}

/* mask of the first n (0..16) lanes */
HY512_AI __mmask16 hy512_first(int n) { return (__mmask16)((1u << n) - 1u); }

/* Step 1: s[g*ldp + j] = q_g . row_j for g < NQ, j < c. */
HY512_AI void hy512_scores(const int NQ, const int kv, const float *q, const void *k, int c,
                           int D, float *s, int ldp) {
    const __m512 z = _mm512_setzero_ps();
    const long row = hy512_row_bytes(kv, D); /* bytes per K row */
    int j = 0;
    for (; j + 2 <= c; j += 2) {
        __m512 a0[4] = {z, z, z, z}, a1[4] = {z, z, z, z};
        /* software prefetch of this pass's K rows, a fixed distance on (simd.h; the
         * value passes do the same for their V rows) */
        HY_ATTN_PREFETCH((const char *)k + (long)j * row, 2 * row);
        if (kv == HY512_Q8) {  /* a block (32 values, one factor) of each key per step */
            for (int d = 0; d < D; d += 32) {
                __m512 x0[2], x1[2];
                hy512_ld_q8_block(k, j, d, D, &x0[0], &x0[1]);
                hy512_ld_q8_block(k, j + 1, d, D, &x1[0], &x1[1]);
                for (int h = 0; h < 2; h++)
                    for (int g = 0; g < NQ; g++) {
                        const __m512 qv = _mm512_loadu_ps(q + g * D + d + 16 * h);
                        a0[g] = _mm512_fmadd_ps(qv, x0[h], a0[g]);
                        a1[g] = _mm512_fmadd_ps(qv, x1[h], a1[g]);
                    }
            }
        } else {
            for (int d = 0; d < D; d += 16) {
                const __m512 x0 = hy512_ld(k, j, d, D, kv);
                const __m512 x1 = hy512_ld(k, j + 1, d, D, kv);
                for (int g = 0; g < NQ; g++) {
                    const __m512 qv = _mm512_loadu_ps(q + g * D + d);
                    a0[g] = _mm512_fmadd_ps(qv, x0, a0[g]);
                    a1[g] = _mm512_fmadd_ps(qv, x1, a1[g]);
                }
            }
        }
        float t0[4], t1[4];
        _mm_storeu_ps(t0, hy512_hsum4(a0[0], a0[1], a0[2], a0[3]));
        _mm_storeu_ps(t1, hy512_hsum4(a1[0], a1[1], a1[2], a1[3]));
        for (int g = 0; g < NQ; g++) { s[g * ldp + j] = t0[g]; s[g * ldp + j + 1] = t1[g]; }
    }
    if (j < c) {
        __m512 a0[4] = {z, z, z, z};
        for (int d = 0; d < D; d += 16) {
            const __m512 x0 = hy512_ld(k, j, d, D, kv);
            for (int g = 0; g < NQ; g++)
                a0[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + d), x0, a0[g]);
        }
        float t0[4];
        _mm_storeu_ps(t0, hy512_hsum4(a0[0], a0[1], a0[2], a0[3]));
        for (int g = 0; g < NQ; g++) s[g * ldp + j] = t0[g];
    }
}

/* [max(a), max(b), max(c), max(d)] */
HY512_AI __m128 hy512_hmax4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 a8 = _mm256_max_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_max_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_max_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_max_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    /* per 128-bit half: [a0 v a2, b0 v b2, a1 v a3, b1 v b3], the same for c, d */
    const __m256 ab = _mm256_max_ps(_mm256_unpacklo_ps(a8, b8), _mm256_unpackhi_ps(a8, b8));
    const __m256 cd = _mm256_max_ps(_mm256_unpacklo_ps(c8, d8), _mm256_unpackhi_ps(c8, d8));
    const __m256 abcd = _mm256_max_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_max_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Step 2 for NQ query vectors together (row g of the scores at s + g*ldp): updates m, l [NQ];
 * leaves probabilities in s; alpha[g] = exp(m_old - m_new).  The NQ chains run side by side
 * and their reductions share one transposed tree; lanes past NQ carry -inf / 0 and are dropped,
 * so a vector's result does not depend on NQ. */
HY512_AI void hy512_softmax_n(const int NQ, float *s, int ldp, int c, float *m, float *l,
                              float *alpha) {
    const __mmask8 live = (__mmask8)((1u << NQ) - 1u);
    __m512 mv[4], sum[4];
    for (int g = 0; g < 4; g++) { mv[g] = _mm512_set1_ps(-INFINITY); sum[g] = _mm512_setzero_ps(); }
    for (int j = 0; j < c; j += 16) {
        const __mmask16 t = c - j >= 16 ? (__mmask16)0xFFFF : hy512_first(c - j);
        for (int g = 0; g < NQ; g++)
            mv[g] = _mm512_mask_max_ps(mv[g], t, mv[g], _mm512_maskz_loadu_ps(t, s + g * ldp + j));
    }
    const __m128 m_old = _mm_mask_loadu_ps(_mm_set1_ps(-INFINITY), live, m);
    const __m128 bm = hy512_hmax4(mv[0], mv[1], mv[2], mv[3]);
    const __m128 m_new = _mm_max_ps(m_old, bm); /* m_old > bm ? m_old : bm */
    __m512 mn[4];
    for (int g = 0; g < NQ; g++) mn[g] = _mm512_permutexvar_ps(_mm512_set1_epi32(g), _mm512_castps128_ps512(m_new));
    for (int j = 0; j < c; j += 16) {
        const __mmask16 t = c - j >= 16 ? (__mmask16)0xFFFF : hy512_first(c - j);
        for (int g = 0; g < NQ; g++) {
            const __m512 e = hy_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + g * ldp + j), mn[g]));
            _mm512_mask_storeu_ps(s + g * ldp + j, t, e);
            sum[g] = _mm512_mask_add_ps(sum[g], t, sum[g], e);
        }
    }
    /* exp(m_old - m_new): -inf before the first update gives 0 (dead lanes: -inf - -inf = NaN,
     * never stored) */
    const __m128 a = _mm512_castps512_ps128(hy_exp512(_mm512_castps128_ps512(_mm_sub_ps(m_old, m_new))));
    const __m128 sums = hy512_hsum4(sum[0], sum[1], sum[2], sum[3]);
    _mm_mask_storeu_ps(l, live, _mm_add_ps(_mm_mul_ps(_mm_maskz_loadu_ps(live, l), a), sums));
    _mm_mask_storeu_ps(m, live, m_new);
    _mm_mask_storeu_ps(alpha, live, a);
}

/* Step 3 over W vectors (16*W dimensions starting at d) for NQ queries, accumulators in registers */
HY512_AI void hy512_values(const int NQ, const int W, const int kv, float *acc, const float *alpha,
                           const float *p, int ldp, const void *v, int c, int D, int d) {
    __m512 a[4][4];
    for (int g = 0; g < NQ; g++) {
        const __m512 al = _mm512_set1_ps(alpha[g]);
        for (int t = 0; t < W; t++) a[g][t] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + d + 16 * t), al);
    }
    const long row = hy512_row_bytes(kv, D), at = kv == HY512_Q8 ? 34 * (d >> 5) : d * (kv ? 2 : 4);
    for (int j = 0; j < c; j++) {
        HY_ATTN_PREFETCH((const char *)v + j * row + at, kv == HY512_Q8 ? W * 17 : W * 16 * (kv ? 2 : 4));
        __m512 pg[4];
        for (int g = 0; g < NQ; g++) pg[g] = _mm512_set1_ps(p[g * ldp + j]);
        if (kv == HY512_Q8 && W % 2 == 0) {  /* whole blocks: one factor per 32 values */
            for (int t = 0; t < W; t += 2) {
                __m512 x[2];
                hy512_ld_q8_block(v, j, d + 16 * t, D, &x[0], &x[1]);
                for (int h = 0; h < 2; h++)
                    for (int g = 0; g < NQ; g++) a[g][t + h] = _mm512_fmadd_ps(pg[g], x[h], a[g][t + h]);
            }
        } else {
            for (int t = 0; t < W; t++) {
                const __m512 x = hy512_ld(v, j, d + 16 * t, D, kv);
                for (int g = 0; g < NQ; g++) a[g][t] = _mm512_fmadd_ps(pg[g], x, a[g][t]);
            }
        }
    }
    for (int g = 0; g < NQ; g++)
        for (int t = 0; t < W; t++) _mm512_storeu_ps(acc + g * D + d + 16 * t, a[g][t]);
}

/* One update of NQ query vectors q [NQ, D] (state m, l [NQ], acc [NQ, D]) by rows k, v [c, D]. */
HY512_AI void hy512_update_n(const int NQ, const int kv, const float *q, float *m, float *l,
                             float *acc, float *s, int ldp, const void *k, const void *v, int c,
                             int D) {
    float alpha[4];
    hy512_scores(NQ, kv, q, k, c, D, s, ldp);
    hy512_softmax_n(NQ, s, ldp, c, m, l, alpha);
    int d = 0;
    for (; d + 64 <= D; d += 64) hy512_values(NQ, 4, kv, acc, alpha, s, ldp, v, c, D, d);
    for (; d < D; d += 16) hy512_values(NQ, 1, kv, acc, alpha, s, ldp, v, c, D, d);
}

/* nq (1..4) query vectors; D % 16 == 0 (q8_0 rows: D % 32 == 0) */
static inline void hy512_update(int nq, int kv, const float *q, float *m, float *l, float *acc,
                                float *s, int ldp, const void *k, const void *v, int c, int D) {
#define HY512_CASE(N)                                                                    \
    if (kv == HY512_Q8) hy512_update_n(N, HY512_Q8, q, m, l, acc, s, ldp, k, v, c, D);   \
    else if (kv) hy512_update_n(N, 1, q, m, l, acc, s, ldp, k, v, c, D);                \
    else hy512_update_n(N, 0, q, m, l, acc, s, ldp, k, v, c, D);                        \
    return;
    switch (nq) {
    case 4: HY512_CASE(4)
    case 3: HY512_CASE(3)
    case 2: HY512_CASE(2)
    default: HY512_CASE(1)
    }
#undef HY512_CASE
}

#endif /* HY_AVX512 */
#endif /* HYBRID_ATTENTION_AVX512_H */
