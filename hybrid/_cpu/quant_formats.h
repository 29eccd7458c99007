/* Build configuration of the quantized kernels (which ISA paths), format codes, block layouts,
 * and row decoding exactly as gguf.quants decodes (the oracle).
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_FORMATS_H
#define HYBRID_QUANT_FORMATS_H

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
#define HY_DPWSSD(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(HY_AVX2) && defined(__AVXVNNI__)
#define HY_VNNI 1
#define HY_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define HY_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#endif

/* The prefill GEMM runs panels of 32 weight rows, two 512-bit vectors of 16, where the build
 * targets AVX-512 (F, BW) with VNNI, else 8 per 256-bit vector. */
#if defined(HY_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define HY_Q512 1
#define HY_GEMM_P 32
#else
#define HY_GEMM_P 8
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

/* Activation rows one pass of the multi-weight-row mat-vecs takes (hy_q45_matvec8 on AVX2, the
 * 16-row kernels on AVX-512): their weights' unpacking or transposes, which cost as much as a few
 * rows' products, are done once for all of them; the sums of rows past the registers' room live
 * on the stack.  HY_PASS_CASES(X): X(R) for every R <= HY_PASS_ROWS. */
#define HY_PASS_ROWS 16
#define HY_PASS_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) \
    X(14) X(15) X(16)

/* The rows 0..rows-1 in as few passes of at most `most` rows as cover them, shared out evenly
 * (passes differ by a row at most): the statement after it runs once per pass, with r the
 * pass's first row and left its number of rows. */
#define HY_EVEN_PASSES(rows, most, r, left)                                                     \
    for (int p_ = 0, n_ = ((rows) + (most) - 1) / (most), r = 0, left = 0;                      \
         p_ < n_ && ((left = ((rows) - r + n_ - p_ - 1) / (n_ - p_)), 1); p_++, r += left)

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
    HY_Q_F32 = 11,
    /* the low-bit formats served from llama.cpp's files (hybrid does not quantize to them) */
    HY_Q_Q2_K = 12, HY_Q_Q3_K = 13, HY_Q_IQ4_NL = 14, HY_Q_IQ4_XS = 15,
    HY_Q_LAST = HY_Q_IQ4_XS
};

/* IQ4_NL / IQ4_XS: each 4-bit index names one of these 16 signed values (a non-uniform grid) */
static const int8_t hy_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1, 13, 25, 38, 53, 69, 89, 113};

static inline uint16_t hy_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline float hy_f16(const uint8_t *p) {
    const uint16_t h = hy_u16(p);
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

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 blocks: d:f16 [m:f16] [qh:u32] qs[16]; values n - centre (Q4_0,
 * Q5_0) or d*n + m */
typedef struct {
    int hoff;      /* qh (Q5) or qs (Q4) after d [, m] */
    int qoff;      /* qs */
    int bb;        /* bytes per block */
    float centre;  /* the offset of Q4_0 / Q5_0 values */
} hy_q45_layout;

static inline hy_q45_layout hy_q45_layout_of(int five, int with_min) {
    hy_q45_layout lay;
    lay.hoff = with_min ? 4 : 2;
    lay.qoff = lay.hoff + (five ? 4 : 0);
    lay.bb = lay.qoff + 16;
    lay.centre = five ? 16.0f : 8.0f;
    return lay;
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

/* the 16 6-bit scales of a Q3_K super-block (12 bytes), less 32: sc[i] in -32..31 */
static inline void hy_q3_k_scales(const uint8_t *s, int8_t *sc) {
    for (int i = 0; i < 16; i++)
        sc[i] = (int8_t)((((s[i % 8] >> (4 * (i / 8))) & 0x0F) |
                          (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32);
}

/* the 6-bit scale of sub-block j (0..7) of an IQ4_XS super-block, less 32 */
static inline int hy_iq4_xs_scale(const uint8_t *blk, int j) {
    const int lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
    const int hi = ((blk[2] | (blk[3] << 8)) >> (2 * j)) & 3;
    return (lo | (hi << 4)) - 32;
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

/* Q2_K (84 bytes): scales[16] (low nibble: scale, high: min, one each per 16 values), qs[64]
 * (2-bit values; 32-value block k = 4h + j is bits 2j of bytes 32h..32h+31), d, dmin */
static inline void hy_decode_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *q = b + 16;
    const float d = hy_f16(b + 80), dmin = hy_f16(b + 82);
    for (int k = 0; k < 8; k++)
        for (int l = 0; l < 32; l++) {
            const uint8_t s = sc[2 * k + l / 16];
            const float dl = d * (float)(s & 0x0F), ml = dmin * (float)(s >> 4);
            y[32 * k + l] = dl * (float)((q[32 * (k / 4) + l] >> (2 * (k % 4))) & 3) - ml;
        }
}

/* Q3_K (110 bytes): hmask[32] (bit k of byte l: the high bit of value l of block k), qs[64] (the
 * low 2 bits, laid out as Q2_K's), scales[12] (16 6-bit), d; value (q | high << 2) - 4 */
static inline void hy_decode_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    int8_t sc[16];
    hy_q3_k_scales(b + 96, sc);
    const float d = hy_f16(b + 108);
    for (int k = 0; k < 8; k++)
        for (int l = 0; l < 32; l++) {
            const int v = (((q[32 * (k / 4) + l] >> (2 * (k % 4))) & 3) | (((hm[l] >> k) & 1) << 2)) - 4;
            y[32 * k + l] = (d * (float)sc[2 * k + l / 16]) * (float)v;
        }
}

/* IQ4_NL (18 bytes, 32 values): d, qs[16] (indices: low nibbles values 0..15, high 16..31) */
static inline void hy_decode_iq4_nl(const uint8_t *b, float *y) {
    const float d = hy_f16(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)hy_iq4_values[b[2 + j] & 0x0F];
        y[j + 16] = d * (float)hy_iq4_values[b[2 + j] >> 4];
    }
}

/* IQ4_XS (136 bytes, 256 values): d, scales_h (u16), scales_l[4], qs[128]: 8 sub-blocks of 32
 * laid out as IQ4_NL's, each with a 6-bit scale */
static inline void hy_decode_iq4_xs(const uint8_t *b, float *y) {
    const float d = hy_f16(b);
    for (int j = 0; j < 8; j++) {
        const float dl = d * (float)hy_iq4_xs_scale(b, j);
        const uint8_t *q = b + 8 + 16 * j;
        for (int l = 0; l < 16; l++) {
            y[32 * j + l] = dl * (float)hy_iq4_values[q[l] & 0x0F];
            y[32 * j + l + 16] = dl * (float)hy_iq4_values[q[l] >> 4];
        }
    }
}

#endif
