/* Float32 prefill GEMM with AVX-512: out[m, o] = x[m, :] . w[o, :] for many rows m of x.
 *
 * Weights are float32 rows [out, in] (the file's layout, not repacked).  The kernel is a dot-product
 * tile: 4 rows of x against 6 weight rows, 24 vector accumulators of 16 lanes along the input
 * dimension, each fed by one FMA per 16 values; per 16 values the tile loads 4 + 6 vectors for 24
 * FMAs (no packing pass, no transposes).  At the end each accumulator is summed across its lanes
 * in a fixed order.
 *
 * Every output element is computed by exactly the same operations wherever it sits in a tile and
 * however many rows of x there are (rows and weights left over at the edges run narrower tiles of
 * the same instructions), so a row's result does not depend on the batch.
 *
 * Why: the NumPy wheels' OpenBLAS runs its Haswell (AVX2) kernel on AVX-512 machines, and this
 * GEMM is faster there (bench_layer.py and bench_generate.py measure both).
 * Where the build has no AVX-512, hy_gemm_f32_available() is 0 and BLAS keeps the job.
 */
#ifndef HYBRID_GEMM_F32_H
#define HYBRID_GEMM_F32_H

#include <immintrin.h>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define HY_GEMM_F32 1
#define HY_GF_MR 4 /* rows of x per tile */
#define HY_GF_NR 6 /* weight rows per tile */
#ifndef HY_GF_KC
#define HY_GF_KC 768 /* input values per pass: a tile's 10 rows of them stay in L1 */
#endif

static inline int hy_gemm_f32_available(void) { return 1; }

/* the 16 lanes of v summed in a fixed order: halves, quarters, pairs */
static inline float hy_gf_sum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* MR (<= 4) rows of x against NR (<= 6) weight rows: out[r*ldo + j] = x_r . w_j (+ bias[j]) */
static inline __attribute__((always_inline)) void
hy_gf_tile(const int MR, const int NR, const float *x, long ldx, const float *w, long ldw, long n,
           const float *bias, float *out, long ldo, const int add) {
    __m512 acc[HY_GF_MR][HY_GF_NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = _mm512_setzero_ps();
    long k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 xv[HY_GF_MR];
        for (int r = 0; r < MR; r++) xv[r] = _mm512_loadu_ps(x + r * ldx + k);
        for (int j = 0; j < NR; j++) {
            __m512 wv = _mm512_loadu_ps(w + j * ldw + k);
            __asm__("" : "+v"(wv));  /* one load per weight vector, not one per FMA */
            for (int r = 0; r < MR; r++) acc[r][j] = _mm512_fmadd_ps(xv[r], wv, acc[r][j]);
        }
    }
    if (k < n) { /* the last n % 16 values: masked loads read zeros past the end */
        const __mmask16 m = (__mmask16)((1u << (n - k)) - 1u);
        __m512 xv[HY_GF_MR];
        for (int r = 0; r < MR; r++) xv[r] = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
        for (int j = 0; j < NR; j++) {
            const __m512 wv = _mm512_maskz_loadu_ps(m, w + j * ldw + k);
            for (int r = 0; r < MR; r++) acc[r][j] = _mm512_fmadd_ps(xv[r], wv, acc[r][j]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++)
            out[r * ldo + j] = (add ? out[r * ldo + j] : 0.0f) + hy_gf_sum(acc[r][j]) + (bias ? bias[j] : 0.0f);
}

/* Weight rows [o0, o1) against all `rows` rows of x: out[m*ldo + o].  Rows of x go in chunks
 * that stay in L2 (384 KiB) while the weight rows pass by in tiles of 6 that stay in L1/L2. */
static inline void hy_gemm_f32_range(const float *x, long rows, const float *w, long n, long o0,
                                     long o1, const float *bias, float *out, long ldo) {
    long mc = (393216 / (4 * (n < HY_GF_KC ? n : HY_GF_KC))) / HY_GF_MR * HY_GF_MR;
    if (mc < HY_GF_MR) mc = HY_GF_MR;
    for (long m0 = 0; m0 < rows; m0 += mc) {
        const long m1 = m0 + mc < rows ? m0 + mc : rows;
        for (long k0 = 0; k0 < n; k0 += HY_GF_KC) {
            const long kn = n - k0 < HY_GF_KC ? n - k0 : HY_GF_KC;
            const int add = k0 > 0, last = k0 + kn == n;
            for (long o = o0; o < o1; o += HY_GF_NR) {
                const int nr = (int)(o1 - o < HY_GF_NR ? o1 - o : HY_GF_NR);
                const float *wo = w + o * n + k0, *bo = bias && last ? bias + o : NULL;
                long m = m0;
#define HY_GF(MR, NR) hy_gf_tile(MR, NR, x + m * n + k0, n, wo, n, kn, bo, out + m * ldo + o, ldo, add)
#define HY_GF_ROWS(MR) switch (nr) { \
                case 6: HY_GF(MR, 6); break; case 5: HY_GF(MR, 5); break; case 4: HY_GF(MR, 4); break; \
                case 3: HY_GF(MR, 3); break; case 2: HY_GF(MR, 2); break; default: HY_GF(MR, 1); break; }
                for (; m + HY_GF_MR <= m1; m += HY_GF_MR) HY_GF_ROWS(4)
                switch (m1 - m) {
                case 3: HY_GF_ROWS(3) break;
                case 2: HY_GF_ROWS(2) break;
                case 1: HY_GF_ROWS(1) break;
                }
#undef HY_GF_ROWS
#undef HY_GF
            }
        }
    }
}
#else
static inline int hy_gemm_f32_available(void) { return 0; }
static inline void hy_gemm_f32_range(const float *x, long rows, const float *w, long n, long o0,
                                     long o1, const float *bias, float *out, long ldo) {
    (void)x; (void)rows; (void)w; (void)n; (void)o0; (void)o1; (void)bias; (void)out; (void)ldo;
}
#endif

#endif
