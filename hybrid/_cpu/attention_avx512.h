/* The AVX-512 online-softmax update of paged attention: up to four query vectors against `c`
 * rows of one KV head, rows read in place from a cache block (float32, or float16 converted in
 * registers).  Used by attention_core.h when the build targets AVX-512 (F, VL, BW, DQ) and the
 * head dimension is a multiple of 16; AVX2 (attention_avx2.h) and portable C serve everything else.
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
 * q8_0 rows (ggml's 34-byte blocks of 32 values, stored in a block by plane: kv_q8.h):
 *   scores  with AVX-512 VNNI, sixteen keys at a time: one load of the K layout holds four
 *           values of each key, and vpdpbusd against four broadcast values of the query's 8-bit
 *           copy (attention_core.h) gives every key's exact integer dot product of a block, which
 *           then takes the key's and the query's factors (sixteen keys' factors in one load).
 *           Without VNNI, the AVX2 pass of attention_avx2.h (eight keys, maddubs), which gives
 *           the same scores.
 *   values  the probabilities times each row's block factors first (16 rows at a time), then
 *           the rows' 8-bit values widened and accumulated against them.
 *
 * Every query vector goes through exactly the same operations whatever NQ is and whichever other
 * vectors share the pass, so a query's result does not depend on how the caller groups queries
 * (batch invariance: see hybrid/kernel_role.py).
 */
#ifndef HYBRID_ATTENTION_AVX512_H
#define HYBRID_ATTENTION_AVX512_H

#include "attention_avx2.h" /* (the prefetch, and the AVX2 q8_0 score pass) */

#ifdef HY_AVX512

#define HY512_AI static inline __attribute__((always_inline))

/* kv: what the rows hold, attention_core.h's HY_KV_F32 (0), HY_KV_F16 (1), HY_KV_Q8 (2) */
#define HY512_Q8 2

/* bytes of one row of D values (q8_0: of the V head's 8-bit values, kv_q8.h) */
HY512_AI long hy512_row_bytes(const int kv, int D) {
    return kv == HY512_Q8 ? (long)D : (long)D * (kv ? 2 : 4);
}

/* the 16 values of float32 or float16 row j starting at column d (d % 16 == 0), as float32 */
HY512_AI __m512 hy512_ld(const void *base, long j, int d, int D, const int kv) {
    if (kv) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + j * D + d)));
    return _mm512_loadu_ps((const float *)base + j * D + d);
}

/* mask of the first n (0..16) lanes */
HY512_AI __mmask16 hy512_first(int n) { return (__mmask16)((1u << n) - 1u); }

/* The float16 factors of block b for the 16 rows j.. of a q8_0 head (kv_q8.h); lanes past `live`
 * give 0 */
HY512_AI __m512 hy512_q8_factors(const void *head, int bs, int b, int j, __mmask16 live) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, hy_q8kv_factors(head) + (long)b * bs + j));
}

#if defined(__AVX512VNNI__)
#define HY512_VNNI 1

/* *acc += t (unsigned bytes) . the four signed bytes at p, in every dword: vpdpbusd with the
 * four bytes broadcast by its memory operand (a separate broadcast would take a vector pipe
 * slot of its own) */
HY512_AI void hy512_dpbusd_bcast4(__m512i *acc, __m512i t, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(*acc) : "v"(t), "m"(*(const int32_t *)p));
}

/* Step 1 over q8_0 rows with VNNI: s[g*ldp + j] = sum over blocks b, in order, of
 * (fk[j, b] * fq[g, b]) * (qa_g,b . k_j,b) for rows j0 .. j0+c-1 of the K head at `head`
 * (kv_q8.h, bs rows), the dot product exact in int32.  Sixteen keys per pass: one load of the K
 * layout holds four values of each, key j in lane j.  The keys' values are flipped to unsigned
 * (k + 128) for vpdpbusd, whose sums start at -128 * sum(qa_g,b) (qc) to take the offset back
 * out. */
HY512_AI void hy512_scores_q8(const int NQ, const int8_t *qa, const float *qd, const int32_t *qc,
                              const void *head, int j0, int bs, int c, int D, float *s, int ldp) {
    const int nb = D / 32;
    const int8_t *val = hy_q8kv_values(head, D, bs);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int jc = 0; jc < c; jc += 16) {
        const int n = c - jc < 16 ? c - jc : 16, j = j0 + jc;
        const __mmask16 live = hy512_first(n);
        __m512 acc[4];
        for (int g = 0; g < NQ; g++) acc[g] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b += 2) {  /* two blocks (64 values) of each key per pass */
            const int two = b + 1 < nb;
            HY_ATTN_PREFETCH(hy_q8kv_factors(head) + (long)b * bs + j, 64);
            __m512i t[16]; /* t[i]: values 4i..4i+3 of the two blocks */
            for (int i = 0; i < (two ? 16 : 8); i++) {
                const int8_t *x = val + ((long)(8 * b + i) * bs + j) * 4;
                HY_ATTN_PREFETCH(x, 64);
                t[i] = _mm512_xor_si512(_mm512_maskz_loadu_epi32(live, x), flip);
            }
            const __m512 f0 = hy512_q8_factors(head, bs, b, j, live);
            const __m512 f1 = two ? hy512_q8_factors(head, bs, b + 1, j, live) : f0;
            /* per query and block one chain of 8 vpdpbusd; the queries' chains interleaved */
            __m512i i0[4], i1[4];
            for (int g = 0; g < NQ; g++) {
                i0[g] = _mm512_set1_epi32(qc[g * nb + b]);
                i1[g] = two ? _mm512_set1_epi32(qc[g * nb + b + 1]) : i0[g];
            }
            for (int i = 0; i < 8; i++)
                for (int g = 0; g < NQ; g++)
                    hy512_dpbusd_bcast4(&i0[g], t[i], qa + (long)g * D + 32 * b + 4 * i);
            if (two)
                for (int i = 8; i < 16; i++)
                    for (int g = 0; g < NQ; g++)
                        hy512_dpbusd_bcast4(&i1[g], t[i], qa + (long)g * D + 32 * b + 4 * i);
            for (int g = 0; g < NQ; g++) {
                acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0[g]), _mm512_mul_ps(f0, _mm512_set1_ps(qd[g * nb + b])), acc[g]);
                if (two)
                    acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1[g]), _mm512_mul_ps(f1, _mm512_set1_ps(qd[g * nb + b + 1])), acc[g]);
            }
        }
        for (int g = 0; g < NQ; g++) _mm512_mask_storeu_ps(s + g * ldp + jc, live, acc[g]);
    }
}
#endif

/* The probabilities times the V rows' block factors: pf[(g*nb + b)*ldp + j] = p[g*ldp + j] *
 * fv[j0 + j, b] for the V head at `head` (kv_q8.h), sixteen rows at a time (step 3 over q8_0
 * rows then widens only the 8-bit values) */
HY512_AI void hy512_pf_q8(const int NQ, const float *p, int ldp, const void *head, int j0, int bs,
                          int c, int D, float *pf) {
    const int nb = D / 32;
    for (int jc = 0; jc < c; jc += 16) {
        const __mmask16 live = hy512_first(c - jc < 16 ? c - jc : 16);
        for (int b = 0; b < nb; b++) {
            const __m512 f = hy512_q8_factors(head, bs, b, j0 + jc, live);
            for (int g = 0; g < NQ; g++)
                _mm512_mask_storeu_ps(pf + (long)(g * nb + b) * ldp + jc, live,
                                      _mm512_mul_ps(_mm512_maskz_loadu_ps(live, p + g * ldp + jc), f));
        }
    }
}

/* [sum(a), sum(b), sum(c), sum(d)] with one fixed reduction order for every lane */
HY512_AI __m128 hy512_hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    return hy_hsum4x256(a8, b8, c8, d8);
}

/* Step 1 over float32 or float16 rows: s[g*ldp + j] = q_g . row_j for g < NQ, j < c. */
HY512_AI void hy512_scores(const int NQ, const int kv, const float *q, const void *k, int c,
                           int D, float *s, int ldp) {
    const __m512 z = _mm512_setzero_ps();
    const long row = hy512_row_bytes(kv, D); /* bytes per K row */
    int j = 0;
    for (; j + 2 <= c; j += 2) {
        __m512 a0[4] = {z, z, z, z}, a1[4] = {z, z, z, z};
        /* software prefetch of this pass's K rows, a fixed distance on (attention_avx2.h; the
         * value passes do the same for their V rows) */
        HY_ATTN_PREFETCH((const char *)k + (long)j * row, 2 * row);
        for (int d = 0; d < D; d += 16) {
            const __m512 x0 = hy512_ld(k, j, d, D, kv);
            const __m512 x1 = hy512_ld(k, j + 1, d, D, kv);
            for (int g = 0; g < NQ; g++) {
                const __m512 qv = _mm512_loadu_ps(q + g * D + d);
                a0[g] = _mm512_fmadd_ps(qv, x0, a0[g]);
                a1[g] = _mm512_fmadd_ps(qv, x1, a1[g]);
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

/* *a += x * (*w in every lane), the weight broadcast by the FMA's memory operand: a separate
 * broadcast into a register would take a vector pipe slot of its own */
HY512_AI void hy512_fma_bcast(__m512 *a, __m512 x, const float *w) {
    __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(*a) : "v"(x), "m"(*w));
}

/* Step 3 over W vectors (16*W dimensions starting at d) for NQ queries, accumulators in registers.
 * q8_0 rows: W even, weights pf (hy512_pf_q8) in place of p. */
HY512_AI void hy512_values(const int NQ, const int W, const int kv, float *acc, const float *alpha,
                           const float *p, int ldp, const void *v, int c, int D, int d) {
    __m512 a[4][4];
    for (int g = 0; g < NQ; g++) {
        const __m512 al = _mm512_set1_ps(alpha[g]);
        for (int t = 0; t < W; t++) a[g][t] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + d + 16 * t), al);
    }
    const long row = hy512_row_bytes(kv, D), at = d * (kv == HY512_Q8 ? 1 : kv ? 2 : 4);
    for (int j = 0; j < c; j++) {
        HY_ATTN_PREFETCH((const char *)v + j * row + at, W * 16 * (kv == HY512_Q8 ? 1 : kv ? 2 : 4));
        if (kv == HY512_Q8) {  /* whole blocks: the 8-bit values against p times the factor */
            const int nb = D / 32;
            for (int t = 0; t < W; t += 2) {
                const int b = (d + 16 * t) >> 5;
                const int8_t *x8 = (const int8_t *)v + j * row + d + 16 * t;
                const __m512 x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x8)));
                const __m512 x1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x8 + 16))));
                for (int g = 0; g < NQ; g++) {
                    const float *w = p + (long)(g * nb + b) * ldp + j;
                    hy512_fma_bcast(&a[g][t], x0, w);
                    hy512_fma_bcast(&a[g][t + 1], x1, w);
                }
            }
        } else {
            __m512 pg[4];
            for (int g = 0; g < NQ; g++) pg[g] = _mm512_set1_ps(p[g * ldp + j]);
            for (int t = 0; t < W; t++) {
                const __m512 x = hy512_ld(v, j, d + 16 * t, D, kv);
                for (int g = 0; g < NQ; g++) a[g][t] = _mm512_fmadd_ps(pg[g], x, a[g][t]);
            }
        }
    }
    for (int g = 0; g < NQ; g++)
        for (int t = 0; t < W; t++) _mm512_storeu_ps(acc + g * D + d + 16 * t, a[g][t]);
}

/* One update of NQ query vectors i.. of the scratch (state m, l [NQ], acc [NQ, D]) by rows
 * j0 .. j0+c-1 of the KV head whose K and V rows start at k, v (a block of ldp rows). */
HY512_AI void hy512_update_n(const int NQ, const int kv, hy_attn_scratch *w, int i, int ldp,
                             const void *k, const void *v, int j0, int c, int D) {
    float alpha[4];
    float *m = w->m + i, *l = w->l + i, *acc = w->acc + (long)i * D, *s = w->s;
    if (kv == HY512_Q8)  /* (without VNNI the AVX2 pass, which gives the same scores) */
#ifdef HY512_VNNI
        hy512_scores_q8(NQ, w->qa + (long)i * D, w->qd + i * (D / 32), w->qc + i * (D / 32), k, j0,
                        ldp, c, D, s, ldp);
#else
        hy_qk_q8_int(NQ, w->qa + (long)i * D, w->qd + i * (D / 32), k, j0, ldp, c, D, s, ldp);
#endif
    else
        hy512_scores(NQ, kv, w->q + (long)i * D, (const char *)k + j0 * hy512_row_bytes(kv, D), c, D,
                     s, ldp);
    hy512_softmax_n(NQ, s, ldp, c, m, l, alpha);
    int d = 0;
    const char *vr = (const char *)v + j0 * hy512_row_bytes(kv, D);
    if (kv == HY512_Q8) {
        hy512_pf_q8(NQ, s, ldp, v, j0, ldp, c, D, w->pf);
        vr = (const char *)hy_q8kv_values(v, D, ldp) + (long)j0 * D;
        for (; d + 64 <= D; d += 64) hy512_values(NQ, 4, kv, acc, alpha, w->pf, ldp, vr, c, D, d);
        if (d < D) hy512_values(NQ, 2, kv, acc, alpha, w->pf, ldp, vr, c, D, d);
        return;
    }
    for (; d + 64 <= D; d += 64) hy512_values(NQ, 4, kv, acc, alpha, s, ldp, vr, c, D, d);
    for (; d < D; d += 16) hy512_values(NQ, 1, kv, acc, alpha, s, ldp, vr, c, D, d);
}

/* nq (1..4) query vectors i.. of the scratch against rows j0 .. j0+c-1 of one KV head (k, v: its
 * rows in a block of ldp); D % 16 == 0 (q8_0 rows: D % 32 == 0) */
static inline void hy512_update(int nq, int kv, hy_attn_scratch *w, int i, int ldp, const void *k,
                                const void *v, int j0, int c, int D) {
#define HY512_CASE(N)                                                                    \
    if (kv == HY512_Q8) hy512_update_n(N, HY512_Q8, w, i, ldp, k, v, j0, c, D);          \
    else if (kv) hy512_update_n(N, 1, w, i, ldp, k, v, j0, c, D);                       \
    else hy512_update_n(N, 0, w, i, ldp, k, v, j0, c, D);                               \
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
