/* Weight formats of GGUF files, read in place: row decoding and dot products.
 *
 * A weight matrix [out, in] is stored row by row; a row is in/block_size blocks of the format's
 * GGUF layout (ggml's block structs, little-endian, packed):
 *
 *   format  values/block  bytes  block layout                          value
 *   F16      1             2     IEEE binary16                         h
 *   BF16     1             2     upper half of a float32               b << 16
 *   Q8_0     32            34    d:f16 qs[32]:i8                       d*q
 *   Q4_0     32            18    d:f16 qs[16] (lo nibble: 0..15,       d*(n-8)
 *                                  hi nibble: 16..31)
 *   Q4_1     32            20    d:f16 m:f16 qs[16]                    d*n + m
 *   Q5_0     32            22    d:f16 qh:u32 qs[16] (bit j of qh is   d*(n-16)
 *                                  bit 4 of value j)
 *   Q5_1     32            24    d:f16 m:f16 qh:u32 qs[16]             d*n + m
 *   Q4_K     256           144   d:f16 dmin:f16 scales[12] qs[128]     (d*sc_j)*n - (dmin*m_j)
 *                                  8 sub-blocks of 32, 6-bit sc_j/m_j;
 *                                  qs[32g..]: lo nibble sub-block 2g, hi nibble 2g+1
 *   Q5_K     256           176   as Q4_K plus qh[32] before qs:        (d*sc_j)*n - (dmin*m_j)
 *                                  bit j of qh[l] is bit 4 of value l of sub-block j
 *   Q6_K     256           210   ql[128] qh[64] scales[16]:i8 d:f16    (d*sc_i)*(n-32)
 *                                  16 sub-blocks of 16
 *
 * Decoding (hy_q_decode_row) reproduces gguf.quants bit for bit: the same float32 operations in
 * the same order and no fused multiply-add (this file is compiled with -ffp-contract=off).
 *
 * Dot products (hy_q_dot) multiply a weight row by an activation row quantized once per step to
 * 8-bit blocks of 32 (hy_q_act): qa[i] = round(x[i]/da[b]), da[b] = max|x| / 127 over block b,
 * sa[b] = da[b] * sum(qa of block b).  Inside a block the products are exact integers
 * (_mm256_maddubs_epi16 + _mm256_madd_epi16 on AVX2), scaled once per block in float32.  Formats
 * with an offset (Q4_1, Q5_1, Q4_K, Q5_K: "+ m") add m * sa[b] per block; formats centred on zero
 * (Q8_0, Q4_0, Q5_0, Q6_K) multiply signed values (|w| times sign-adjusted qa).  F16 and BF16 rows
 * multiply the float32 activations directly (widen and FMA): nothing to gain from integers there.
 */
#ifndef HYBRID_QUANT_H
#define HYBRID_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

/* 8-bit dot products in one instruction (vpdpbusd) where the build targets AVX-512 VNNI (with VL)
 * or AVX-VNNI: u8 x s8 products summed in 4s into int32, exactly what maddubs + madd give for our
 * value ranges (no int16 saturation can occur), so results are identical to the AVX2 path.
 * HYBRID_NO_VNNI=1 builds without it (CI tests both). */
#if defined(HY_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define HY_VNNI 1
#define HY_DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(HY_AVX2) && defined(__AVXVNNI__)
#define HY_VNNI 1
#define HY_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#endif

/* The prefill GEMM runs panels of 32 weight rows, two 512-bit vectors of 16, where the build
 * targets AVX-512 (F, BW) with VNNI, else 8 per 256-bit vector. */
#if defined(HY_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define HY_Q512 1
#define HY_GEMM_P 32
#else
#define HY_GEMM_P 8
#endif

/* the instruction set the quantized kernels were built for (+vbmi: the streaming Q4_0/Q4_1/Q5_0/
 * Q5_1 decode kernel, hy_q45_matvec_stream) */
static inline const char *hy_q_simd(void) {
#if defined(HY_Q512) && defined(__AVX512VBMI__)
    return "avx512+vnni+vbmi";
#elif defined(HY_Q512)
    return "avx512+vnni";
#elif defined(HY_VNNI)
    return "avx2+vnni";
#elif defined(HY_AVX2)
    return "avx2";
#else
    return "portable";
#endif
}

enum {
    HY_Q_F16 = 1, HY_Q_BF16 = 2, HY_Q_Q8_0 = 3, HY_Q_Q4_0 = 4, HY_Q_Q4_1 = 5, HY_Q_Q5_0 = 6,
    HY_Q_Q5_1 = 7, HY_Q_Q4_K = 8, HY_Q_Q5_K = 9, HY_Q_Q6_K = 10,
    /* float32 rows: only for the mat-vec's own use (quant.pyx's matvec_f32), not a stored
     * format (hy_q_block_values says 0: no weight array is accepted with this code) */
    HY_Q_F32 = 11
};

static inline float hy_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef HY_F16C
    return _cvtsh_ss(h);
#else
    return hy_half_to_float(h);
#endif
}

static inline uint32_t hy_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block */
static inline void hy_k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* ================================================================== decoding (the oracle twins) */

static inline void hy_decode_q8_0(const uint8_t *b, float *y) {
    float d = hy_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d;
}

static inline void hy_decode_q4_0(const uint8_t *b, float *y) {
    float d = hy_f16(b);
    const uint8_t *q = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((q[j] & 0x0F) - 8);
        y[j + 16] = d * (float)((q[j] >> 4) - 8);
    }
}

static inline void hy_decode_q4_1(const uint8_t *b, float *y) {
    float d = hy_f16(b), m = hy_f16(b + 2);
    const uint8_t *q = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(q[j] & 0x0F) + m;
        y[j + 16] = d * (float)(q[j] >> 4) + m;
    }
}

static inline void hy_decode_q5_0(const uint8_t *b, float *y) {
    float d = hy_f16(b);
    uint32_t qh = hy_u32(b + 2);
    const uint8_t *q = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (q[j] & 0x0F) | (((qh >> j) & 1) << 4);
        int hi = (q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

static inline void hy_decode_q5_1(const uint8_t *b, float *y) {
    float d = hy_f16(b), m = hy_f16(b + 2);
    uint32_t qh = hy_u32(b + 4);
    const uint8_t *q = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (q[j] & 0x0F) | (((qh >> j) & 1) << 4);
        int hi = (q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

static inline void hy_decode_q45_k(const uint8_t *b, float *y, int five) {
    float d = hy_f16(b), dmin = hy_f16(b + 2);
    const uint8_t *scales = b + 4;
    const uint8_t *qh = b + 16;
    const uint8_t *q = five ? b + 48 : b + 16;
    for (int g = 0; g < 4; g++) {
        for (int half = 0; half < 2; half++) {
            int j = 2 * g + half;
            uint8_t sc, mn;
            hy_k4_scale_min(j, scales, &sc, &mn);
            float ds = d * (float)sc, dm = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                int n = half ? (q[32 * g + l] >> 4) : (q[32 * g + l] & 0x0F);
                if (five) n |= ((qh[l] >> j) & 1) << 4;
                y[32 * j + l] = ds * (float)n - dm;
            }
        }
    }
}

static inline void hy_decode_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = hy_f16(b + 208);
    for (int n = 0; n < 2; n++) {
        for (int l = 0; l < 32; l++) {
            int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            int is = l / 16;
            y[l] = (d * (float)sc[is + 0]) * (float)q1;
            y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
            y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
            y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Values per block and bytes per block of a format (0 for an unknown code). */
static inline int hy_q_block_values(int type) {
    switch (type) {
    case HY_Q_F16: case HY_Q_BF16: return 1;
    case HY_Q_Q8_0: case HY_Q_Q4_0: case HY_Q_Q4_1: case HY_Q_Q5_0: case HY_Q_Q5_1: return 32;
    case HY_Q_Q4_K: case HY_Q_Q5_K: case HY_Q_Q6_K: return 256;
    }
    return 0;
}

static inline int hy_q_block_bytes(int type) {
    switch (type) {
    case HY_Q_F16: case HY_Q_BF16: return 2;
    case HY_Q_Q8_0: return 34;
    case HY_Q_Q4_0: return 18;
    case HY_Q_Q4_1: return 20;
    case HY_Q_Q5_0: return 22;
    case HY_Q_Q5_1: return 24;
    case HY_Q_Q4_K: return 144;
    case HY_Q_Q5_K: return 176;
    case HY_Q_Q6_K: return 210;
    }
    return 0;
}

/* y[0..n) = the n values of a row (n a multiple of the block size) */
static inline void hy_q_decode_row(int type, const uint8_t *row, float *y, long n) {
    long nb = n / hy_q_block_values(type);
    int bb = hy_q_block_bytes(type);
    long i;
    switch (type) {
    case HY_Q_F16:
        hy_f16_to_f32((const uint16_t *)row, y, n);
        return;
    case HY_Q_BF16:
        for (i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)((const uint16_t *)row)[i] << 16;
            memcpy(y + i, &bits, 4);
        }
        return;
    }
    for (i = 0; i < nb; i++) {
        const uint8_t *b = row + i * bb;
        switch (type) {
        case HY_Q_Q8_0: hy_decode_q8_0(b, y + 32 * i); break;
        case HY_Q_Q4_0: hy_decode_q4_0(b, y + 32 * i); break;
        case HY_Q_Q4_1: hy_decode_q4_1(b, y + 32 * i); break;
        case HY_Q_Q5_0: hy_decode_q5_0(b, y + 32 * i); break;
        case HY_Q_Q5_1: hy_decode_q5_1(b, y + 32 * i); break;
        case HY_Q_Q4_K: hy_decode_q45_k(b, y + 256 * i, 0); break;
        case HY_Q_Q5_K: hy_decode_q45_k(b, y + 256 * i, 1); break;
        case HY_Q_Q6_K: hy_decode_q6_k(b, y + 256 * i); break;
        }
    }
}

/* ================================================================== activations */

/* Quantize x[0..n) (n % 32 == 0) to 8-bit blocks: qa[n], da[n/32], sa[n/32] (see the header),
 * and, when s16 is not NULL, s16[n/16] = da * (sum of qa over each 16 values) for Q6_K. */
/* block b's scale and scaled sums (of its two halves of 16 values, and of all 32) */
static inline void hy_q_act_sums(long b, float d, int sum0, int sum1, float *da, float *sa,
                                 float *s16) {
    da[b] = d;
    sa[b] = d * (float)(sum0 + sum1);
    if (s16 != NULL) {
        s16[2 * b] = d * (float)sum0;
        s16[2 * b + 1] = d * (float)sum1;
    }
}

#ifdef HY_AVX2
static inline int hy_hsum256_epi32(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 1);
}
#endif

static inline void hy_q_act(const float *x, long n, int8_t *qa, float *da, float *sa, float *s16) {
    long b = 0;
    /* The vector paths take the same steps as the scalar loop below and give the same bytes:
     * vmaxps(|x|, m) keeps m where x is NaN, as fmaxf does; rounding to nearest even under the
     * default mode is nearbyintf; a NaN or out-of-range product converts to INT_MIN, as the
     * scalar cast does here, and is clamped alike.  (The scalar loop called libm's fmaxf for
     * every value: 2.5 ns per value, as long as some matrices' whole mat-vec.) */
#if defined(__AVX512F__) && defined(__AVX512BW__)
    for (; b < n / 32; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_abs_ps(x1), _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps())));
        const float d = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(d > 0.0f ? 127.0f / amax : 0.0f);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        const __m512i v0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvttps_epi32(
            _mm512_roundscale_ps(_mm512_mul_ps(x0, id), rnd))));
        const __m512i v1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvttps_epi32(
            _mm512_roundscale_ps(_mm512_mul_ps(x1, id), rnd))));
        _mm_storeu_si128((__m128i *)(qa + 32 * b), _mm512_cvtepi32_epi8(v0));
        _mm_storeu_si128((__m128i *)(qa + 32 * b + 16), _mm512_cvtepi32_epi8(v1));
        hy_q_act_sums(b, d, _mm512_reduce_add_epi32(v0), _mm512_reduce_add_epi32(v1), da, sa, s16);
    }
#elif defined(HY_AVX2)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; b < n / 32; b++) {
        __m256 xv[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            xv[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
            m = _mm256_max_ps(_mm256_and_ps(xv[k], absmask), m);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(d > 0.0f ? 127.0f / amax : 0.0f);
        __m256i v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_min_epi32(_mm256_set1_epi32(127), _mm256_max_epi32(_mm256_set1_epi32(-127),
                _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(xv[k], id),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))));
        /* packs interleave the 128-bit lanes: dwords 0,4,1,5,... put the 32 bytes in order */
        const __m256i bytes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qa + 32 * b), bytes);
        hy_q_act_sums(b, d, hy_hsum256_epi32(_mm256_add_epi32(v[0], v[1])),
                      hy_hsum256_epi32(_mm256_add_epi32(v[2], v[3])), da, sa, s16);
    }
#endif
    for (; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d > 0.0f ? 127.0f / amax : 0.0f;
        int sum0 = 0, sum1 = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * id);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            qa[32 * b + j] = (int8_t)v;
            if (j < 16) sum0 += v; else sum1 += v;
        }
        hy_q_act_sums(b, d, sum0, sum1, da, sa, s16);
    }
}

/* ================================================================== dot products */

#ifdef HY_AVX2
/* 8 int32 partial sums of w[i]*a[i] for 32 unsigned w (0..63) and signed a */
static inline __m256i hy_dot_u8s8(__m256i w, __m256i a) {
#ifdef HY_VNNI
    return HY_DPBUSD(_mm256_setzero_si256(), w, a);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
#endif
}

/* the same for signed w (-128..127): |w| times a with w's sign */
static inline __m256i hy_dot_s8s8(__m256i w, __m256i a) {
    return hy_dot_u8s8(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}

/* 32 nibbles of a 16-byte array: low nibbles in bytes 0..15, high nibbles in bytes 16..31 */
static inline __m256i hy_nibbles16(const uint8_t *q) {
    __m128i raw = _mm_loadu_si128((const __m128i *)q);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* byte j = 0x10 where bit j of the 32-bit word is set, else 0 */
static inline __m256i hy_bit4_from_bits(uint32_t bits) {
    const __m256i pick = _mm256_set_epi8(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                         1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* software prefetch this far ahead of a weight stream: bandwidth x latency of one core's share
 * (one Q8_0 stream from memory, single core: 32 GB/s at 768 bytes ahead, 47 at 6 KiB, 55 at
 * 12 KiB; prefetches past a matrix's end are harmless) */
#define HY_PREFETCH_AHEAD 12288
#define HY_PREFETCH(p) _mm_prefetch((const char *)(p) + HY_PREFETCH_AHEAD, _MM_HINT_T0)
/* the same into L2 only: the 512-bit Q6_K kernel reads memory faster so (Zen 4, 2 threads, from
 * memory, three alternating runs: 2048x2048 22-27 -> 27-28 GB/s, 2048x8192 25-28 -> 31, 49152x2048
 * 28 -> 29-29.5); Q8_0 read 20-40% slower so, the other formats the same */
#define HY_PREFETCH_L2(p) _mm_prefetch((const char *)(p) + HY_PREFETCH_AHEAD, _MM_HINT_T1)
#define HY_LOADA(i) _mm256_loadu_si256((const __m256i *)(qa + 32 * (i)))
#endif

/* Activation rows one weight row serves per pass in the multi-row dot products: the weights of a
 * block are loaded (and unpacked) once for all of them. */
#if defined(HY_AVX2) && defined(__AVX512VL__)  /* 32 vector registers hold 8 rows' sums */
#define HY_MR 8
#define HY_R_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)
#else
#define HY_MR 4
#define HY_R_CASES(X) X(1) X(2) X(3) X(4)
#endif
/* (HY_R_CASES(X): X(R) for every R <= HY_MR, the cases of a switch that makes the number of
 * activation rows a compile-time constant in each) */

/* Q8_0 for R (<= HY_MR) activation rows: out[r] = w . activation row r (qa + r*n, da + r*nb).
 * Every row goes through exactly the operations of a single row (R = 1), so a row's result does
 * not depend on how many rows share the pass. */
static inline __attribute__((always_inline)) void
hy_dot_q8_0_rows(const uint8_t *w, long nb, const int R, const int8_t *qa, const float *da,
                 float *out) {
    const long n = 32 * nb;
    long b = 0;
    float sum[HY_MR];
    for (int r = 0; r < HY_MR; r++) sum[r] = 0.0f;
#if defined(HY_Q512)
    /* two blocks per 512-bit vector (an odd last block leaves the upper half zero); |w| times
     * a with w's sign */
    __m512 acc[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (; b < nb; b += 2) {
        const int two = b + 1 < nb;
        const uint8_t *b0 = w + 34 * b, *b1 = b0 + 34;
        HY_PREFETCH(b0);
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(b1 + 2)) : _mm256_setzero_si256();
        const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
        const __m512i wa = _mm512_abs_epi8(wv);
        const __mmask64 neg = _mm512_movepi8_mask(wv);
        const __mmask64 am = two ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
        const float d0 = hy_f16(b0), d1 = two ? hy_f16(b1) : 0.0f;
        for (int r = 0; r < R; r++) {
            __m512i a = _mm512_maskz_loadu_epi8(am, qa + r * n + 32 * b);
            a = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, a);
            const float *dr = da + r * nb;
            const __m512 sc = _mm512_mask_blend_ps((__mmask16)0xFF00, _mm512_set1_ps(d0 * dr[b]),
                                                   _mm512_set1_ps(two ? d1 * dr[b + 1] : 0.0f));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) sum[r] = _mm512_reduce_add_ps(acc[r]);
#elif defined(HY_AVX2)
#define HY_QA(r, i) _mm256_loadu_si256((const __m256i *)(qa + (r) * n + 32 * (i)))
    __m256 acc0[HY_MR], acc1[HY_MR];
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *b0 = w + 34 * b, *b1 = b0 + 34;
        HY_PREFETCH(b0);
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(b1 + 2));
        const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
        const float d0 = hy_f16(b0), d1 = hy_f16(b1);
        for (int r = 0; r < R; r++) {
            __m256i p0 = hy_dot_u8s8(a0, _mm256_sign_epi8(HY_QA(r, b), w0));
            __m256i p1 = hy_dot_u8s8(a1, _mm256_sign_epi8(HY_QA(r, b + 1), w1));
            acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d0 * da[r * nb + b]), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d1 * da[r * nb + b + 1]), acc1[r]);
        }
    }
    for (int r = 0; r < R; r++) sum[r] = hy_hsum256(_mm256_add_ps(acc0[r], acc1[r]));
#undef HY_QA
#endif
    for (; b < nb; b++) {
        const uint8_t *blk = w + 34 * b;
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int r = 0; r < R; r++) {
            int s = 0;
            for (int j = 0; j < 32; j++) s += q[j] * qa[r * n + 32 * b + j];
            sum[r] += (float)s * (hy_f16(blk) * da[r * nb + b]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = sum[r];
}

static float hy_dot_q8_0(const uint8_t *w, long nb, const int8_t *qa, const float *da) {
    float out;
    hy_dot_q8_0_rows(w, nb, 1, qa, da, &out);
    return out;
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 for R (<= HY_MR) activation rows: unsigned 4- or 5-bit values n in
 * the integer products; the offset of each block joins through the activation block sums:
 * + m*sa[b] (Q4_1, Q5_1) or -8*d*sa[b] / -16*d*sa[b] (Q4_0, Q5_0, whose values are n - 8 /
 * n - 16).  Each row takes exactly the operations of a single row. */
static inline __attribute__((always_inline)) void
hy_dot_q4q5_rows(const uint8_t *w, long nb, const int R, const int8_t *qa, const float *da,
                 const float *sa, int five, int with_min, float *out) {
    const long n = 32 * nb;
    const int hoff = with_min ? 4 : 2;                   /* qh (Q5) or qs (Q4) after d [, m] */
    const int qoff = hoff + (five ? 4 : 0);
    const int bb = qoff + 16;
    const float centre = five ? 16.0f : 8.0f;
    long b = 0;
    float sum[HY_MR], msum[HY_MR];
    for (int r = 0; r < HY_MR; r++) sum[r] = msum[r] = 0.0f;
#ifdef HY_AVX2  /* (a 512-bit two-block version measured 9% slower here) */
    /* two blocks per step: even blocks into acc0 and msum, odd ones into acc1 and msum1, so no
     * sum waits on the one before it (one block per step, with a branch choosing the
     * accumulator and one chain of offsets, ran 11 cycles per block on a Zen 4 core) */
    __m256 acc0[HY_MR], acc1[HY_MR];
    float msum1[HY_MR];
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm256_setzero_ps(), msum1[r] = 0.0f;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *blk0 = w + bb * b, *blk1 = blk0 + bb;
        HY_PREFETCH(blk0);  /* (2 blocks are at most 48 bytes: every line is prefetched) */
        const float d0 = hy_f16(blk0), d1 = hy_f16(blk1);
        const float mb0 = with_min ? hy_f16(blk0 + 2) : -centre * d0;
        const float mb1 = with_min ? hy_f16(blk1 + 2) : -centre * d1;
        __m256i nv0 = hy_nibbles16(blk0 + qoff), nv1 = hy_nibbles16(blk1 + qoff);
        if (five) {
            nv0 = _mm256_or_si256(nv0, hy_bit4_from_bits(hy_u32(blk0 + hoff)));
            nv1 = _mm256_or_si256(nv1, hy_bit4_from_bits(hy_u32(blk1 + hoff)));
        }
        for (int r = 0; r < R; r++) {
            const int8_t *a = qa + r * n + 32 * b;
            const __m256i p0 = hy_dot_u8s8(nv0, _mm256_loadu_si256((const __m256i *)a));
            const __m256i p1 = hy_dot_u8s8(nv1, _mm256_loadu_si256((const __m256i *)(a + 32)));
            msum[r] += mb0 * sa[r * nb + b];
            msum1[r] += mb1 * sa[r * nb + b + 1];
            acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d0 * da[r * nb + b]), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d1 * da[r * nb + b + 1]), acc1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        sum[r] = hy_hsum256(_mm256_add_ps(acc0[r], acc1[r]));
        msum[r] += msum1[r];
    }
#endif
    for (; b < nb; b++) {
        const uint8_t *blk = w + bb * b, *q = blk + qoff;
        const uint32_t qh = five ? hy_u32(blk + hoff) : 0;
        const float d = hy_f16(blk);
        for (int r = 0; r < R; r++) {
            const int8_t *a = qa + r * n + 32 * b;
            int s = 0;
            for (int j = 0; j < 16; j++) {
                int lo = (q[j] & 0x0F) | (((qh >> j) & 1) << 4);
                int hi = (q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                s += lo * a[j] + hi * a[j + 16];
            }
            sum[r] += (float)s * (d * da[r * nb + b]);
            msum[r] += (with_min ? hy_f16(blk + 2) : -centre * d) * sa[r * nb + b];
        }
    }
    for (int r = 0; r < R; r++) out[r] = sum[r] + msum[r];
}

static float hy_dot_q4q5(const uint8_t *w, long nb, const int8_t *qa, const float *da,
                         const float *sa, int five, int with_min) {
    float out;  /* (constant five / with_min in each call: no branches in the loop) */
    if (five && with_min) hy_dot_q4q5_rows(w, nb, 1, qa, da, sa, 1, 1, &out);
    else if (five) hy_dot_q4q5_rows(w, nb, 1, qa, da, sa, 1, 0, &out);
    else if (with_min) hy_dot_q4q5_rows(w, nb, 1, qa, da, sa, 0, 1, &out);
    else hy_dot_q4q5_rows(w, nb, 1, qa, da, sa, 0, 0, &out);
    return out;
}

#if defined(HY_AVX2) && !defined(HY_Q512)
/* Q4_0 / Q4_1 / Q5_0 / Q5_1 decode for 8 weight rows at once where the quantized kernels are
 * 256-bit (AVX2, what a Zen 3 runs): row i (rows w + i*row_bytes for i < W, the last row repeated
 * past W) in 32-bit lane i.  Per block the 8 rows' 16 nibble bytes are transposed (dword c of
 * every row in one register), each activation dword is broadcast and one maddubs per dword
 * serves all 8 rows; the block's float work (scale, offset) is then one vector operation for the
 * 8 rows, where one row at a time paid it per row (and a scalar conversion of d).  The 8 rows'
 * headers (d, and m for Q4_1 / Q5_1) and Q5's high-bit words come in with one gather each.
 * Lane i's sums do not depend on the other lanes, so a row gets the same bits in whichever group
 * it falls, and every row of these formats takes this kernel in such builds; each activation
 * row takes the same operations whatever R is.  Per row: acc += float(block sum) * (d * da),
 * off += (m or d) * sa, one chain each, in block order; out = off * centre + acc. */
static inline __attribute__((always_inline)) void
hy_q45_matvec8(const uint8_t *w, long row_bytes, int W, long nb, const int R, const int8_t *qa,
               const float *da, const float *sa, const int five, const int with_min, float *out,
               long ldo) {
    const int hoff = with_min ? 4 : 2;                       /* Q5's high bits after d [, m] */
    const int qoff = hoff + (five ? 4 : 0), bb = qoff + 16;  /* nibbles' offset, block bytes */
    const long n = 32 * nb;
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256i idx = _mm256_mullo_epi32(
        _mm256_min_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(W - 1)),
        _mm256_set1_epi32((int)row_bytes));
    /* low (d) or high (m) 16 bits of each dword, packed into the low 64 bits of each half */
    const __m256i pick_lo = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                             0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i pick_hi = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                             2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    /* Q5: byte k of dword c (value 4c+k, or 16+4c+k in the high nibble) tests bit 4c+k of the
     * row word's byte c/2 (2 + c/2): q5_lo/q5_hi put that byte in all four bytes of each dword,
     * q5_bit holds bit (4c+k) % 8 in byte k */
    __m256i q5_lo[4], q5_hi[4], q5_bit[4];
    for (int c = 0; c < 4; c++) {
        const char lb = (char)(c / 2);
        q5_lo[c] = _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                     0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12),
                                    _mm256_set1_epi8(lb));
        q5_hi[c] = _mm256_add_epi8(q5_lo[c], _mm256_set1_epi8(2));
        q5_bit[c] = _mm256_set1_epi32((int)(0x08040201u << (4 * (c & 1))));
    }
    const __m256i b4 = _mm256_set1_epi8(0x10);
    const uint8_t *row[8];
    for (int i = 0; i < 8; i++) row[i] = w + (i < W ? i : W - 1) * row_bytes;
    __m256 acc[HY_MR], off[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = off[r] = _mm256_setzero_ps();
    /* two groups ahead, front to back, into L2 (as hy_q45_matvec16): from memory, 2 threads,
     * the 1B-shaped Q4_0 model's weights in turn read 20-23 GB/s so, 13-18 prefetched into L1 */
    const uint8_t *pf = w + 16 * row_bytes;
    const int pf_lines = (int)((8 * row_bytes / 64 + nb - 1) / nb);
    for (long b = 0; b < nb; b++) {
        for (int l = 0; l < pf_lines; l++, pf += 64) _mm_prefetch((const char *)pf, _MM_HINT_T1);
        const long at = bb * b;
        /* [row k | row k+4] nibble bytes, then a 4x4 dword transpose in each half:
         * wc[c] lane i = dword c of row i (bytes 4c..4c+3: values 4c.. low, 16+4c.. high) */
        __m256i t[4], u[4], wc[4];
        for (int k = 0; k < 4; k++)
            t[k] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row[k] + at + qoff))),
                _mm_loadu_si128((const __m128i *)(row[k + 4] + at + qoff)), 1);
        u[0] = _mm256_unpacklo_epi32(t[0], t[1]);
        u[1] = _mm256_unpackhi_epi32(t[0], t[1]);
        u[2] = _mm256_unpacklo_epi32(t[2], t[3]);
        u[3] = _mm256_unpackhi_epi32(t[2], t[3]);
        wc[0] = _mm256_unpacklo_epi64(u[0], u[2]);
        wc[1] = _mm256_unpackhi_epi64(u[0], u[2]);
        wc[2] = _mm256_unpacklo_epi64(u[1], u[3]);
        wc[3] = _mm256_unpackhi_epi64(u[1], u[3]);
        __m256i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            lo[c] = _mm256_and_si256(wc[c], m4);
            hi[c] = _mm256_and_si256(_mm256_srli_epi16(wc[c], 4), m4);
        }
        if (five) {  /* value j takes bit j of its row's 32-bit word: 16 where it is set */
            const __m256i qh = _mm256_i32gather_epi32((const int *)(w + at + hoff), idx, 1);
            for (int c = 0; c < 4; c++) {
                const __m256i l16 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, q5_lo[c]), q5_bit[c]), q5_bit[c]);
                const __m256i h16 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, q5_hi[c]), q5_bit[c]), q5_bit[c]);
                lo[c] = _mm256_or_si256(lo[c], _mm256_and_si256(l16, b4));
                hi[c] = _mm256_or_si256(hi[c], _mm256_and_si256(h16, b4));
            }
        }
        /* the 8 rows' first dwords: d in the low 16 bits, m (Q4_1, Q5_1) in the high */
        const __m256i hdr = _mm256_i32gather_epi32((const int *)(w + at), idx, 1);
        const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(
            _mm256_permute4x64_epi64(_mm256_shuffle_epi8(hdr, pick_lo), 0x08)));
        const __m256 mn = with_min ? _mm256_cvtph_ps(_mm256_castsi256_si128(
            _mm256_permute4x64_epi64(_mm256_shuffle_epi8(hdr, pick_hi), 0x08))) : d;
        for (int r = 0; r < R; r++) {
            const uint8_t *a = (const uint8_t *)(qa + r * n + 32 * b);
            __m256i sum;
#ifdef HY_VNNI
            sum = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                sum = HY_DPBUSD(sum, lo[c], _mm256_set1_epi32((int)hy_u32(a + 4 * c)));
                sum = HY_DPBUSD(sum, hi[c], _mm256_set1_epi32((int)hy_u32(a + 16 + 4 * c)));
            }
#else
            /* int16 pair sums of at most 2 * 31 * 128, four added: no saturation */
            __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32((int)hy_u32(a + 4 * c))));
                sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32((int)hy_u32(a + 16 + 4 * c))));
            }
            sum = _mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones));
#endif
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(da[r * nb + b])), acc[r]);
            off[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(sa[r * nb + b]), off[r]);
        }
    }
    const __m256 centre = _mm256_set1_ps(with_min ? 1.0f : (five ? -16.0f : -8.0f));
    for (int r = 0; r < R; r++) {
        float v[8];
        _mm256_storeu_ps(v, _mm256_fmadd_ps(off[r], centre, acc[r]));
        for (int i = 0; i < W; i++) out[r * ldo + i] = v[i];
    }
}
#endif

/* Q4_K / Q5_K: nsb super-blocks of 256; activation block 8*s+j is sub-block j of super-block s.
 * The 6-bit scales and mins of the 8 sub-blocks are unpacked with 32-bit masks and widened to
 * 8 floats, so each sub-block's factor d*sc_j*da_j is one lane of a vector product and the mins
 * term dmin * sum_j m_j*sa_j is one FMA per super-block; two accumulators hide FMA latency. */
static inline void hy_k4_scales_u32(const uint8_t *s, uint32_t *sc_lo, uint32_t *sc_hi,
                                    uint32_t *mn_lo, uint32_t *mn_hi) {
    uint32_t a = hy_u32(s), b = hy_u32(s + 4), c = hy_u32(s + 8);
    *sc_lo = a & 0x3f3f3f3fu;
    *mn_lo = b & 0x3f3f3f3fu;
    *sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    *mn_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
}

#ifdef HY_AVX2
/* Q4_K / Q5_K super-block factors: lane j = d * scale_j * da[j] for its 8 sub-blocks (returned),
 * and the mins term dmin * sum_j min_j * sa[j] added to *accm (one FMA per super-block). */
static inline __m256 hy_k4_factors(const uint8_t *blk, const float *da, const float *sa,
                                   __m256 *accm) {
    uint32_t sc_lo, sc_hi, mn_lo, mn_hi;
    hy_k4_scales_u32(blk + 4, &sc_lo, &sc_hi, &mn_lo, &mn_hi);
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo)));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)mn_hi, (int)mn_lo)));
    *accm = _mm256_fmadd_ps(_mm256_mul_ps(mnf, _mm256_loadu_ps(sa)), _mm256_set1_ps(hy_f16(blk + 2)), *accm);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(hy_f16(blk)), scf), _mm256_loadu_ps(da));
}
#endif

#if defined(HY_Q512)
/* Whether the Q4_K / Q5_K two-row kernel prefetches into L2 rather than L1, for rows of n
 * values: where one activation row (n bytes and two floats per 32) and the 12 KiB prefetch
 * window pass 3/4 of the L1D, lines prefetched into L1 were evicted before their use.  Zen 4
 * (32 KiB L1D), 2 threads, from memory, three alternating runs: Q4_K 4096x14336 (Llama-3-8B's
 * down projection) 21-23 -> 30-33 GB/s, Q5_K 23-26 -> 29-35; 4096- and 8192-wide rows stay in
 * L1 (the same or slightly faster so). */
static inline int hy_q_kquant_pf_l2(long n) {
    return n + n / 4 + HY_PREFETCH_AHEAD > hy_l1d_bytes() * 3 / 4;
}

/* Q4_K / Q5_K with 512-bit vectors: 64 nibble bytes (sub-blocks 2g..2g+3) per load, sub-blocks
 * 2g and 2g+2 (low nibbles) or 2g+1 and 2g+3 (high) side by side; otherwise as below.  W (<= 2)
 * weight rows, row i at w + i*wstep, share a pass: the activations are loaded and arranged once
 * for all of them, and each row takes exactly the operations of a single row (the same bits). */
static inline __attribute__((always_inline)) void
hy_dot_q45_k_512_rows(const uint8_t *w, long wstep, const int W, long nsb, const int8_t *qa,
                      const float *da, const float *sa, int five, int pf_l2, float *out) {
    const int bb = five ? 176 : 144;
    __m512 acc0[2], acc1[2];
    __m256 accm[2];
    for (int i = 0; i < W; i++) acc0[i] = acc1[i] = _mm512_setzero_ps(), accm[i] = _mm256_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    /* 2 in the upper 256 bits: as 32-bit lanes (factor index) and as 16-bit lanes (bit shift) */
    const __m512i half = _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_setzero_si512(), _mm512_set1_epi32(2));
    const __m512i half16 = _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    for (long s = 0; s < nsb; s++) {
        const long a0 = 8 * s;
        __m512 coef[2];
        __m512i hb[2];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + bb * s;
            /* the W rows' bytes are one span: prefetch it front to back, W blocks per step, so
             * memory sees one forward stream (prefetching each row ahead of its own cursor read
             * 25-35% slower from memory, 2 threads) */
            const uint8_t *pf = w + bb * (W * s + i);
            if (pf_l2) {  /* (see hy_q_kquant_pf_l2) */
                HY_PREFETCH_L2(pf);
                HY_PREFETCH_L2(pf + 64);
                HY_PREFETCH_L2(pf + 128);
            } else {
                HY_PREFETCH(pf);
                HY_PREFETCH(pf + 64);
                HY_PREFETCH(pf + 128);
            }
            coef[i] = _mm512_castps256_ps512(hy_k4_factors(blk, da + a0, sa + a0, &accm[i]));
            hb[i] = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                         : _mm512_setzero_si512();
        }
        for (int g = 0; g < 4; g += 2) {
            const __m512i alo = _mm512_inserti64x4(_mm512_castsi256_si512(HY_LOADA(a0 + 2 * g)),
                                                   HY_LOADA(a0 + 2 * g + 2), 1);
            const __m512i ahi = _mm512_inserti64x4(_mm512_castsi256_si512(HY_LOADA(a0 + 2 * g + 1)),
                                                   HY_LOADA(a0 + 2 * g + 3), 1);
            const __m512i l0 = _mm512_add_epi32(_mm512_set1_epi32(2 * g), half);
            const __m512i l1 = _mm512_add_epi32(l0, _mm512_set1_epi32(1));
            for (int i = 0; i < W; i++) {
                const uint8_t *q = w + i * wstep + bb * s + (five ? 48 : 16);
                const __m512i raw = _mm512_loadu_si512((const void *)(q + 32 * g));
                __m512i lo = _mm512_and_si512(raw, low4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
                if (five) {  /* bits 2g / 2g+1 (low half), 2g+2 / 2g+3 (high half) */
                    const __m512i cnt = _mm512_add_epi16(_mm512_set1_epi16((short)(2 * g)), half16);
                    const __m512i hs = _mm512_srlv_epi16(hb[i], cnt);
                    lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(hs, one), 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hs, 1), one), 4));
                }
                const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo);
                const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, ahi);
                acc0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(l0, coef[i]), acc0[i]);
                acc1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(l1, coef[i]), acc1[i]);
            }
        }
    }
    for (int i = 0; i < W; i++)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i])) - hy_hsum256(accm[i]);
}

static float hy_dot_q45_k_512(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                              const float *sa, int five) {
    float out;
    hy_dot_q45_k_512_rows(w, 0, 1, nsb, qa, da, sa, five, 0, &out);
    return out;
}
#endif

static float hy_dot_q45_k(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                          const float *sa, int five) {
#if defined(HY_Q512)
    return hy_dot_q45_k_512(w, nsb, qa, da, sa, five);
#endif
    const int bb = five ? 176 : 144;
#ifdef HY_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + bb * s;
        const uint8_t *qh = blk + 16, *q = five ? blk + 48 : blk + 16;
        const long a0 = 8 * s;
        HY_PREFETCH(blk);
        HY_PREFETCH(blk + 64);
        HY_PREFETCH(blk + 128);
        const __m256 coef = hy_k4_factors(blk, da + a0, sa + a0, &accm);
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * g));
            __m256i lo = _mm256_and_si256(raw, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * g), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * g + 1), one), 4));
            }
            __m256i p0 = hy_dot_u8s8(lo, HY_LOADA(a0 + 2 * g));
            __m256i p1 = hy_dot_u8s8(hi, HY_LOADA(a0 + 2 * g + 1));
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),
                                   _mm256_permutevar8x32_ps(coef, _mm256_set1_epi32(2 * g)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
                                   _mm256_permutevar8x32_ps(coef, _mm256_set1_epi32(2 * g + 1)), acc1);
        }
    }
    return hy_hsum256(_mm256_add_ps(acc0, acc1)) - hy_hsum256(accm);
#else
    float sum = 0.0f, msum = 0.0f;
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + bb * s;
        const uint8_t *qh = blk + 16, *q = five ? blk + 48 : blk + 16;
        const float d = hy_f16(blk), dmin = hy_f16(blk + 2);
        const long a0 = 8 * s;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            hy_k4_scale_min(j, blk + 4, &sc, &mn);
            const int8_t *a = qa + 32 * (a0 + j);
            const uint8_t *qq = q + 32 * (j / 2);
            int isum = 0;
            for (int l = 0; l < 32; l++) {
                int n = (j & 1) ? (qq[l] >> 4) : (qq[l] & 0x0F);
                if (five) n |= ((qh[l] >> j) & 1) << 4;
                isum += n * a[l];
            }
            sum += (float)isum * (d * (float)sc * da[a0 + j]);
            msum += dmin * (float)mn * sa[a0 + j];
        }
    }
    return sum - msum;
#endif
}

/* Q6_K: values n (0..63) with a signed 8-bit scale per 16 and one float16 d per 256:
 * sum = d * sum_g sc_g * (da_b * sum n*qa  -  32 * s16_g), where s16_g = da_b * (sum of qa over
 * the 16 values of g).  The integer products use unsigned n (no sign trick) and the scales enter
 * through _mm256_madd_epi16; the -32 offsets are one vector FMA per 8 groups. */
#if defined(HY_Q512)
/* Q6_K with 512-bit vectors: the two 128-value halves of a super-block side by side (half n in
 * 256-bit lane n), so each step serves 64 values.  Unlike the AVX2 scheme below, the integer
 * sums (vpdpbusd, 4 values per lane) carry no scale: each lane's factor d * scale * da is one
 * float product (d * scale exact), which took one core in cache from 22.5 to 25.4 GB/s (Zen 4,
 * 1024x4096, alternating builds; 2 threads 43 -> 45-47) against maddubs + scale shuffle + madd.
 * W (<= 2) weight rows share a pass as in hy_dot_q45_k_512_rows. */
static inline __attribute__((always_inline)) void
hy_dot_q6_k_512_rows(const uint8_t *w, long wstep, const int W, long nsb, const int8_t *qa,
                     const float *da, const float *s16, float *out) {
    __m512 acc[2][4], acco[2];
    for (int i = 0; i < W; i++) {
        acco[i] = _mm512_setzero_ps();
        for (int k = 0; k < 4; k++) acc[i][k] = _mm512_setzero_ps();
    }
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    /* step k's 16 int32 sums (vpdpbusd: 4 values each): lanes 0-3 / 4-7 are half 0's 16-value
     * groups 2k / 2k+1, lanes 8-11 / 12-15 half 1's (scales 8+2k / 9+2k); lanes 0-7 take
     * activation block 4*0+k, lanes 8-15 block 4+k */
    __m512i grp[4], blk8[4];
    for (int k = 0; k < 4; k++) {
        grp[k] = _mm512_set_epi32(9 + 2 * k, 9 + 2 * k, 9 + 2 * k, 9 + 2 * k, 8 + 2 * k, 8 + 2 * k,
                                  8 + 2 * k, 8 + 2 * k, 1 + 2 * k, 1 + 2 * k, 1 + 2 * k, 1 + 2 * k,
                                  2 * k, 2 * k, 2 * k, 2 * k);
        blk8[k] = _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_set1_epi32(k), _mm512_set1_epi32(4 + k));
    }
    for (long s = 0; s < nsb; s++) {
        const int8_t *a = qa + 256 * s;
        const __m512 s16v = _mm512_loadu_ps(s16 + 16 * s);
        const __m512 dav = _mm512_castps256_ps512(_mm256_loadu_ps(da + 8 * s));
        __m512 dak[4];  /* step k's activation scale per lane (shared by the W rows) */
        for (int k = 0; k < 4; k++) dak[k] = _mm512_permutexvar_ps(blk8[k], dav);
        __m512 scf[2];
        __m512i v[2][4];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + 210 * s;
            const uint8_t *pf = w + 210 * (W * s + i);  /* one forward stream, as for Q4_K */
            HY_PREFETCH_L2(pf);
            HY_PREFETCH_L2(pf + 64);
            HY_PREFETCH_L2(pf + 128);
            HY_PREFETCH_L2(pf + 192);
            /* d * scale of the 16 groups (exact: an 8-bit integer times a float16) */
            scf[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)))),
                                   _mm512_set1_ps(hy_f16(blk + 208)));
            acco[i] = _mm512_fmadd_ps(scf[i], s16v, acco[i]);
            /* half n: ql at 64n, qh at 128 + 32n */
            const __m512i l0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)blk)),
                                                  _mm256_loadu_si256((const __m256i *)(blk + 64)), 1);
            const __m512i l1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 32))),
                                                  _mm256_loadu_si256((const __m256i *)(blk + 96)), 1);
            const __m512i h = _mm512_loadu_si512((const void *)(blk + 128));
            v[i][0] = _mm512_or_si512(_mm512_and_si512(l0, low4),
                                      _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x03)), 4));
            v[i][1] = _mm512_or_si512(_mm512_and_si512(l1, low4),
                                      _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x0C)), 2));
            v[i][2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low4),
                                      _mm512_and_si512(h, _mm512_set1_epi8(0x30)));
            v[i][3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low4),
                                      _mm512_srli_epi16(_mm512_and_si512(h, _mm512_set1_epi8((char)0xC0)), 2));
        }
        for (int k = 0; k < 4; k++) {
            const __m512i av = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + 32 * k))),
                _mm256_loadu_si256((const __m256i *)(a + 128 + 32 * k)), 1);
            for (int i = 0; i < W; i++) {
                const __m512i p32 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[i][k], av);
                const __m512 f = _mm512_mul_ps(_mm512_permutexvar_ps(grp[k], scf[i]), dak[k]);
                acc[i][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p32), f, acc[i][k]);
            }
        }
    }
    for (int i = 0; i < W; i++)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3])))
                 - 32.0f * _mm512_reduce_add_ps(acco[i]);
}

static float hy_dot_q6_k_512(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                             const float *s16) {
    float out;
    hy_dot_q6_k_512_rows(w, 0, 1, nsb, qa, da, s16, &out);
    return out;
}
#endif

static float hy_dot_q6_k(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                         const float *s16) {
#if defined(HY_Q512)
    return hy_dot_q6_k_512(w, nsb, qa, da, s16);
#endif
    float sum = 0.0f;
#ifdef HY_AVX2
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 acco = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    /* int16 scale 2k of 8 in the low lane, 2k+1 in the high lane */
    const __m256i pick[4] = {
        _mm256_set_epi8(3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0),
        _mm256_set_epi8(7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4),
        _mm256_set_epi8(11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8),
        _mm256_set_epi8(15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12)};
#endif
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 210 * s;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const float d = hy_f16(blk + 208);
#ifdef HY_AVX2
        HY_PREFETCH(blk);
        HY_PREFETCH(blk + 64);
        HY_PREFETCH(blk + 128);
        HY_PREFETCH(blk + 192);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        __m256 dv = _mm256_set1_ps(d);
        acco = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), dv),
                               _mm256_loadu_ps(s16 + 16 * s), acco);
        acco = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))), dv),
                               _mm256_loadu_ps(s16 + 16 * s + 8), acco);
        __m256 cf = _mm256_mul_ps(dv, _mm256_loadu_ps(da + 8 * s)); /* d * da of the 8 blocks */
#endif
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
            const int8_t *scn = sc + 8 * n;
            const long a0 = 8 * s + 4 * n;
#ifdef HY_AVX2
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i s16x = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)scn)));
            __m256i v[4];
            v[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                                   _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x03)), 4));
            v[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                   _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x0C)), 2));
            v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                   _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
            v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                   _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8((char)0xC0)), 2));
            for (int k = 0; k < 4; k++) {
                __m256i p16 = _mm256_maddubs_epi16(v[k], HY_LOADA(a0 + k));
                __m256i p32 = _mm256_madd_epi16(p16, _mm256_shuffle_epi8(s16x, pick[k]));
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32),
                                         _mm256_permutevar8x32_ps(cf, _mm256_set1_epi32(4 * n + k)), acc[k]);
            }
#else
            for (int k = 0; k < 4; k++) {
                const int8_t *a = qa + 32 * (a0 + k);
                int isum = 0;
                for (int l = 0; l < 32; l++) {
                    const uint8_t *src = (k & 1) ? ql + 32 : ql;
                    int nib = (k & 2) ? (src[l] >> 4) : (src[l] & 0x0F);
                    int q6 = (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                    isum += scn[2 * k + l / 16] * q6 * a[l];
                }
                sum += (float)isum * (d * da[a0 + k]);
            }
#endif
        }
    }
#ifdef HY_AVX2
    sum = hy_hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
          - 32.0f * hy_hsum256(acco);
#else
    (void)s16;
#endif
    return sum;
}

#if defined(HY_AVX2) && defined(__AVX512F__)
#define HY_HALF512 1
/* W (1..4) F16 / BF16 weight rows (row i at w + i*row_bytes) times float32 x [n]: out[i].
 * 32 values per step in two 512-bit halves, each row with two accumulators, so W = 4 keeps
 * eight FMA chains going and loads x once for four rows; the last partial step reads masked
 * (zeros past n).  A row takes exactly the same operations whatever W is (the same bits).
 * Each row prefetches, into L2, the line at the same place in the row four rows on (the next
 * pass's).  Zen 4, 2 threads, from memory, 4096-wide rows, alternating runs: the 256-bit
 * one-row loop before (two FMA chains, a prefetch 12 KiB ahead into L1 per 32 bytes) 15-25
 * GB/s; this kernel with that prefetch 20-28, with this one 28-31. */
static inline __attribute__((always_inline)) __m512 hy_half16(const uint16_t *h, __mmask16 m,
                                                               const int bf16) {
    const __m256i u = _mm256_maskz_loadu_epi16(m, h);
    if (bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(u), 16));
    return _mm512_cvtph_ps(u);
}

static inline __attribute__((always_inline)) void
hy_half_rows(const uint8_t *w, long row_bytes, const int W, long n, const float *x, const int bf16,
             float *out) {
    __m512 a0[4], a1[4];
    for (int r = 0; r < W; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 32) {
        const long left = n - i;
        const __mmask16 m0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        const __mmask16 m1 = left >= 32 ? (__mmask16)0xFFFF
                                        : (left <= 16 ? (__mmask16)0 : (__mmask16)((1u << (left - 16)) - 1u));
        const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + i), x1 = _mm512_maskz_loadu_ps(m1, x + i + 16);
        for (int r = 0; r < W; r++) {
            const uint16_t *h = (const uint16_t *)(w + r * row_bytes) + i;
            _mm_prefetch((const char *)h + 4 * row_bytes, _MM_HINT_T1);  /* the next pass's line */
            a0[r] = _mm512_fmadd_ps(hy_half16(h, m0, bf16), x0, a0[r]);
            a1[r] = _mm512_fmadd_ps(hy_half16(h + 16, m1, bf16), x1, a1[r]);
        }
    }
    for (int r = 0; r < W; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
}
#endif

/* F16 / BF16 rows times float32 x */
static float hy_dot_half(const uint8_t *w, long n, const float *x, int bf16) {
#if defined(HY_HALF512)
    float out;  /* (bf16 a constant in each call) */
    if (bf16) hy_half_rows(w, 0, 1, n, x, 1, &out);
    else hy_half_rows(w, 0, 1, n, x, 0, &out);
    return out;
#else
    const uint16_t *h = (const uint16_t *)w;
    long i = 0;
    float sum = 0.0f;
#if defined(HY_AVX2)
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    if (bf16) {
        for (; i + 16 <= n; i += 16) {
            HY_PREFETCH(h + i);
            __m256i u0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
            __m256i u1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i + 8)));
            a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(u0, 16)), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(u1, 16)), _mm256_loadu_ps(x + i + 8), a1);
        }
    }
#if defined(HY_F16C)
    else {
        for (; i + 16 <= n; i += 16) {
            HY_PREFETCH(h + i);
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + 8))), _mm256_loadu_ps(x + i + 8), a1);
        }
    }
#endif
    sum = hy_hsum256(_mm256_add_ps(a0, a1));
#endif
    for (; i < n; i++) {
        float v;
        if (bf16) {
            uint32_t bits = (uint32_t)h[i] << 16;
            memcpy(&v, &bits, 4);
        } else {
            v = hy_half_to_float(h[i]);
        }
        sum += v * x[i];
    }
    return sum;
#endif
}

#if defined(HY_Q512)
/* The 16-row mat-vecs prefetch the group after the next into L2, not L1: that group, the next
 * and the one being read are three times 16 rows (30 KB at 576 values per Q8_0 row), more than
 * fits beside everything else in a 32 KB L1 (Zen 4; the Zen 5-class core's is 48 KB), so
 * prefetched lines were evicted before they were read.  Zen 4, 2 threads, from memory, one
 * activation row, Q8_0: 49152x576 (SmolLM2's LM head) 18 -> 38-40 GB/s, 1536x576 15 -> 22;
 * the same bits. */
#define HY_ROWS16_PF_HINT _MM_HINT_T1

/* Shared by the 16-row mat-vecs: the first 16 bytes of the 16 rows' blocks (row i at
 * blk + i*row_bytes), four rows per register, then dwords 0 and 1 of every row as lanes:
 * dw0 lane i = dword 0 of row i, dw1 the same for dword 1 (NULL: not wanted).  128-bit loads and
 * permutes measured faster than gathers. */
static inline __attribute__((always_inline)) __m512i hy16_header(const uint8_t *blk, long row_bytes,
                                                                 __m512i *dw1) {
    const __m512i pick01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i lo8 = _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i hi8 = _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8);
    __m512i hz[4];
    for (int j = 0; j < 4; j++) {
        const uint8_t *p = blk + 4 * j * row_bytes;
        __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + row_bytes)), 1);
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + 2 * row_bytes)), 2);
        hz[j] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + 3 * row_bytes)), 3);
    }
    const __m512i h01 = _mm512_permutex2var_epi32(hz[0], pick01, hz[1]);
    const __m512i g01 = _mm512_permutex2var_epi32(hz[2], pick01, hz[3]);
    if (dw1) *dw1 = _mm512_permutex2var_epi32(h01, hi8, g01);
    return _mm512_permutex2var_epi32(h01, lo8, g01);
}

/* Shared by the 16-row mat-vecs: one 32-value block of the 16 rows (v[c] lane i: unsigned values
 * 4c..4c+3 of row i, c < 8) against R activation rows: acc[r] += (sum v*a) * d * da,
 * off[r] += mn * sa. */
static inline __attribute__((always_inline)) void
hy16_block(const int R, const __m512i v[8], __m512 d, __m512 mn, const int8_t *qa, long n, long b,
           long nb, const float *da, const float *sa, __m512 *acc, __m512 *off) {
    for (int r = 0; r < R; r++) {
        const int32_t *a = (const int32_t *)(qa + r * n + 32 * b);
        /* four independent chains (integer sums: exact in any order) */
        __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], _mm512_set1_epi32(a[0]));
        __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[1], _mm512_set1_epi32(a[1]));
        __m512i p2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[2], _mm512_set1_epi32(a[2]));
        __m512i p3 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[3], _mm512_set1_epi32(a[3]));
        p0 = _mm512_dpbusd_epi32(p0, v[4], _mm512_set1_epi32(a[4]));
        p1 = _mm512_dpbusd_epi32(p1, v[5], _mm512_set1_epi32(a[5]));
        p2 = _mm512_dpbusd_epi32(p2, v[6], _mm512_set1_epi32(a[6]));
        p3 = _mm512_dpbusd_epi32(p3, v[7], _mm512_set1_epi32(a[7]));
        const __m512i p = _mm512_add_epi32(_mm512_add_epi32(p0, p1), _mm512_add_epi32(p2, p3));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d, _mm512_set1_ps(da[r * nb + b])),
                                 acc[r]);
        off[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(sa[r * nb + b]), off[r]);
    }
}

/* the formats hy_q45_matvec16 serves: Q4_0 and Q4_1, and Q5_0 and Q5_1 where the build has
 * AVX512_BITALG (the streaming kernel below serves the same ones) */
static inline int hy_q45_rows16(int type) {
#if defined(__AVX512BITALG__)
    return type == HY_Q_Q4_0 || type == HY_Q_Q4_1 || type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
#else
    return type == HY_Q_Q4_0 || type == HY_Q_Q4_1;
#endif
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 for 16 weight rows at once (rows o..o+15, row_bytes apart) against
 * R (<= HY_MR) activation rows: out[r*ldo + o + i] = row o+i . activation row r.
 * The 16 rows' nibbles of a block are transposed in registers so that 32-bit lane i holds
 * row i: one vpdpbusd per 4 values then serves all 16 rows with the activations broadcast, and
 * the block's float work (scale, offset) is one vector operation for the 16 rows instead of
 * scalar work per row.  Q5's fifth bits come from the 16 rows' 32-bit high-bit words: one
 * vpshufbitqmb (AVX512_BITALG) per register picks each byte's bit, and a masked add puts 16 in.
 * The block headers come in with 128-bit loads and the same permutes (gathers measured slower:
 * 0.56 -> 0.50 ns per block and row for Q4_0, single core, in cache).  Per activation row the
 * operations do not depend on R. */
static inline __attribute__((always_inline)) void
hy_q45_matvec16(const uint8_t *w, long row_bytes, long nb, const int R, const int8_t *qa,
                const float *da, const float *sa, const int five, const int with_min, float *out,
                long ldo) {
    const int hoff = with_min ? 4 : 2;                     /* Q5's high bits after d [, m] */
    const int qoff = hoff + (five ? 4 : 0), bb = qoff + 16;  /* nibbles' offset, block bytes */
    const long n = 32 * nb;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* lanes of the 2-source permutes: dwords c of rows 0..3 (z0) and 4..7 (z1) */
    const __m512i pick01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i pick23 = _mm512_set_epi32(31, 27, 23, 19, 15, 11, 7, 3, 30, 26, 22, 18, 14, 10, 6, 2);
    const __m512i lo8 = _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i hi8 = _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8);
    /* Q5: value j of a block takes bit j of its row's word; the values of dword c are 4c..4c+3
     * (low nibbles) and 16+4c.. (high nibbles) */
#if defined(__AVX512BITALG__)
    __m512i bitsel[8];  /* bit indices of bytes k of dword c: 4c+k (+16 high) (+32 odd rows) */
    for (int c = 0; c < 8; c++) {
        const long long lo_w = (long long)(0x03020100 + 0x04040404 * (c & 3) + (c >= 4 ? 0x10101010 : 0));
        bitsel[c] = _mm512_set1_epi64(lo_w | ((lo_w + 0x20202020LL) << 32));
    }
#endif
    /* block b adds into sums set b % 4: the order in which hy_q45_matvec_stream's lanes add up
     * blocks (both give the same bits); the four sets are combined at the end */
    __m512 acc[4][HY_MR], off[4][HY_MR];
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < R; r++) acc[k][r] = off[k][r] = _mm512_setzero_ps();
    const uint8_t *pf = w + 32 * row_bytes;  /* two groups ahead */
    const int pf_lines = (int)((16 * row_bytes / 64 + nb - 1) / nb);
    for (long b = 0; b < nb; b++) {
        const uint8_t *blk = w + bb * b;
        /* the 16 rows after the next, front to back, spread over this group's blocks: one
         * forward stream for the prefetchers instead of 16 interleaved ones (from memory,
         * single core: 19 GB/s for per-row prefetches, 33-35 GB/s this way) */
        for (int l = 0; l < pf_lines; l++, pf += 64) _mm_prefetch((const char *)pf, HY_ROWS16_PF_HINT);
        /* 16 rows' 16 nibble bytes: four rows per 512-bit register */
        __m512i z[4];
        for (int j = 0; j < 4; j++) {
            const uint8_t *p = blk + qoff + 4 * j * row_bytes;
            __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
            t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + row_bytes)), 1);
            t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + 2 * row_bytes)), 2);
            z[j] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + 3 * row_bytes)), 3);
        }
        /* a01: [rows 0..7 dword 0 | rows 0..7 dword 1], b01 the same for rows 8..15, ... */
        const __m512i a01 = _mm512_permutex2var_epi32(z[0], pick01, z[1]);
        const __m512i a23 = _mm512_permutex2var_epi32(z[0], pick23, z[1]);
        const __m512i b01 = _mm512_permutex2var_epi32(z[2], pick01, z[3]);
        const __m512i b23 = _mm512_permutex2var_epi32(z[2], pick23, z[3]);
        __m512i wc[4];  /* wc[c] lane i: dword c of row i */
        wc[0] = _mm512_permutex2var_epi32(a01, lo8, b01);
        wc[1] = _mm512_permutex2var_epi32(a01, hi8, b01);
        wc[2] = _mm512_permutex2var_epi32(a23, lo8, b23);
        wc[3] = _mm512_permutex2var_epi32(a23, hi8, b23);
        __m512i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            lo[c] = _mm512_and_si512(wc[c], m4);
            hi[c] = _mm512_and_si512(_mm512_srli_epi16(wc[c], 4), m4);
        }
        /* the 16 rows' first 8 bytes: d [, m] [, Q5's high bits] */
        __m512i dw1;
        const __m512i dw = hy16_header(blk, row_bytes, &dw1);
#if defined(__AVX512BITALG__)  /* (Q5 takes this kernel only with BITALG) */
        if (five) {
            const __m512i b4 = _mm512_set1_epi8(0x10);
            /* the 32 high bits: bytes 4..7 (Q5_1) or 2..5 (Q5_0) */
            const __m512i qh = with_min ? dw1 : _mm512_or_si512(_mm512_srli_epi32(dw, 16),
                                                                 _mm512_slli_epi32(dw1, 16));
            /* vpshufbitqmb: byte k of dword c of a row picks bit 4c+k (low) or 16+4c+k (high) of
             * the row's word, which sits in the low or high half of the byte's 64-bit lane */
            for (int c = 0; c < 4; c++) {
                lo[c] = _mm512_mask_add_epi8(lo[c], _mm512_bitshuffle_epi64_mask(qh, bitsel[c]), lo[c], b4);
                hi[c] = _mm512_mask_add_epi8(hi[c], _mm512_bitshuffle_epi64_mask(qh, bitsel[4 + c]), hi[c], b4);
            }
        }
#endif
        /* the 16 rows' scales (and Q4_1's / Q5_1's mins, the next 16 bits) */
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
        const __m512 mn = with_min ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dw, 16)))
                                   : d;
        const __m512i v[8] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
        hy16_block(R, v, d, mn, qa, n, b, nb, da, sa, acc[b & 3], off[b & 3]);
    }
    /* Q4_0 / Q5_0 values are n - 8 / n - 16: the offset is -8 (-16) * d * (scale * sum); Q4_1's
     * and Q5_1's is + m * (scale * sum) */
    const float centre = with_min ? 1.0f : (five ? -16.0f : -8.0f);
    for (int r = 0; r < R; r++) {
        const __m512 a = _mm512_add_ps(_mm512_add_ps(acc[0][r], acc[1][r]), _mm512_add_ps(acc[2][r], acc[3][r]));
        const __m512 o = _mm512_add_ps(_mm512_add_ps(off[0][r], off[1][r]), _mm512_add_ps(off[2][r], off[3][r]));
        _mm512_storeu_ps(out + r * ldo, _mm512_fmadd_ps(o, _mm512_set1_ps(centre), a));
    }
}
#endif

#if defined(HY_Q512)
/* The 32 bytes at src + i*stride for i < 16, as dwords: wc[c] lane i = dword c of row i.
 * Two rows per register (row k low, row k+8 high), then an 8x8 dword transpose in each half. */
static inline __attribute__((always_inline)) void hy_transpose_16x8(const uint8_t *src, long stride,
                                                                    __m512i wc[8]) {
    const __m512i lo_q = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);    /* 128-bit lanes 0 of each half */
    const __m512i hi_q = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);  /* lanes 1 */
    __m512i z[8], t[8], u[8];
    for (int k = 0; k < 8; k++)
        z[k] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(src + k * stride))),
            _mm256_loadu_si256((const __m256i *)(src + (k + 8) * stride)), 1);
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int c = 0; c < 4; c++) {
        wc[c] = _mm512_permutex2var_epi64(u[c], lo_q, u[4 + c]);
        wc[4 + c] = _mm512_permutex2var_epi64(u[c], hi_q, u[4 + c]);
    }
}

/* Q8_0 for 16 weight rows at once, as hy_q45_matvec16: the 16 rows' 32 values of a block are
 * transposed (two rows per register, an 8x8 dword transpose in each half) so that lane i holds
 * row i.  vpdpbusd wants unsigned weights: w + 128 (the sign bit flipped) times a, less
 * 128 * d * (scale * sum of a), the same offset term as Q4_0's with -128 for -8.  Per activation
 * row the operations do not depend on R. */
static inline __attribute__((always_inline)) void
hy_q8_matvec16(const uint8_t *w, long row_bytes, long nb, const int R, const int8_t *qa,
               const float *da, const float *sa, float *out, long ldo) {
    const long n = 32 * nb;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[HY_MR], off[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = off[r] = _mm512_setzero_ps();
    const uint8_t *pf = w + 32 * row_bytes;  /* two groups ahead, one forward stream, into L2 */
    const int pf_lines = (int)((16 * row_bytes / 64 + nb - 1) / nb);
    for (long b = 0; b < nb; b++) {
        const uint8_t *blk = w + 34 * b;
        for (int l = 0; l < pf_lines; l++, pf += 64) _mm_prefetch((const char *)pf, HY_ROWS16_PF_HINT);
        __m512i wc[8];  /* wc[c] lane i: dword c (values 4c..4c+3) of row i, sign bit flipped */
        hy_transpose_16x8(blk + 2, row_bytes, wc);
        for (int c = 0; c < 8; c++) wc[c] = _mm512_xor_si512(wc[c], flip);
        /* the 16 rows' scales: dword 0 of each row's block */
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hy16_header(blk, row_bytes, NULL)));
        hy16_block(R, wc, d, d, qa, n, b, nb, da, sa, acc, off);
    }
    for (int r = 0; r < R; r++)
        _mm512_storeu_ps(out + r * ldo, _mm512_fmadd_ps(off[r], _mm512_set1_ps(-128.0f), acc[r]));
}
#endif

#if defined(HY_Q512) && defined(__AVX512VBMI__)
#define HY_Q45_STREAM 1
/* Q4_0 / Q4_1 / Q5_0 / Q5_1 for one activation row (decode), streaming: weight rows are read
 * front to back, four blocks (128 values) per step.  Two overlapping 64-byte loads cover a row's
 * four blocks (bytes [0, 64) and [4*bb - 64, 4*bb)); one vpermt2b (AVX512_VBMI) picks their 64
 * nibble bytes, one their scales (and mins), and for Q5 one their high-bit words.  Four weight
 * rows, one from each quarter of a thread's rows, share a pass, so each quarter is one forward
 * stream.  hy_q45_matvec16 above transposes 16 rows instead, which reads the activations once per
 * 16 rows (the better trade for several activation rows) but interleaves 16 streams: from memory,
 * 2 threads, 4096x4096 Q4_0, it streamed 41-43 GB/s where this kernel streams 50-54.  Both give
 * the same bits (see hy_q45_matvec_stream).
 * HY_Q45_PF: the software prefetch distance in bytes (1024 and 2048 measured alike, 512 slower). */
#ifndef HY_Q45_PF
#define HY_Q45_PF 2048
#endif
typedef struct {
    __m512i nib, hdr, qh;  /* vpermt2b indices: nibble bytes; [d x16 | m x16] words; qh per qword */
    __m512i sel_lo, sel_hi;  /* vpshufbitqmb selectors: bits j (values j) and 16 + j */
    int bb, five, with_min;  /* block bytes, Q5, Q4_1 / Q5_1 */
} hy_q45_plan;

/* byte j of the result: the mask's bytes get j + add, or j where bit `bit` of j is clear */
static inline __m512i hy_q45_add_if(__m512i v, __m512i j, int bit, int add) {
    return _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(j, _mm512_set1_epi8((char)bit)), v,
                                _mm512_set1_epi8((char)add));
}

/* the step's byte p as an index into the two loads: bytes [0, 64) of the first, then the second's */
static inline __m512i hy_q45_at(__m512i p, int s) {
    return _mm512_mask_add_epi8(p, _mm512_cmpge_epu8_mask(p, _mm512_set1_epi8(64)), p,
                                _mm512_set1_epi8((char)(64 - s)));
}

static inline void hy_q45_plan_init(hy_q45_plan *pl, int five, int with_min) {
    const int hoff = with_min ? 4 : 2, qoff = hoff + (five ? 4 : 0), bb = qoff + 16;
    const int s = 4 * bb - 64;  /* the second load's offset */
    static const uint8_t iota[64] = {
        0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
        22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
        44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
    const __m512i j = _mm512_loadu_si512(iota);
    /* nibbles: byte j is byte j%16 of block j/16's qs */
    __m512i p = _mm512_add_epi8(_mm512_and_si512(j, _mm512_set1_epi8(15)), _mm512_set1_epi8((char)qoff));
    p = hy_q45_add_if(hy_q45_add_if(p, j, 16, bb), j, 32, 2 * bb);
    pl->nib = hy_q45_at(p, s);
    /* header words: word w < 16 is d of block w/4, word 16 + w is m of block w/4 */
    p = _mm512_and_si512(j, _mm512_set1_epi8(1));
    p = hy_q45_add_if(hy_q45_add_if(hy_q45_add_if(p, j, 8, bb), j, 16, 2 * bb), j, 32, 2);
    pl->hdr = hy_q45_at(p, s);
    /* high bits: bytes 0..3 of qwords 2k and 2k+1 are block k's qh (bytes 4..7 repeat them) */
    p = _mm512_add_epi8(_mm512_and_si512(j, _mm512_set1_epi8(3)), _mm512_set1_epi8((char)hoff));
    p = hy_q45_add_if(hy_q45_add_if(p, j, 16, bb), j, 32, 2 * bb);
    pl->qh = hy_q45_at(p, s);
    /* byte j of qword 2k is value j (bit j), of qword 2k+1 value 8 + j; the high nibbles +16 */
    pl->sel_lo = _mm512_and_si512(j, _mm512_set1_epi8(15));
    pl->sel_hi = _mm512_add_epi8(pl->sel_lo, _mm512_set1_epi8(16));
    pl->bb = bb, pl->five = five, pl->with_min = with_min;
}

/* The activations as the stream kernel reads them, HY_Q45_PREP bytes per step of 4 blocks:
 * values 0..15 of the 4 blocks (64 bytes), values 16..31, then 16 lanes each of da and sa,
 * lane 4k+i for block k (zeros past the last block). */
#define HY_Q45_PREP 256
static inline long hy_q45_prep_bytes(long n) { return HY_Q45_PREP * ((n / 32 + 3) / 4); }

static inline void hy_q45_prep(const int8_t *qa, const float *da, const float *sa, long nb,
                               uint8_t *prep) {
    const __m512i lo_q = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);    /* values 0..15 of 4 blocks */
    const __m512i hi_q = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);  /* values 16..31 */
    const __m512i quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (long g = 0; g < nb; g += 4, prep += HY_Q45_PREP) {
        const long t = nb - g < 4 ? nb - g : 4;
        const int8_t *a = qa + 32 * g;
        const __m512i q0 = _mm512_maskz_loadu_epi8(t >= 2 ? ~0ULL : 0xFFFFFFFFULL, a);
        const __m512i q1 = _mm512_maskz_loadu_epi8(t == 4 ? ~0ULL : (t == 3 ? 0xFFFFFFFFULL : 0ULL), a + 64);
        const __mmask16 mf = (__mmask16)((1u << t) - 1);
        _mm512_storeu_si512(prep, _mm512_permutex2var_epi64(q0, lo_q, q1));
        _mm512_storeu_si512(prep + 64, _mm512_permutex2var_epi64(q0, hi_q, q1));
        _mm512_storeu_ps(prep + 128, _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(_mm_maskz_loadu_ps(mf, da + g))));
        _mm512_storeu_ps(prep + 192, _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(_mm_maskz_loadu_ps(mf, sa + g))));
    }
}

/* lanes 4k+i of x summed over k, (k0 + k1) + (k2 + k3): row i's four running sums */
static inline __m128 hy_q45_sets_sum(__m512 x) {
    return _mm_add_ps(_mm_add_ps(_mm512_castps512_ps128(x), _mm512_extractf32x4_ps(x, 1)),
                      _mm_add_ps(_mm512_extractf32x4_ps(x, 2), _mm512_extractf32x4_ps(x, 3)));
}

/* W (<= 4) weight rows (row i at w + i*wstep) times R (<= HY_MR) activation rows (hy_q45_prep's,
 * pstride bytes apart): out[r*ldo + i*ostep].  Each row's integer sums of a step are reduced to
 * one per block and transposed so that lane 4k+i holds row i's block k; one FMA adds the step's
 * scaled sums into a register whose lane 4k+i keeps row i's running sum of blocks k, k+4, ...
 * (one more FMA the offsets), and the four sums of a row are added up at the end,
 * (s0 + s1) + (s2 + s3).  hy_q45_matvec16 adds its blocks in the same order with the same
 * roundings, so both kernels give the same bits and either may serve a row.  (Adding the blocks
 * one after another, as before, took eight 128-bit FMAs and twelve extracts per step: in cache,
 * 2 threads, 4096x4096 Q4_0 68 GB/s against 88 now.) */
static inline __attribute__((always_inline)) void
hy_q45_matvec_stream(const hy_q45_plan *pl, const uint8_t *w, long wstep, const int W, long nb,
                     const int R, const uint8_t *prep, long pstride, float *out, long ostep,
                     long ldo) {
    const int bb = pl->bb, five = pl->five, with_min = pl->with_min, s = 4 * bb - 64;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[HY_MR], off[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = off[r] = _mm512_setzero_ps();
    for (long g = 0; g < nb; g += 4, prep += HY_Q45_PREP) {
        /* the last step may hold fewer than 4 blocks: masked loads read zeros past them, and
         * zero sums and scales leave the sums as they are */
        const long t = nb - g < 4 ? nb - g : 4;
        const __mmask64 mw0 = t == 4 ? ~0ULL : (t * bb >= 64 ? ~0ULL : (1ULL << (t * bb)) - 1);
        const __mmask64 mw1 = t == 4 ? ~0ULL : (t * bb <= s ? 0ULL : (1ULL << (t * bb - s)) - 1);
        __m512i lo[4], hi[4], hdr = _mm512_setzero_si512();
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + bb * g;
            /* the hardware prefetchers here do not keep a stream ahead: prefetch the lines of
             * the step HY_Q45_PF bytes ahead */
            _mm_prefetch((const char *)blk + HY_Q45_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + HY_Q45_PF + 4 * bb - 1, _MM_HINT_T0);
            const __m512i x0 = _mm512_maskz_loadu_epi8(mw0, blk), x1 = _mm512_maskz_loadu_epi8(mw1, blk + s);
            const __m512i nibs = _mm512_permutex2var_epi8(x0, pl->nib, x1);
            lo[i] = _mm512_and_si512(nibs, m4);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(nibs, 4), m4);
#if defined(__AVX512BITALG__)
            if (five) {
                const __m512i b4 = _mm512_set1_epi8(0x10);
                const __m512i qh = _mm512_permutex2var_epi8(x0, pl->qh, x1);
                lo[i] = _mm512_mask_add_epi8(lo[i], _mm512_bitshuffle_epi64_mask(qh, pl->sel_lo), lo[i], b4);
                hi[i] = _mm512_mask_add_epi8(hi[i], _mm512_bitshuffle_epi64_mask(qh, pl->sel_hi), hi[i], b4);
            }
#endif
            /* words 4k+i: d of block k, 16+4k+i: m of block k */
            hdr = _mm512_mask_blend_epi16(0x11111111u << i, hdr, _mm512_permutex2var_epi8(x0, pl->hdr, x1));
        }
        for (int i = W; i < 4; i++) lo[i] = hi[i] = _mm512_setzero_si512();
        const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(hdr));
        const __m512 mn = with_min ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hdr, 1)) : d;
        for (int r = 0; r < R; r++) {
            const uint8_t *a = prep + r * pstride;
            const __m512i alo = _mm512_loadu_si512(a), ahi = _mm512_loadu_si512(a + 64);
            __m512i p[4];  /* lane 4k+j: values 4j..4j+3 and 16+4j.. of block k */
            for (int i = 0; i < 4; i++)
                p[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], alo), hi[i], ahi);
            /* block sums, lane 4k+i for row i (exact integers) */
            const __m512i p01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
            const __m512i p23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23),
                                                                   _mm512_unpackhi_epi64(p01, p23)));
            const __m512 scale = _mm512_mul_ps(d, _mm512_loadu_ps(a + 128));  /* d * da */
            const __m512 sa = _mm512_loadu_ps(a + 192);
            acc[r] = _mm512_fmadd_ps(sum, scale, acc[r]);
            off[r] = _mm512_fmadd_ps(mn, sa, off[r]);
        }
    }
    const float centre = with_min ? 1.0f : (five ? -16.0f : -8.0f);
    for (int r = 0; r < R; r++) {
        float v[4];
        _mm_storeu_ps(v, _mm_fmadd_ps(hy_q45_sets_sum(off[r]), _mm_set1_ps(centre), hy_q45_sets_sum(acc[r])));
        for (int i = 0; i < W; i++) out[r * ldo + i * ostep] = v[i];
    }
}
#endif

/* One weight row of `n` values times one activation row: qa/da/sa for the integer formats,
 * x (float32) for F16/BF16. */
static inline float hy_q_dot(int type, const uint8_t *w, long n, const int8_t *qa, const float *da,
                             const float *sa, const float *s16, const float *x) {
    switch (type) {
    case HY_Q_F16: return hy_dot_half(w, n, x, 0);
    case HY_Q_BF16: return hy_dot_half(w, n, x, 1);
    case HY_Q_Q8_0: return hy_dot_q8_0(w, n / 32, qa, da);
    case HY_Q_Q4_0: return hy_dot_q4q5(w, n / 32, qa, da, sa, 0, 0);
    case HY_Q_Q4_1: return hy_dot_q4q5(w, n / 32, qa, da, sa, 0, 1);
    case HY_Q_Q5_0: return hy_dot_q4q5(w, n / 32, qa, da, sa, 1, 0);
    case HY_Q_Q5_1: return hy_dot_q4q5(w, n / 32, qa, da, sa, 1, 1);
    case HY_Q_Q4_K: return hy_dot_q45_k(w, n / 256, qa, da, sa, 0);
    case HY_Q_Q5_K: return hy_dot_q45_k(w, n / 256, qa, da, sa, 1);
    case HY_Q_Q6_K: return hy_dot_q6_k(w, n / 256, qa, da, s16);
    case HY_Q_F32: return hy_dot_stream((const float *)w, x, n);
    }
    return NAN;
}

/* The stream kernel's activations (hy_q45_prep), for the formats it serves: bytes per activation
 * row of n values (0 where the build has no stream kernel), whether `type` reads them, and the
 * preparation of one row. */
static inline long hy_q_stream_bytes(long n) {
#if defined(HY_Q45_STREAM)
    return hy_q45_prep_bytes(n);
#else
    (void)n;
    return 0;
#endif
}

static inline int hy_q_uses_stream(int type) {
#if defined(HY_Q45_STREAM)
    return hy_q45_rows16(type);  /* its rows past whole groups of 16, for several activation rows */
#else
    (void)type;
    return 0;
#endif
}

static inline void hy_q_stream_acts(const int8_t *qa, const float *da, const float *sa, long n,
                                    uint8_t *prep) {
#if defined(HY_Q45_STREAM)
    hy_q45_prep(qa, da, sa, n / 32, prep);
#else
    (void)qa, (void)da, (void)sa, (void)n, (void)prep;
#endif
}

/* out[r*ldo + o] = row o of w . activation row r (+ bias[o]) for o in [o0, o1), r < rows.
 * Each weight row is read from memory once and used for every activation row. */
static inline void hy_q_matvec_range(int type, const uint8_t *w, long row_bytes, long n, long o0,
                                     long o1, int rows, const int8_t *qa, const float *da,
                                     const float *sa, const float *s16, const uint8_t *prep,
                                     const float *x, const float *bias, float *out, long ldo) {
    const long nb = n / 32;
    const int multi = type == HY_Q_Q8_0 || type == HY_Q_Q4_0 || type == HY_Q_Q4_1 ||
                      type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
    long o = o0;
#if defined(HY_Q512)
    const int five = type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
    const int rows16 = hy_q45_rows16(type);
    /* Q8_0 takes the 16-row kernel only where 16 rows are a short span (12 KiB: up to 704
     * values per row), read as one stream; on wider rows it read memory slower than one row at
     * a time (2 threads, from memory: 37-41 against 49-57 GB/s at 1536 and 2048 wide, while at
     * 576 wide it was 47-53 against 33-44), and one row's cheap integer work is no bottleneck.
     * The choice depends on the matrix only, never on the number of activation rows. */
    const int q8_rows16 = type == HY_Q_Q8_0 && 16 * row_bytes <= 12288;
#if defined(HY_Q45_STREAM)
    const int stream = hy_q_uses_stream(type);
    if (stream && prep != NULL) {
        hy_q45_plan pl;
        hy_q45_plan_init(&pl, five, type == HY_Q_Q4_1 || type == HY_Q_Q5_1);
        const long pstride = hy_q45_prep_bytes(n);
        if (rows <= 4) {
            /* four weight rows per pass, one from each quarter of the range: each quarter is one
             * forward stream through consecutive rows (prefetches running past a row's end fetch
             * the next row read); then the rows past the quarters.  Up to four activation rows
             * this kernel is the faster (2 threads, 4096x4096 Q4_0 in cache, 2/3/4 rows:
             * 142/190/236 us against the 16-row kernel's 207/248/286); at 8 rows the 16-row
             * kernel is 10-20% faster. */
            const long q = (o1 - o) / 4;
            for (long k = 0; k < q + (o1 - o - 4 * q); k++) {
                const int W = k < q ? 4 : 1;
                const long i = k < q ? o + k : o + 3 * q + k;  /* its first weight row */
                const long wstep = k < q ? q * row_bytes : 0, ostep = k < q ? q : 0;
#define HY_RS(R) case R: \
                if (W == 4) hy_q45_matvec_stream(&pl, w + i * row_bytes, wstep, 4, nb, R, prep, pstride, out + i, ostep, ldo); \
                else hy_q45_matvec_stream(&pl, w + i * row_bytes, 0, 1, nb, R, prep, pstride, out + i, 0, ldo); \
                break;
                switch (rows) { HY_RS(1) HY_RS(2) HY_RS(3) HY_RS(4) }
#undef HY_RS
            }
            if (bias)
                for (int r = 0; r < rows; r++)
                    for (long i = o; i < o1; i++) out[r * ldo + i] += bias[i];
            return;
        }
        /* more activation rows: the 16-row kernel below (the same bits) takes the whole groups
         * of 16 rows, reading the activations once per group; this one the rows past them */
        const long end = o + (o1 - o) / 16 * 16;
        for (long i = end; i < o1; i++) {
            for (int r = 0; r < rows; r += HY_MR) {
                const int left = rows - r < HY_MR ? rows - r : HY_MR;
#define HY_RS(R) case R: hy_q45_matvec_stream(&pl, w + i * row_bytes, 0, 1, nb, R, prep + r * pstride, pstride, out + r * ldo + i, 0, ldo); break;
                switch (left) { HY_R_CASES(HY_RS) }
#undef HY_RS
            }
            if (bias)
                for (int r = 0; r < rows; r++) out[r * ldo + i] += bias[i];
        }
        o1 = end;
    }
#endif
    if ((rows16 || q8_rows16) && qa != NULL) {  /* 16 weight rows per pass */
        const int mn = type == HY_Q_Q4_1 || type == HY_Q_Q5_1;
        for (; o + 16 <= o1; o += 16) {
            int r = 0;
            /* activation rows HY_MR at a time, then the rest in one pass (R a constant in each
             * case, so the sums stay in registers) */
            while (r < rows) {
                const int left = rows - r < HY_MR ? rows - r : HY_MR;
                const uint8_t *wo = w + o * row_bytes;
                const int8_t *q = qa + r * n;
                const float *d = da + r * nb, *sb = sa + r * nb;
                float *y = out + r * ldo + o;
#define HY_R16(R) case R: \
                    if (type == HY_Q_Q8_0) hy_q8_matvec16(wo, row_bytes, nb, R, q, d, sb, y, ldo); \
                    else hy_q45_matvec16(wo, row_bytes, nb, R, q, d, sb, five, mn, y, ldo); \
                    break;
                switch (left) { HY_R_CASES(HY_R16) }
#undef HY_R16
                r += left;
            }
            if (bias)
                for (r = 0; r < rows; r++)
                    for (int i = 0; i < 16; i++) out[r * ldo + o + i] += bias[o + i];
        }
    }
    /* Q4_K / Q5_K / Q6_K: two weight rows per pass share the activations' loads and
     * arrangement; each row takes the operations of a single row (the same bits), and the
     * odd row left over takes the one-row path.  In L2, one core (Zen 4), 512x2048 and
     * 128x8192: Q4_K 12.7-16.4 -> 16.8-21.2 GB/s, Q6_K 14.4-16.1 -> 17.0-21.7 (with the vector
     * activation quantization); four rows per pass measured the same as two. */
    if ((type == HY_Q_Q4_K || type == HY_Q_Q5_K || type == HY_Q_Q6_K) && qa != NULL) {
        const int pf_l2 = hy_q_kquant_pf_l2(n);
        for (; o + 2 <= o1; o += 2)
            for (int r = 0; r < rows; r++) {
                float v[2];
                if (type == HY_Q_Q6_K)
                    hy_dot_q6_k_512_rows(w + o * row_bytes, row_bytes, 2, n / 256, qa + r * n,
                                         da + r * nb, s16 + 2 * r * nb, v);
                else if (type == HY_Q_Q5_K)  /* (five a constant in each call) */
                    hy_dot_q45_k_512_rows(w + o * row_bytes, row_bytes, 2, n / 256, qa + r * n,
                                          da + r * nb, sa + r * nb, 1, pf_l2, v);
                else
                    hy_dot_q45_k_512_rows(w + o * row_bytes, row_bytes, 2, n / 256, qa + r * n,
                                          da + r * nb, sa + r * nb, 0, pf_l2, v);
                for (int i = 0; i < 2; i++) out[r * ldo + o + i] = v[i] + (bias ? bias[o + i] : 0.0f);
            }
    }
#endif
#if defined(HY_HALF512)
    /* F16 / BF16: four weight rows per pass share the loads of x (hy_half_rows) */
    if ((type == HY_Q_F16 || type == HY_Q_BF16) && x != NULL) {
        for (; o + 4 <= o1; o += 4)
            for (int r = 0; r < rows; r++) {
                float v[4];
                if (type == HY_Q_BF16) hy_half_rows(w + o * row_bytes, row_bytes, 4, n, x + r * n, 1, v);
                else hy_half_rows(w + o * row_bytes, row_bytes, 4, n, x + r * n, 0, v);
                for (int i = 0; i < 4; i++) out[r * ldo + o + i] = v[i] + (bias ? bias[o + i] : 0.0f);
            }
    }
#endif
#if defined(HY_AVX2) && !defined(HY_Q512)
    /* Q4_0 / Q4_1 / Q5_0 / Q5_1: 8 weight rows per pass, every row (hy_q45_matvec8) */
    if ((type == HY_Q_Q4_0 || type == HY_Q_Q4_1 || type == HY_Q_Q5_0 || type == HY_Q_Q5_1)
        && qa != NULL) {
        const int mn = type == HY_Q_Q4_1 || type == HY_Q_Q5_1;
        const int five = type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
        for (; o < o1; o += 8) {
            const int W = o1 - o < 8 ? (int)(o1 - o) : 8;
            for (int r = 0; r < rows; r += HY_MR) {
                const int left = rows - r < HY_MR ? rows - r : HY_MR;
#define HY_R8(R) case R:  /* (five a constant in each call) */ \
                    if (five) hy_q45_matvec8(w + o * row_bytes, row_bytes, W, nb, R, qa + r * n, \
                                             da + r * nb, sa + r * nb, 1, mn, out + r * ldo + o, ldo); \
                    else hy_q45_matvec8(w + o * row_bytes, row_bytes, W, nb, R, qa + r * n, \
                                        da + r * nb, sa + r * nb, 0, mn, out + r * ldo + o, ldo); \
                    break;
                switch (left) { HY_R_CASES(HY_R8) }
#undef HY_R8
            }
            if (bias)
                for (int r = 0; r < rows; r++)
                    for (int i = 0; i < W; i++) out[r * ldo + o + i] += bias[o + i];
        }
        return;
    }
#endif
    for (; o < o1; o++) {
        const uint8_t *wr = w + o * row_bytes;
        float bo = bias ? bias[o] : 0.0f;
        int r = 0;
        if (multi) {  /* HY_MR activation rows per pass over the weight row */
            for (; r + HY_MR <= rows; r += HY_MR) {
                float v[HY_MR];
                const int8_t *q = qa + r * n;
                const float *d = da + r * nb, *sb = sa + r * nb;
                switch (type) {
                case HY_Q_Q8_0: hy_dot_q8_0_rows(wr, nb, HY_MR, q, d, v); break;
                case HY_Q_Q4_0: hy_dot_q4q5_rows(wr, nb, HY_MR, q, d, sb, 0, 0, v); break;
                case HY_Q_Q4_1: hy_dot_q4q5_rows(wr, nb, HY_MR, q, d, sb, 0, 1, v); break;
                case HY_Q_Q5_0: hy_dot_q4q5_rows(wr, nb, HY_MR, q, d, sb, 1, 0, v); break;
                default: hy_dot_q4q5_rows(wr, nb, HY_MR, q, d, sb, 1, 1, v); break;
                }
                for (int i = 0; i < HY_MR; i++) out[(r + i) * ldo + o] = v[i] + bo;
            }
        }
        for (; r < rows; r++) {
            float v = hy_q_dot(type, wr, n, qa ? qa + r * n : NULL, da ? da + r * nb : NULL,
                               sa ? sa + r * nb : NULL, s16 ? s16 + 2 * r * nb : NULL,
                               x ? x + r * n : NULL);
            out[r * ldo + o] = v + bo;
        }
    }
}

/* ================================================================== prefill: int8 GEMM on panels
 *
 * For many activation rows, every weight row is first re-expressed as 8-bit integers with one
 * float factor per 16 values and one float offset per 16 (value = c * v + m): a "panel" row.
 * All integer formats fit: v is unsigned (0..63) except Q8_0 (signed).  Panels of 8 rows are
 * interleaved 4 values at a time, so a 32-byte vector holds 4 values of each of the 8 rows and the
 * vector lanes of every integer sum are weight rows.  The GEMM multiplies 8-bit activations (4 bytes
 * broadcast) by them in tiles of 4 activation rows x 8 weight rows and scales each half block with
 * one FMA per 8 rows (c_half * da); the offsets' share, sum_h m_h * s16_h with s16_h = da * (sum of
 * the activations of half h), is one short dot product per output.
 */

/* one weight row -> v [n] (uint8, or int8 for Q8_0), c [n/16], m [n/16] */
static inline void hy_q_panel_row(int type, const uint8_t *row, long n, uint8_t *v, float *c,
                                  float *m) {
    const int bb = hy_q_block_bytes(type);
    if (type == HY_Q_Q8_0 || type == HY_Q_Q4_0 || type == HY_Q_Q4_1 || type == HY_Q_Q5_0 ||
        type == HY_Q_Q5_1) {
        for (long b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + bb * b;
            const float d = hy_f16(blk);
            float mn = 0.0f;
            uint8_t *vb = v + 32 * b;
            if (type == HY_Q_Q8_0) {
#if defined(HY_Q512)  /* w + 128, unsigned for vpdpbusd; the GEMM takes 128 * sum(a) back out */
                _mm256_storeu_si256((__m256i *)vb, _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80)));
#else
                memcpy(vb, blk + 2, 32);
#endif
            } else {
                const int with_min = (type == HY_Q_Q4_1 || type == HY_Q_Q5_1);
                const int five = (type == HY_Q_Q5_0 || type == HY_Q_Q5_1);
                const uint8_t *q = blk + (with_min ? 4 : 2) + (five ? 4 : 0);
                uint32_t qh = five ? hy_u32(blk + (with_min ? 4 : 2)) : 0;
#ifdef HY_AVX2
                __m256i vv = hy_nibbles16(q);
                if (five) vv = _mm256_or_si256(vv, hy_bit4_from_bits(qh));
                _mm256_storeu_si256((__m256i *)vb, vv);
#else
                for (int j = 0; j < 16; j++) {
                    vb[j] = (uint8_t)((q[j] & 0x0F) | (((qh >> j) & 1) << 4));
                    vb[j + 16] = (uint8_t)((q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
                }
#endif
                mn = with_min ? hy_f16(blk + 2) : -(five ? 16.0f : 8.0f) * d;
            }
            c[2 * b] = c[2 * b + 1] = d;
            m[2 * b] = m[2 * b + 1] = mn;
        }
        return;
    }
    for (long s = 0; s < n / 256; s++) {
        const uint8_t *blk = row + bb * s;
        uint8_t *vs = v + 256 * s;
        float *cs = c + 16 * s, *ms = m + 16 * s;
        if (type == HY_Q_Q6_K) {
            const uint8_t *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            const float d = hy_f16(blk + 208);
            for (int half = 0; half < 2; half++) {
                for (int l = 0; l < 32; l++) {
                    vs[128 * half + l] = (uint8_t)((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4));
                    vs[128 * half + l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
                    vs[128 * half + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                    vs[128 * half + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                }
                ql += 64;
                qh += 32;
            }
            for (int g = 0; g < 16; g++) {
                cs[g] = d * (float)sc[g];
                ms[g] = -32.0f * cs[g];
            }
        } else {
            const int five = type == HY_Q_Q5_K;
            const uint8_t *qh = blk + 16, *q = five ? blk + 48 : blk + 16;
            const float d = hy_f16(blk), dmin = hy_f16(blk + 2);
            for (int j = 0; j < 8; j++) {
                uint8_t sc, mn;
                hy_k4_scale_min(j, blk + 4, &sc, &mn);
                const uint8_t *qq = q + 32 * (j / 2);
                for (int l = 0; l < 32; l++) {
                    int nv = (j & 1) ? (qq[l] >> 4) : (qq[l] & 0x0F);
                    if (five) nv |= ((qh[l] >> j) & 1) << 4;
                    vs[32 * j + l] = (uint8_t)nv;
                }
                cs[2 * j] = cs[2 * j + 1] = d * (float)sc;
                ms[2 * j] = ms[2 * j + 1] = -dmin * (float)mn;
            }
        }
    }
}

/* Values per int16 partial sum before widening: maddubs gives at most 2*vmax*127 per pair, so
 * 4-bit and 5-bit values (<= 31) take 4 chunks of 4 values, 6-bit (Q6_K) 2, signed 8-bit 1. */
static inline int hy_q_gemm_group(int type) {
    switch (type) {
    case HY_Q_Q8_0: return 1;
    case HY_Q_Q6_K: return 2;
    }
    return 4;
}

/* weight rows per GEMM panel (the lanes of one vector) */
static inline int hy_q_gemm_panel_rows(void) { return HY_GEMM_P; }

/* Interleave P = HY_GEMM_P decoded panel rows for the GEMM: vi[32*P*b + 4*P*j + 4*i ..] holds,
 * for block b and chunk j (values 4j..4j+3), the 4 values of row i; cT[P*(2b + h) + i] is row
 * i's factor for half h of block b. */
static inline void hy_q_interleave(long n, const uint8_t *v, const float *c, uint8_t *vi,
                                   float *cT) {
    const int P = HY_GEMM_P;
#if defined(HY_Q512)
    for (long b = 0; b < n / 32; b++)
        for (int g = 0; g < P / 16; g++) {  /* 16 rows' 32 values at a time */
            __m512i wc[8];
            hy_transpose_16x8(v + 16 * g * n + 32 * b, n, wc);
            for (int j = 0; j < 8; j++)
                _mm512_storeu_si512((void *)(vi + 32 * P * b + 4 * P * j + 64 * g), wc[j]);
        }
#else
    for (long b = 0; b < n / 32; b++)
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < P; i++)
                memcpy(vi + 32 * P * b + 4 * P * j + 4 * i, v + i * n + 32 * b + 4 * j, 4);
#endif
    for (long h = 0; h < n / 16; h++)
        for (int i = 0; i < P; i++) cT[P * h + i] = c[i * (n / 16) + h];
}

/* asum16[h] = integer sum of the 8-bit activations over values 16h..16h+15, for n values */
static inline void hy_q_half_sums(const int8_t *qa, long n, int32_t *asum16) {
    for (long h = 0; h < n / 16; h++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += qa[16 * h + j];
        asum16[h] = s;
    }
}

/* Activation rows per GEMM tile: 8 where AVX-512VL gives 32 vector registers, else 4 */
#if defined(HY_Q512)  /* 6 rows x 2 vectors of sums and accumulators: 24 of 32 registers */
#define HY_GEMM_RB 6
#elif defined(HY_AVX2) && defined(__AVX512VL__)
#define HY_GEMM_RB 8
#else
#define HY_GEMM_RB 4
#endif

/* RB (<= HY_GEMM_RB) activation rows against the P interleaved panel rows: out[r*ldo + i], i < np.
 * Lanes are panel rows.  A segment is a whole 32-value block when the format has one factor per
 * block (per32; all but Q6_K), else half a block.  Per segment and activation row: the integer
 * sum (maddubs/madd or vpdpbusd), minus ioff times the activations' integer sum when the format's
 * offset is a whole multiple of its factor (Q4_0: 8, Q5_0: 16, Q6_K: 32), then one FMA with
 * factor * activation scale; with float offsets (fmin: Q4_1, Q5_1, Q4_K, Q5_K) one more FMA adds
 * the block's offset times the activations' scaled block sum sa.  Every path (AVX-512, AVX2,
 * portable) performs the same float operations in the same order: identical results. */
static inline __attribute__((always_inline)) void hy_q_gemm_tile(const int RB, const int G, const int is_signed, const int per32,
                                  const int ioff, const int fmin, long nb, const int8_t *qa,
                                  long lda, const float *da, const float *sa, const int32_t *a16,
                                  const uint8_t *vi, const float *cT, const float *mT, float *out,
                                  long ldo, int np) {
    const int nseg = per32 ? 1 : 2, cps = 8 / nseg;  /* segments per block, chunks per segment */
#define HY_IOFF(r, b, h) (ioff * (per32 ? a16[(r) * 2 * nb + 2 * (b)] + a16[(r) * 2 * nb + 2 * (b) + 1] \
                                         : a16[(r) * 2 * nb + 2 * (b) + (h)]))
#if defined(HY_Q512)
    /* two vectors of 16 panel rows each: every broadcast activation serves both */
    (void)G;
    __m512 acc[HY_GEMM_RB][2];
    for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *vb = vi + 1024 * b;
        for (int h = 0; h < nseg; h++) {
            __m512i s32[HY_GEMM_RB][2];
            for (int r = 0; r < RB; r++) s32[r][0] = s32[r][1] = _mm512_setzero_si512();
            for (int j = 0; j < cps; j++) {
                const int jj = cps * h + j;
                __m512i w0 = _mm512_loadu_si512((const void *)(vb + 128 * jj));
                __m512i w1 = _mm512_loadu_si512((const void *)(vb + 128 * jj + 64));
                __m512i wa0 = w0, wa1 = w1;
                __mmask64 neg0 = 0, neg1 = 0;
                if (is_signed) {  /* |w| times a with w's sign */
                    wa0 = _mm512_abs_epi8(w0);
                    wa1 = _mm512_abs_epi8(w1);
                    neg0 = _mm512_movepi8_mask(w0);
                    neg1 = _mm512_movepi8_mask(w1);
                }
                for (int r = 0; r < RB; r++) {
                    int32_t a4;
                    memcpy(&a4, qa + r * lda + 32 * b + 4 * jj, 4);
                    const __m512i a = _mm512_set1_epi32(a4);
                    if (is_signed) {
                        s32[r][0] = _mm512_dpbusd_epi32(s32[r][0], wa0, _mm512_mask_sub_epi8(a, neg0, _mm512_setzero_si512(), a));
                        s32[r][1] = _mm512_dpbusd_epi32(s32[r][1], wa1, _mm512_mask_sub_epi8(a, neg1, _mm512_setzero_si512(), a));
                    } else {
                        s32[r][0] = _mm512_dpbusd_epi32(s32[r][0], wa0, a);
                        s32[r][1] = _mm512_dpbusd_epi32(s32[r][1], wa1, a);
                    }
                }
            }
            const __m512 ch0 = _mm512_loadu_ps(cT + 32 * (2 * b + h));
            const __m512 ch1 = _mm512_loadu_ps(cT + 32 * (2 * b + h) + 16);
            for (int r = 0; r < RB; r++) {
                if (ioff) {
                    const __m512i o = _mm512_set1_epi32(HY_IOFF(r, b, h));
                    s32[r][0] = _mm512_sub_epi32(s32[r][0], o);
                    s32[r][1] = _mm512_sub_epi32(s32[r][1], o);
                }
                const __m512 dr = _mm512_set1_ps(da[r * nb + b]);
                acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32[r][0]), _mm512_mul_ps(ch0, dr), acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32[r][1]), _mm512_mul_ps(ch1, dr), acc[r][1]);
            }
        }
        if (fmin) {
            const __m512 mb0 = _mm512_loadu_ps(mT + 32 * b), mb1 = _mm512_loadu_ps(mT + 32 * b + 16);
            for (int r = 0; r < RB; r++) {
                const __m512 sr = _mm512_set1_ps(sa[r * nb + b]);
                acc[r][0] = _mm512_fmadd_ps(mb0, sr, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(mb1, sr, acc[r][1]);
            }
        }
    }
    const __mmask16 k0 = (__mmask16)(np >= 16 ? 0xFFFFu : (1u << np) - 1u);
    const __mmask16 k1 = (__mmask16)(np >= 32 ? 0xFFFFu : np <= 16 ? 0u : (1u << (np - 16)) - 1u);
    for (int r = 0; r < RB; r++) {
        _mm512_mask_storeu_ps(out + r * ldo, k0, acc[r][0]);
        _mm512_mask_storeu_ps(out + r * ldo + 16, k1, acc[r][1]);
    }
#elif defined(HY_AVX2)
    __m256 acc[HY_GEMM_RB];
    for (int r = 0; r < RB; r++) acc[r] = _mm256_setzero_ps();
#ifndef HY_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (long b = 0; b < nb; b++) {
        const uint8_t *vb = vi + 256 * b;
        for (int h = 0; h < nseg; h++) {
            __m256i s32[HY_GEMM_RB];
            for (int r = 0; r < RB; r++) s32[r] = _mm256_setzero_si256();
#ifdef HY_VNNI
            (void)G;
            for (int j = 0; j < cps; j++) {  /* vpdpbusd accumulates in int32 directly */
                const int jj = cps * h + j;
                __m256i w = _mm256_loadu_si256((const __m256i *)(vb + 32 * jj));
                __m256i wa = is_signed ? _mm256_abs_epi8(w) : w;
                for (int r = 0; r < RB; r++) {
                    int32_t a4;
                    memcpy(&a4, qa + r * lda + 32 * b + 4 * jj, 4);
                    __m256i a = _mm256_set1_epi32(a4);
                    if (is_signed) a = _mm256_sign_epi8(a, w);
                    s32[r] = HY_DPBUSD(s32[r], wa, a);
                }
            }
#else
            for (int j0 = 0; j0 < cps; j0 += G) {  /* int16 partial sums of G chunks, then widen */
                __m256i s16[HY_GEMM_RB];
                for (int r = 0; r < RB; r++) s16[r] = _mm256_setzero_si256();
                for (int j = j0; j < j0 + G; j++) {
                    const int jj = cps * h + j;
                    __m256i w = _mm256_loadu_si256((const __m256i *)(vb + 32 * jj));
                    __m256i wa = is_signed ? _mm256_abs_epi8(w) : w;
                    for (int r = 0; r < RB; r++) {
                        int32_t a4;
                        memcpy(&a4, qa + r * lda + 32 * b + 4 * jj, 4);
                        __m256i a = _mm256_set1_epi32(a4);
                        if (is_signed) a = _mm256_sign_epi8(a, w);
                        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wa, a));
                    }
                }
                for (int r = 0; r < RB; r++)
                    s32[r] = _mm256_add_epi32(s32[r], _mm256_madd_epi16(s16[r], ones));
            }
#endif
            if (ioff)
                for (int r = 0; r < RB; r++)
                    s32[r] = _mm256_sub_epi32(s32[r], _mm256_set1_epi32(HY_IOFF(r, b, h)));
            __m256 ch = _mm256_loadu_ps(cT + 8 * (2 * b + h));
            for (int r = 0; r < RB; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[r]),
                                         _mm256_mul_ps(ch, _mm256_broadcast_ss(da + r * nb + b)), acc[r]);
        }
        if (fmin) {
            __m256 mb = _mm256_loadu_ps(mT + 8 * b);
            for (int r = 0; r < RB; r++)
                acc[r] = _mm256_fmadd_ps(mb, _mm256_broadcast_ss(sa + r * nb + b), acc[r]);
        }
    }
    for (int r = 0; r < RB; r++) {
        if (np == 8) {
            _mm256_storeu_ps(out + r * ldo, acc[r]);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[r]);
            for (int i = 0; i < np; i++) out[r * ldo + i] = tmp[i];
        }
    }
#else
    (void)G;
    const int P = HY_GEMM_P;
    for (int r = 0; r < RB; r++) {
        for (int i = 0; i < np; i++) {
            float sum = 0.0f;
            for (long b = 0; b < nb; b++) {
                for (int h = 0; h < nseg; h++) {
                    int s = 0;
                    for (int j = cps * h; j < cps * (h + 1); j++)
                        for (int t = 0; t < 4; t++) {
                            uint8_t raw = vi[32 * P * b + 4 * P * j + 4 * i + t];
                            int wv = is_signed ? (int)(int8_t)raw : (int)raw;
                            s += wv * qa[r * lda + 32 * b + 4 * j + t];
                        }
                    if (ioff) s -= HY_IOFF(r, b, h);
                    sum = fmaf((float)s, cT[P * (2 * b + h) + i] * da[r * nb + b], sum);
                }
                if (fmin) sum = fmaf(mT[P * b + i], sa[r * nb + b], sum);
            }
            out[r * ldo + i] = sum;
        }
    }
#endif
#undef HY_IOFF
}

/* hy_q_gemm_tile with the format's constants as compile-time constants.  Both are always
 * inlined: left to the compiler's inlining heuristics, the tile was emitted out of line in a few
 * generic copies where RB and the format flags were run-time values (register arrays on the
 * stack); always inlined, every (rows, format) case is its own specialised loop (2 threads,
 * 256-token prefill, alternating runs: 1B-shaped Q4_0 740-985 -> 1129-1404 tok/s, SmolLM2
 * Q4_0 934-1195 -> 1462-1840, SmolLM2 Q8_0 1057-1376 -> 1469-2019). */
static inline __attribute__((always_inline)) void hy_q_gemm_rows(const int RB, int type, long nb, const int8_t *qa,
                                  const float *da, const float *sa, const int32_t *a16,
                                  const uint8_t *vi, const float *cT, const float *mT, float *out,
                                  long ldo, int np) {
    const long n = 32 * nb;
#define HY_TILE(G, SGN, PER32, IOFF, FMIN) \
    hy_q_gemm_tile(RB, G, SGN, PER32, IOFF, FMIN, nb, qa, n, da, sa, a16, vi, cT, mT, out, ldo, np)
    switch (type) {
#if defined(HY_Q512)  /* panels hold w + 128: integer sums less 128 * sum(a), exactly sum(w * a) */
    case HY_Q_Q8_0: HY_TILE(1, 0, 1, 128, 0); break;
#else
    case HY_Q_Q8_0: HY_TILE(1, 1, 1, 0, 0); break;
#endif
    case HY_Q_Q4_0: HY_TILE(4, 0, 1, 8, 0); break;
    case HY_Q_Q5_0: HY_TILE(4, 0, 1, 16, 0); break;
    case HY_Q_Q6_K: HY_TILE(2, 0, 0, 32, 0); break;
    default: HY_TILE(4, 0, 1, 0, 1); break;  /* Q4_1, Q5_1, Q4_K, Q5_K */
    }
#undef HY_TILE
}

/* Every activation row against one panel of np (<= P) weight rows decoded into v, c, m (rows
 * past np zero): out[r*ldo + i].  qa, da, sa: the 8-bit activations, their scales and scaled
 * block sums; a16: their integer sums per 16 values.  vi, cT, mT: scratch for the interleaved
 * panel (P*n bytes, P*n/16 and P*n/32 floats). */
static inline void hy_q_gemm_panel(int type, long rows, long n, const int8_t *qa, const float *da,
                                   const float *sa, const int32_t *a16, const uint8_t *v,
                                   const float *c, const float *m, int np, uint8_t *vi,
                                   float *cT, float *mT, float *out, long ldo) {
    const long nb = n / 32;
    const int P = HY_GEMM_P;
    hy_q_interleave(n, v, c, vi, cT);
    for (long b = 0; b < nb; b++)  /* float offsets, one per block (m holds two equal per block) */
        for (int i = 0; i < P; i++) mT[P * b + i] = m[i * (n / 16) + 2 * b];
    long r = 0;
#define HY_ROWS(RB) hy_q_gemm_rows(RB, type, nb, qa + r * n, da + r * nb, sa + r * nb, \
                                   a16 + r * 2 * nb, vi, cT, mT, out + r * ldo, ldo, np)
#if HY_GEMM_RB == 6  /* groups of 6 rows, then the rest in one pass */
    for (; r + 6 <= rows; r += 6) HY_ROWS(6);
    switch (rows - r) {
    case 5: HY_ROWS(5); break;
    case 4: HY_ROWS(4); break;
    case 3: HY_ROWS(3); break;
    case 2: HY_ROWS(2); break;
    case 1: HY_ROWS(1); break;
    }
#else
#if HY_GEMM_RB == 8
    for (; r + 8 <= rows; r += 8) HY_ROWS(8);
#endif
    for (; r + 4 <= rows; r += 4) HY_ROWS(4);
    for (; r < rows; r++) HY_ROWS(1);
#endif
#undef HY_ROWS
}

#endif
