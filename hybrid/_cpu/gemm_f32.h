/* Float32 prefill GEMM: out[m, o] = x[m, :] . w[o, :] for many rows m of x (AVX-512 or AVX2).
 *
 * Weights are float32 rows [out, in] (the file's layout, not repacked).  The kernel is a dot-product
 * tile: MR rows of x against NR weight rows, MR*NR vector accumulators along the input dimension,
 * each fed by one FMA per vector of values; per vector the tile loads MR + NR vectors for MR*NR
 * FMAs (no packing pass, no transposes).  At the end each accumulator is summed across its lanes
 * in a fixed order.  AVX-512: 4 x 6 tiles of 16 lanes; AVX2: 3 x 3 tiles of 8 lanes (16
 * registers).
 *
 * Every output element is computed by exactly the same operations wherever it sits in a tile and
 * however many rows of x there are (rows and weights left over at the edges run narrower tiles of
 * the same instructions), so a row's result does not depend on the batch.
 *
 * Why: the NumPy wheels' OpenBLAS runs its Haswell (AVX2) kernel on AVX-512 machines, and this
 * GEMM is faster there (bench_layer.py and bench_generate.py measure both); on AVX2 machines its
 * threads, when NumPy loaded it before hybrid set their timeout, spin after each call and take
 * the cores from the OpenMP threads (a mixture-of-experts router between integer GEMMs).
 * Where the build has neither, hy_gemm_f32_lanes() is 0 and BLAS keeps the job.
 */
#ifndef HYBRID_GEMM_F32_H
#define HYBRID_GEMM_F32_H

#include <immintrin.h>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define HY_GEMM_F32 1
#define HY_GF_MR 4 /* rows of x per tile */
#define HY_GF_NR 6 /* weight rows per tile */
#define HY_GF_VL 16
typedef __m512 hy_gf_v;
#define HY_GF_ZERO() _mm512_setzero_ps()
#define HY_GF_LOAD(p) _mm512_loadu_ps(p)
#define HY_GF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
/* the first `left` (< 16) values at p, zeros past them */
#define HY_GF_LOAD_FIRST(p, left) _mm512_maskz_loadu_ps((__mmask16)((1u << (left)) - 1u), p)

/* the 16 lanes of v summed in a fixed order: halves, quarters, pairs */
static inline float hy_gf_sum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define HY_GEMM_F32 1
#define HY_GF_MR 3
#define HY_GF_NR 3
#define HY_GF_VL 8
typedef __m256 hy_gf_v;
#define HY_GF_ZERO() _mm256_setzero_ps()
#define HY_GF_LOAD(p) _mm256_loadu_ps(p)
#define HY_GF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define HY_GF_LOAD_FIRST(p, left) \
    _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)))

/* the 8 lanes of v summed in a fixed order: halves, pairs */
static inline float hy_gf_sum(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#endif

#ifdef HY_GEMM_F32
#ifndef HY_GF_KC
#define HY_GF_KC 768 /* input values per pass: a tile's rows of them stay in L1 */
#endif

/* the vector lanes of this build's GEMM (0: none) */
static inline int hy_gemm_f32_lanes(void) { return HY_GF_VL; }

/* MR (<= HY_GF_MR) rows of x against NR (<= HY_GF_NR) weight rows:
 * out[r*ldo + j] = x_r . w_j (+ bias[j]) */
static inline __attribute__((always_inline)) void
hy_gf_tile(const int MR, const int NR, const float *x, long ldx, const float *w, long ldw, long n,
           const float *bias, float *out, long ldo, const int add) {
    hy_gf_v acc[HY_GF_MR][HY_GF_NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = HY_GF_ZERO();
    long k = 0;
    for (; k + HY_GF_VL <= n; k += HY_GF_VL) {
        hy_gf_v xv[HY_GF_MR];
        for (int r = 0; r < MR; r++) xv[r] = HY_GF_LOAD(x + r * ldx + k);
        for (int j = 0; j < NR; j++) {
            hy_gf_v wv = HY_GF_LOAD(w + j * ldw + k);
            __asm__("" : "+x"(wv));  /* one load per weight vector, not one per FMA */
            for (int r = 0; r < MR; r++) acc[r][j] = HY_GF_FMA(xv[r], wv, acc[r][j]);
        }
    }
    if (k < n) { /* the last n % VL values: masked loads read zeros past the end */
        hy_gf_v xv[HY_GF_MR];
        for (int r = 0; r < MR; r++) xv[r] = HY_GF_LOAD_FIRST(x + r * ldx + k, n - k);
        for (int j = 0; j < NR; j++) {
            const hy_gf_v wv = HY_GF_LOAD_FIRST(w + j * ldw + k, n - k);
            for (int r = 0; r < MR; r++) acc[r][j] = HY_GF_FMA(xv[r], wv, acc[r][j]);
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
                case 6: HY_GF(MR, 6 < HY_GF_NR ? 6 : HY_GF_NR); break; \
                case 5: HY_GF(MR, 5 < HY_GF_NR ? 5 : HY_GF_NR); break; \
                case 4: HY_GF(MR, 4 < HY_GF_NR ? 4 : HY_GF_NR); break; \
                case 3: HY_GF(MR, 3); break; case 2: HY_GF(MR, 2); break; default: HY_GF(MR, 1); break; }
                for (; m + HY_GF_MR <= m1; m += HY_GF_MR) HY_GF_ROWS(HY_GF_MR)
                switch (m1 - m) {
                case 3: HY_GF_ROWS(3 < HY_GF_MR ? 3 : HY_GF_MR) break;
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
static inline int hy_gemm_f32_lanes(void) { return 0; }
static inline void hy_gemm_f32_range(const float *x, long rows, const float *w, long n, long o0,
                                     long o1, const float *bias, float *out, long ldo) {
    (void)x; (void)rows; (void)w; (void)n; (void)o0; (void)o1; (void)bias; (void)out; (void)ldo;
}
#endif

#endif
