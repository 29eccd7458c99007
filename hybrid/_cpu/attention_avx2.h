/* The AVX2 micro-kernels of paged attention (AVX2 + FMA, F16C for float16 and q8_0 rows), and the
 * software prefetch that every SIMD attention pass (attention_avx512.h too) puts on its stream.
 * attention_core.h calls them where the build has AVX2 and the head dimension allows. */
#ifndef HYBRID_ATTENTION_AVX2_H
#define HYBRID_ATTENTION_AVX2_H

#include "simd.h"
#include "kv_q8.h"

/* Where attention's software prefetch puts the lines of its stream (see HY_ATTN_PREFETCH) */
#define HY_ATTN_PF_L2 0      /* into L2, 12 KiB ahead */
#define HY_ATTN_PF_L1_NTA 1  /* into L1, non-temporal, 6 KiB ahead */
#define HY_ATTN_PF_L1 2      /* into L1 (T0), 2 KiB ahead */
#define HY_ATTN_PF_L1_L2 3   /* into L2 12 KiB ahead, and again into L1 (T0) 4 KiB ahead */
static int hy_attn_pf_ = -1;  /* (set on first use; every thread computes the same value) */
static __attribute__((noinline, cold)) int hy_attn_pf_first(void) {
    hy_attn_pf_ = hy_cpu_is_intel() ? HY_ATTN_PF_L1
                  : hy_l1d_bytes() >= 48 * 1024 ? HY_ATTN_PF_L1_NTA
                  : hy_cpu_has_avx512f() ? HY_ATTN_PF_L1_L2 : HY_ATTN_PF_L2;
    return hy_attn_pf_;
}
/* (the first call out of line, so that the passes' loops stay small around it) */
static inline __attribute__((always_inline)) int hy_attn_pf_mode(void) {
    const int m = hy_attn_pf_;
    return m >= 0 ? m : hy_attn_pf_first();
}

/* Scores and weighted value sums of up to four query vectors against `c` rows of one KV head,
 * reading the rows straight from a cache block (float32, or float16 converted in registers).
 * They need n % 8 == 0 and AVX2+FMA (+F16C for float16); hy_attn_simd_ok() says whether they apply.
 * QK scores 4 queries against one key row at a time; PV adds V rows into 4 accumulators.  Each
 * K/V row is loaded once for the whole GQA group, and rows are walked front to back: reading
 * float32 rows two side by side (or a strip of every row) defeats the hardware prefetchers at
 * long context.  Float16 rows are half the bytes and the
 * kernel is bound by the accumulator stores instead, so PV takes them two rows per pass.
 */
static inline int hy_attn_simd_ok(long n, int f16) {
#if defined(HY_AVX2)
#if !defined(HY_F16C)
    if (f16) return 0;
#endif
    return n % 8 == 0;
#else
    (void)n; (void)f16;
    return 0;
#endif
}

#ifdef HY_AVX2
#define HY_LD_F32(r, d) _mm256_loadu_ps((const float *)(r) + (d))
#define HY_RB_N(n) (n)
#ifdef HY_F16C
#define HY_LD_F16(r, d) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((r) + (d))))
#else
#define HY_LD_F16(r, d) _mm256_setzero_ps() /* never used: hy_attn_simd_ok refuses */
#endif
#define HY_FMA _mm256_fmadd_ps
/* Software prefetch for attention over the cache's blocks.  Inside a block a KV head's K rows,
 * then its V rows, then the next head's, follow one another, so a task reads one forward
 * stream.  Each pass over rows prefetches the bytes it reads itself, a fixed distance further
 * on: the scoring passes ahead of their K rows, the value passes ahead of their V rows, so every
 * line of the stream is prefetched once and the prefetches are spread evenly over the work.
 * Where the prefetched lines go depends on the core, read once at run time (hy_attn_pf_mode);
 * each choice was the fastest from memory at 16k keys on such a core (docs/performance.md):
 *   - AMD, L1D of 48 KiB or more (Zen 5-class): 6 KiB ahead into L1, non-temporal.
 *   - AMD, 32 KiB L1D with AVX-512 (Zen 4): 12 KiB ahead into L2 and again 4 KiB ahead into
 *     L1.  Into L2 alone, the q8_0 passes (more work per byte) wait on L2; into L1 alone, the
 *     float16 passes lose lines before their use.
 *   - AMD, 32 KiB L1D without AVX-512 (Zen 3): 12 KiB ahead into L2.
 *   - Intel: 2 KiB ahead into L1 (T0); non-temporal prefetches held a Xeon to about half the
 *     memory's rate. */
#define HY_ATTN_PF_L1_T0_AHEAD 2048
#define HY_ATTN_PF_L1_AHEAD 6144
#define HY_ATTN_PF_L2_AHEAD 12288
#define HY_ATTN_PF_L1_T0_FAR 4096
#define HY_ATTN_PREFETCH(p, bytes)                                                               \
    do {                                                                                         \
        const char *p_ = (const char *)(p);                                                      \
        const int pf_ = hy_attn_pf_mode();                                                       \
        if (pf_ == HY_ATTN_PF_L1_L2)                                                             \
            for (long o_ = 0; o_ < (bytes); o_ += 64) {                                          \
                _mm_prefetch(p_ + HY_ATTN_PF_L2_AHEAD + o_, _MM_HINT_T1);                        \
                _mm_prefetch(p_ + HY_ATTN_PF_L1_T0_FAR + o_, _MM_HINT_T0);                       \
            }                                                                                    \
        else if (pf_ == HY_ATTN_PF_L1)                                                           \
            for (long o_ = 0; o_ < (bytes); o_ += 64)                                            \
                _mm_prefetch(p_ + HY_ATTN_PF_L1_T0_AHEAD + o_, _MM_HINT_T0);                     \
        else if (pf_ == HY_ATTN_PF_L1_NTA)                                                       \
            for (long o_ = 0; o_ < (bytes); o_ += 64)                                            \
                _mm_prefetch(p_ + HY_ATTN_PF_L1_AHEAD + o_, _MM_HINT_NTA);                       \
        else                                                                                     \
            for (long o_ = 0; o_ < (bytes); o_ += 64)                                            \
                _mm_prefetch(p_ + HY_ATTN_PF_L2_AHEAD + o_, _MM_HINT_T1);                        \
    } while (0)

/* s[g*ldp + j] = q_g . row_j   for g < 4, j < c;  q [4, n] float32, rows [c, n] of T */
#define HY_DEFINE_QK4(NAME, T, LD, RB)                                                               \
    static inline void NAME(const float *q, const T *k, int c, long n, float *s, int ldp) {     \
        const float *q0 = q, *q1 = q + n, *q2 = q + 2 * n, *q3 = q + 3 * n;                      \
        for (int j = 0; j < c; j++) {                                                            \
            const T *k0 = k + (long)j * RB(n);                                                       \
            HY_ATTN_PREFETCH(k0, RB(n) * (long)sizeof(T));                                           \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                          \
            for (long d = 0; d < n; d += 8) {                                                    \
                __m256 x0 = LD(k0, d);                                                          \
                a0 = HY_FMA(_mm256_loadu_ps(q0 + d), x0, a0);                                    \
                a1 = HY_FMA(_mm256_loadu_ps(q1 + d), x0, a1);                                    \
                a2 = HY_FMA(_mm256_loadu_ps(q2 + d), x0, a2);                                    \
                a3 = HY_FMA(_mm256_loadu_ps(q3 + d), x0, a3);                                    \
            }                                                                                    \
            float t0[4];                                                                         \
            _mm_storeu_ps(t0, hy_hsum4x256(a0, a1, a2, a3));                                     \
            for (int g = 0; g < 4; g++) s[g * ldp + j] = t0[g];                                  \
        }                                                                                        \
    }

/* The same, two keys per pass (eight independent FMA chains): used for float16 rows. */
#define HY_DEFINE_QK4_PAIRS(NAME, T, LD, RB, SINGLE)                                                               \
    static inline void NAME(const float *q, const T *k, int c, long n, float *s, int ldp) {     \
        const float *q0 = q, *q1 = q + n, *q2 = q + 2 * n, *q3 = q + 3 * n;                      \
        int j = 0;                                                                               \
        for (; j + 2 <= c; j += 2) {                                                             \
            const T *k0 = k + (long)j * RB(n), *k1 = k0 + RB(n);                                         \
            HY_ATTN_PREFETCH(k0, 2 * RB(n) * (long)sizeof(T));                                       \
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                   \
            __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                   \
            for (long d = 0; d < n; d += 8) {                                                    \
                __m256 x0 = LD(k0, d), x1 = LD(k1, d), qv;                                     \
                qv = _mm256_loadu_ps(q0 + d); a00 = HY_FMA(qv, x0, a00); a01 = HY_FMA(qv, x1, a01); \
                qv = _mm256_loadu_ps(q1 + d); a10 = HY_FMA(qv, x0, a10); a11 = HY_FMA(qv, x1, a11); \
                qv = _mm256_loadu_ps(q2 + d); a20 = HY_FMA(qv, x0, a20); a21 = HY_FMA(qv, x1, a21); \
                qv = _mm256_loadu_ps(q3 + d); a30 = HY_FMA(qv, x0, a30); a31 = HY_FMA(qv, x1, a31); \
            }                                                                                    \
            float t0[4], t1[4];                                                                  \
            _mm_storeu_ps(t0, hy_hsum4x256(a00, a10, a20, a30));                                 \
            _mm_storeu_ps(t1, hy_hsum4x256(a01, a11, a21, a31));                                 \
            for (int g = 0; g < 4; g++) { s[g * ldp + j] = t0[g]; s[g * ldp + j + 1] = t1[g]; }  \
        }                                                                                        \
        if (j < c) SINGLE(q, k + (long)j * RB(n), c - j, n, s + j, ldp);                            \
    }

/* s[j] = q . row_j for j < c (one query, four keys per pass) */
#define HY_DEFINE_QK1(NAME, T, LD, RB)                                                               \
    static inline void NAME(const float *q, const T *k, int c, long n, float *s) {              \
        int j = 0;                                                                               \
        for (; j + 4 <= c; j += 4) {                                                             \
            const T *k0 = k + (long)j * RB(n), *k1 = k0 + RB(n), *k2 = k1 + RB(n), *k3 = k2 + RB(n);             \
            HY_ATTN_PREFETCH(k0, 4 * RB(n) * (long)sizeof(T));                                       \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                          \
            for (long d = 0; d < n; d += 8) {                                                    \
                __m256 qv = _mm256_loadu_ps(q + d);                                              \
                a0 = HY_FMA(qv, LD(k0, d), a0);                                                 \
                a1 = HY_FMA(qv, LD(k1, d), a1);                                                 \
                a2 = HY_FMA(qv, LD(k2, d), a2);                                                 \
                a3 = HY_FMA(qv, LD(k3, d), a3);                                                 \
            }                                                                                    \
            _mm_storeu_ps(s + j, hy_hsum4x256(a0, a1, a2, a3));                                  \
        }                                                                                        \
        for (; j < c; j++) {                                                                     \
            const T *k0 = k + (long)j * RB(n);                                                       \
            __m256 a0 = _mm256_setzero_ps();                                                     \
            for (long d = 0; d < n; d += 8) a0 = HY_FMA(_mm256_loadu_ps(q + d), LD(k0, d), a0); \
            s[j] = hy_hsum256(a0);                                                               \
        }                                                                                        \
    }

HY_DEFINE_QK4(hy_qk4_f32, float, HY_LD_F32, HY_RB_N)
HY_DEFINE_QK4(hy_qk4_f16_rows, uint16_t, HY_LD_F16, HY_RB_N)
HY_DEFINE_QK4_PAIRS(hy_qk4_f16, uint16_t, HY_LD_F16, HY_RB_N, hy_qk4_f16_rows)
HY_DEFINE_QK1(hy_qk1_f32, float, HY_LD_F32, HY_RB_N)
HY_DEFINE_QK1(hy_qk1_f16, uint16_t, HY_LD_F16, HY_RB_N)
/* 8 values of a q8_0 block from byte x on, widened (no factor) */
static inline __m256 hy_q8_widen8(const uint8_t *x) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)x)));
}
#ifdef HY_F16C
/* The float16 factors of block b for rows j.. of a q8_0 head (kv_q8.h), lanes past m (m <= 8)
 * read whatever follows inside the head's rows (the next factors, or the values), never used */
static inline __m256 hy_q8_factors8(const void *head, int bs, int b, int j) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hy_q8kv_factors(head) + (long)b * bs + j)));
}

/* Scores over q8_0 rows from the 8-bit queries (hy_attn_quantize_queries): s[g*ldp + j] = sum
 * over blocks b, in order, of (fk[j, b] * fq[g, b]) * (qa_g,b . k_j,b) for g < NQ (1..4) and
 * rows j0 .. j0+c-1 of the K head at `head` (kv_q8.h), the dot products exact in int32: the
 * products and order of attention_avx512.h's VNNI pass, so the AVX2 and AVX-512 builds give the
 * same scores.  Eight keys per pass: a load of the K layout holds four values of each key, and
 * maddubs takes |k| against q carrying k's sign (both at most 127 in size, so no pair of products
 * saturates 16 bits). */
static inline __attribute__((always_inline)) void hy_qk_q8_int(
        const int NQ, const int8_t *qa, const float *qd, const void *head, int j0, int bs, int c,
        long n, float *s, int ldp) {
    const int nb = (int)(n / 32);
    const int8_t *val = hy_q8kv_values(head, (int)n, bs);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int jc = 0; jc < c; jc += 8) {
        const int m = c - jc < 8 ? c - jc : 8, j = j0 + jc;
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 acc[4];
        for (int g = 0; g < NQ; g++) acc[g] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            HY_ATTN_PREFETCH(hy_q8kv_factors(head) + (long)b * bs + j, 16);
            const __m256 fk = hy_q8_factors8(head, bs, b, j);
            __m256i dot[4];
            for (int g = 0; g < NQ; g++) dot[g] = _mm256_setzero_si256();
            for (int i = 0; i < 8; i++) {  /* values 4i..4i+3 of the block */
                const int *x = (const int *)(val + ((long)(8 * b + i) * bs + j) * 4);
                HY_ATTN_PREFETCH(x, 32);
                const __m256i t = m == 8 ? _mm256_loadu_si256((const __m256i *)x) : _mm256_maskload_epi32(x, live);
                const __m256i ak = _mm256_abs_epi8(t);
                for (int g = 0; g < NQ; g++) {
                    int32_t y;
                    memcpy(&y, qa + (long)g * n + 32 * b + 4 * i, 4);
                    const __m256i qs = _mm256_sign_epi8(_mm256_set1_epi32(y), t);
                    dot[g] = hy_chain256(_mm256_add_epi32(dot[g], _mm256_madd_epi16(_mm256_maddubs_epi16(ak, qs), ones)));
                }
            }
            for (int g = 0; g < NQ; g++)
                acc[g] = HY_FMA(_mm256_cvtepi32_ps(dot[g]), _mm256_mul_ps(fk, _mm256_set1_ps(qd[g * nb + b])),
                                acc[g]);
        }
        for (int g = 0; g < NQ; g++) {
            if (m == 8) {
                _mm256_storeu_ps(s + g * ldp + jc, acc[g]);
            } else {
                float o[8];
                _mm256_storeu_ps(o, acc[g]);
                memcpy(s + g * ldp + jc, o, sizeof(float) * (size_t)m);
            }
        }
    }
}
static inline void hy_qk4_q8(const int8_t *qa, const float *qd, const void *head, int j0, int bs,
                             int c, long n, float *s, int ldp) {
    hy_qk_q8_int(4, qa, qd, head, j0, bs, c, n, s, ldp);
}
static inline void hy_qk1_q8(const int8_t *qa, const float *qd, const void *head, int j0, int bs,
                             int c, long n, float *s) {
    hy_qk_q8_int(1, qa, qd, head, j0, bs, c, n, s, 0);
}

/* pf[(g*nb + b)*ldp + j] = p[g*ldp + j] * (factor of block b of V row j0 + j), g < nq, j < c: the
 * weights the q8_0 value pass takes, so it widens only the 8-bit values */
static inline void hy_q8_weights(int nq, const float *p, int ldp, const void *head, int j0, int bs,
                                 int c, long n, float *pf) {
    const int nb = (int)(n / 32);
    for (int jc = 0; jc < c; jc += 8) {
        const int m = c - jc < 8 ? c - jc : 8;
        for (int b = 0; b < nb; b++) {
            const __m256 f = hy_q8_factors8(head, bs, b, j0 + jc);
            for (int g = 0; g < nq; g++) {
                float *dst = pf + (long)(g * nb + b) * ldp + jc;
                if (m == 8) {
                    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_loadu_ps(p + g * ldp + jc), f));
                } else {
                    float x[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
                    memcpy(x, p + g * ldp + jc, sizeof(float) * (size_t)m);
                    _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(x), f));
                    memcpy(dst, o, sizeof(float) * (size_t)m);
                }
            }
        }
    }
}
#endif /* HY_F16C */

/* The value pass over rows read in place: acc[g, :] = alpha[g] * acc[g, :] + sum_j w[g, j] *
 * row_j for g < NQ (1 or 4), rows of kind kv (HY_PV_F32, HY_PV_F16, HY_PV_Q8).  For float rows
 * w[g, j] = p[g*ldp + j]; for q8_0 rows the probabilities already times the rows' block factors
 * (hy_q8_weights: w = p[(g*nb + b)*ldp + j] for block b), and only the 8-bit values are widened.
 * Strip by strip of 8*W dimensions, the strip's NQ*W accumulators stay in registers over all c
 * rows, so nothing is stored per row.  Each element takes one FMA per row, rows in order,
 * whatever the strip's width, so NQ and the strips do not change a result's bits. */
enum { HY_PV_F32 = 0, HY_PV_F16 = 1, HY_PV_Q8 = 2 };
static inline __attribute__((always_inline)) __m256 hy_pv_ld(const int kv, const void *row, long d) {
    if (kv == HY_PV_Q8) return hy_q8_widen8((const uint8_t *)row + d);
    if (kv == HY_PV_F16) return HY_LD_F16((const uint16_t *)row, d);
    return HY_LD_F32((const float *)row, d);
}
static inline __attribute__((always_inline)) void hy_pv_strip(
        const int NQ, const int W, const int kv, float *acc, const float *alpha, const float *p,
        int ldp, const void *v, int c, long n, long d) {
    const long rb = kv == HY_PV_Q8 ? n : n * (kv == HY_PV_F16 ? 2 : 4);
    const long gs = kv == HY_PV_Q8 ? n / 32 * (long)ldp : ldp; /* from query g's weights to g+1's */
    __m256 a[4][8];
    for (int g = 0; g < NQ; g++) {
        const __m256 al = _mm256_set1_ps(alpha[g]);
        for (int t = 0; t < W; t++) a[g][t] = _mm256_mul_ps(_mm256_loadu_ps(acc + g * n + d + 8 * t), al);
    }
    for (int j = 0; j < c; j++) {
        const char *r = (const char *)v + (long)j * rb;
        if (d == 0) HY_ATTN_PREFETCH(r, rb); /* the first strip prefetches the rows */
        __m256 wg[4];
        for (int t = 0; t < W; t++) {
            /* a strip starts at a multiple of 8*W, so a q8_0 block starts at every fourth t */
            if (t == 0 || (kv == HY_PV_Q8 && t % 4 == 0)) {
                const float *w = p + (kv == HY_PV_Q8 ? ((d + 8 * t) >> 5) * (long)ldp : 0) + j;
                for (int g = 0; g < NQ; g++) wg[g] = _mm256_broadcast_ss(w + g * gs);
            }
            const __m256 x = hy_pv_ld(kv, r, d + 8 * t);
            for (int g = 0; g < NQ; g++) a[g][t] = HY_FMA(wg[g], x, a[g][t]);
        }
    }
    for (int g = 0; g < NQ; g++)
        for (int t = 0; t < W; t++) _mm256_storeu_ps(acc + g * n + d + 8 * t, a[g][t]);
}
/* hy_pv_strip over all n (n % 8 == 0): strips of 16 dimensions for four queries, 64 for one */
static inline __attribute__((always_inline)) void hy_pv_n(
        const int NQ, const int kv, float *acc, const float *alpha, const float *p, int ldp,
        const void *v, int c, long n) {
    const int W = NQ == 4 ? 2 : 8;
    long d = 0;
    for (; d + 8 * W <= n; d += 8 * W) hy_pv_strip(NQ, W, kv, acc, alpha, p, ldp, v, c, n, d);
    for (; d < n; d += 8) hy_pv_strip(NQ, 1, kv, acc, alpha, p, ldp, v, c, n, d);
}
static inline void hy_pv4_f32(float *acc, const float *alpha, const float *p, int ldp,
                              const float *v, int c, long n) { hy_pv_n(4, HY_PV_F32, acc, alpha, p, ldp, v, c, n); }
static inline void hy_pv1_f32(float *acc, float alpha, const float *p, const float *v, int c,
                              long n) { hy_pv_n(1, HY_PV_F32, acc, &alpha, p, 0, v, c, n); }
static inline void hy_pv4_f16(float *acc, const float *alpha, const float *p, int ldp,
                              const uint16_t *v, int c, long n) { hy_pv_n(4, HY_PV_F16, acc, alpha, p, ldp, v, c, n); }
static inline void hy_pv1_f16(float *acc, float alpha, const float *p, const uint16_t *v, int c,
                              long n) { hy_pv_n(1, HY_PV_F16, acc, &alpha, p, 0, v, c, n); }
static inline void hy_pv4_q8(float *acc, const float *alpha, const float *pf, int ldp,
                             const uint8_t *v, int c, long n) { hy_pv_n(4, HY_PV_Q8, acc, alpha, pf, ldp, v, c, n); }
static inline void hy_pv1_q8(float *acc, float alpha, const float *pf, int ldp, const uint8_t *v,
                             int c, long n) { hy_pv_n(1, HY_PV_Q8, acc, &alpha, pf, ldp, v, c, n); }
#endif /* HY_AVX2 */

#endif /* HYBRID_ATTENTION_AVX2_H */
