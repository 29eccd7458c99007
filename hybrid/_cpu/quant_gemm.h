/* The prefill int8 GEMM: weight rows decoded into interleaved integer panels, multiplied by
 * tiles of activation rows.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_GEMM_H
#define HYBRID_QUANT_GEMM_H

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

/* The 32 panel values of block b (values 32b..32b+31) of an encoded weight row: unsigned
 * (0..63), or signed for Q8_0, IQ4_NL and IQ4_XS (+128, unsigned, where the AVX-512 GEMM takes
 * unsigned bytes). */
static inline __attribute__((always_inline)) void hy_q_panel_block(const int type, const uint8_t *row,
                                                                    long b, uint8_t *vb) {
    const int bb = hy_q_block_bytes(type);
    if (type == HY_Q_Q8_0) {
        const uint8_t *blk = row + 34 * b;
#if defined(HY_Q512)  /* w + 128, unsigned for vpdpbusd; the GEMM takes 128 * sum(a) back out */
        _mm256_storeu_si256((__m256i *)vb, _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80)));
#else
        memcpy(vb, blk + 2, 32);
#endif
        return;
    }
    if (type == HY_Q_Q4_0 || type == HY_Q_Q4_1 || type == HY_Q_Q5_0 || type == HY_Q_Q5_1) {
        const uint8_t *blk = row + bb * b;
        const int with_min = (type == HY_Q_Q4_1 || type == HY_Q_Q5_1);
        const int five = (type == HY_Q_Q5_0 || type == HY_Q_Q5_1);
        const uint8_t *q = blk + (with_min ? 4 : 2) + (five ? 4 : 0);
        const uint32_t qh = five ? hy_u32(blk + (with_min ? 4 : 2)) : 0;
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
        return;
    }
    if (type == HY_Q_IQ4_NL || type == HY_Q_IQ4_XS) {  /* the grid's signed values */
        const uint8_t *q = type == HY_Q_IQ4_NL ? row + 18 * b + 2
                                               : row + bb * (b / 8) + 8 + 16 * (b % 8);
#ifdef HY_AVX2
        __m256i vv = hy_iq4_lookup(q);
#if defined(HY_Q512)
        vv = _mm256_xor_si256(vv, _mm256_set1_epi8((char)0x80));
#endif
        _mm256_storeu_si256((__m256i *)vb, vv);
#else
        for (int j = 0; j < 16; j++) {
            vb[j] = (uint8_t)hy_iq4_values[q[j] & 0x0F];
            vb[j + 16] = (uint8_t)hy_iq4_values[q[j] >> 4];
        }
#endif
        return;
    }
    const uint8_t *blk = row + bb * (b / 8);  /* the K formats: sub-block j of a super-block */
    const int j = (int)(b % 8);
    if (type == HY_Q_Q2_K) {  /* 2-bit values */
        for (int l = 0; l < 32; l++)
            vb[l] = (uint8_t)((blk[16 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3);
    } else if (type == HY_Q_Q3_K) {  /* q | high << 2 (0..7) */
        for (int l = 0; l < 32; l++)
            vb[l] = (uint8_t)(((blk[32 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3) |
                              (((blk[l] >> j) & 1) << 2));
    } else if (type == HY_Q_Q6_K) {  /* 4 low bits from ql, 2 high bits from qh */
        const uint8_t *ql = blk + 64 * (j / 4) + 32 * (j % 2), *qh = blk + 128 + 32 * (j / 4);
        const int lo_shift = 4 * ((j % 4) / 2), hi_shift = 2 * (j % 4);
#ifdef HY_AVX2
        const __m256i l = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(l, lo_shift), _mm256_set1_epi8(0x0F));
        const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, hi_shift), 4),
                                            _mm256_set1_epi8(0x30));
        _mm256_storeu_si256((__m256i *)vb, _mm256_or_si256(lo, hi));
#else
        for (int l = 0; l < 32; l++)
            vb[l] = (uint8_t)(((ql[l] >> lo_shift) & 0x0F) | (((qh[l] >> hi_shift) & 3) << 4));
#endif
    } else {  /* Q4_K, Q5_K: nibbles (+ a fifth bit from qh) */
        const int five = type == HY_Q_Q5_K;
        const uint8_t *qh = blk + 16, *qq = (five ? blk + 48 : blk + 16) + 32 * (j / 2);
#ifdef HY_AVX2
        __m256i nv = _mm256_loadu_si256((const __m256i *)qq);
        if (j & 1) nv = _mm256_srli_epi16(nv, 4);
        nv = _mm256_and_si256(nv, _mm256_set1_epi8(0x0F));
        if (five) {  /* bit j of each qh byte -> bit 4 */
            const __m256i bit = _mm256_set1_epi8((char)(1 << j));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            nv = _mm256_or_si256(nv, _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), _mm256_set1_epi8(0x10)));
        }
        _mm256_storeu_si256((__m256i *)vb, nv);
#else
        for (int l = 0; l < 32; l++) {
            int nv = (j & 1) ? (qq[l] >> 4) : (qq[l] & 0x0F);
            if (five) nv |= ((qh[l] >> j) & 1) << 4;
            vb[l] = (uint8_t)nv;
        }
#endif
    }
}

/* A weight row's factors and offsets (value = c * v + m, v as hy_q_panel_block gives it) in
 * the GEMM tile's layout, row i of a panel at c = cT + i, m = mT + i: c[P*h] for half block h
 * (only h even, h = 2b, where the format has one factor per block), m[P*b] per block where the
 * format has a float offset per block (Q4_1, Q5_1, Q4_K, Q5_K), m[P*h] per half for Q2_K;
 * formats whose offset is a whole multiple of the factor (the tile's integer offset) write
 * none. */
static inline void hy_q_panel_scales(int type, const uint8_t *row, long n, float *c, float *m) {
    const long P = HY_GEMM_P;
    const int bb = hy_q_block_bytes(type);
    if (type == HY_Q_Q8_0 || type == HY_Q_Q4_0 || type == HY_Q_Q4_1 || type == HY_Q_Q5_0 ||
        type == HY_Q_Q5_1 || type == HY_Q_IQ4_NL) {
        const int with_min = type == HY_Q_Q4_1 || type == HY_Q_Q5_1;
        for (long b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + bb * b;
            c[P * 2 * b] = hy_f16(blk);
            if (with_min) m[P * b] = hy_f16(blk + 2);
        }
        return;
    }
    for (long s = 0; s < n / 256; s++) {
        const uint8_t *blk = row + bb * s;
        float *cs = c + P * 16 * s;
        if (type == HY_Q_Q2_K) {  /* d * scale, -dmin * min per 16 */
            const float d = hy_f16(blk + 80), dmin = hy_f16(blk + 82);
            for (int g = 0; g < 16; g++) {
                cs[P * g] = d * (float)(blk[g] & 0x0F);
                m[P * (16 * s + g)] = -dmin * (float)(blk[g] >> 4);
            }
        } else if (type == HY_Q_Q3_K) {  /* value c * (v - 4) */
            int8_t sc[16];
            hy_q3_k_scales(blk + 96, sc);
            const float d = hy_f16(blk + 108);
            for (int g = 0; g < 16; g++) cs[P * g] = d * (float)sc[g];
        } else if (type == HY_Q_IQ4_XS) {  /* one factor per 32 */
            const float d = hy_f16(blk);
            for (int j = 0; j < 8; j++) cs[P * 2 * j] = d * (float)hy_iq4_xs_scale(blk, j);
        } else if (type == HY_Q_Q6_K) {  /* value c * (v - 32) */
            const int8_t *sc = (const int8_t *)(blk + 192);
            const float d = hy_f16(blk + 208);
            for (int g = 0; g < 16; g++) cs[P * g] = d * (float)sc[g];
        } else {  /* Q4_K, Q5_K: d * scale, -dmin * min per 32 */
            const float d = hy_f16(blk), dmin = hy_f16(blk + 2);
            const uint8_t *k = blk + 4;
            float *ms = m + P * 8 * s;
            for (int j = 0; j < 4; j++) {  /* hy_k4_scale_min, both halves of the table */
                cs[P * 2 * j] = d * (float)(k[j] & 63);
                ms[P * j] = -dmin * (float)(k[j + 4] & 63);
                cs[P * 2 * (j + 4)] = d * (float)((k[j + 8] & 0x0F) | ((k[j] >> 6) << 4));
                ms[P * (j + 4)] = -dmin * (float)((k[j + 8] >> 4) | ((k[j + 4] >> 6) << 4));
            }
        }
    }
}

/* Values per int16 partial sum before widening: maddubs gives at most 2*vmax*127 per pair, so
 * 4-bit and 5-bit values (<= 31) take 4 chunks of 4 values, 6-bit (Q6_K) 2, signed 8-bit 1. */
static inline int hy_q_gemm_group(int type) {
    switch (type) {
    case HY_Q_Q8_0: case HY_Q_IQ4_NL: case HY_Q_IQ4_XS: return 1;
    case HY_Q_Q6_K: return 2;
    }
    return 4;
}

/* weight rows per GEMM panel (the lanes of one vector) */
static inline int hy_q_gemm_panel_rows(void) { return HY_GEMM_P; }

/* Part i of parts of the bytes [p, p + bytes) prefetched into L2 (p NULL: nothing): a panel
 * build prefetches the next panel's rows a part per block, so that the requests spread over the
 * build instead of filling the miss buffers at once. */
static inline __attribute__((always_inline)) void hy_prefetch_part(const uint8_t *p, long bytes,
                                                                   long i, long parts) {
    if (p == NULL)
        return;
    const long end = i + 1 == parts ? bytes + 63 : bytes * (i + 1) / parts;
    for (long at = bytes * i / parts / 64 * 64; at < end; at += 64) __builtin_prefetch(p + at, 0, 2);
}

/* The values part of hy_q_panel_build: each block of the np rows decoded into tmp, then
 * interleaved into vi. */
static inline __attribute__((always_inline)) void
hy_q_panel_interleave(const int type, const uint8_t *w, long row_bytes, long n, int np,
                      uint8_t *tmp, uint8_t *vi, const uint8_t *next, long next_bytes) {
    const int P = HY_GEMM_P;
    for (long b = 0; b < n / 32; b++) {
        hy_prefetch_part(next, next_bytes, b, n / 32);
        for (int i = 0; i < np; i++) hy_q_panel_block(type, w + i * row_bytes, b, tmp + 32 * i);
        uint8_t *vb = vi + 32 * P * b;
#if defined(HY_Q512)
        for (int g = 0; g < P / 16; g++) {  /* 16 rows' 32 values at a time */
            __m512i wc[8];
            hy_transpose_16x8(tmp + 512 * g, 32, wc);
            for (int j = 0; j < 8; j++) _mm512_storeu_si512((void *)(vb + 4 * P * j + 64 * g), wc[j]);
        }
#else
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < P; i++) memcpy(vb + 4 * P * j + 4 * i, tmp + 32 * i + 4 * j, 4);
#endif
    }
}

#if defined(HY_Q512) || (defined(HY_AVX2) && defined(__F16C__))
/* The K formats' values straight from the encoded rows of a whole panel: the raw bytes of P rows
 * are transposed (4 bytes of each row per vector lane, the panel's layout) and the nibble and
 * bit operations then run on all rows at once.  One transpose of 32 bytes of Q4_K nibbles serves
 * two blocks (low and high nibbles); Q6_K's three transposes serve four.  The bytes equal
 * hy_q_panel_block's. */
#if defined(HY_Q512)
typedef __m512i hy_pv;
#define HY_PV_ROWS 16  /* rows per transpose */
#define HY_PV_AND _mm512_and_si512
#define HY_PV_OR _mm512_or_si512
#define HY_PV_SRLI16 _mm512_srli_epi16
#define HY_PV_SLLI16 _mm512_slli_epi16
#define HY_PV_SET1 _mm512_set1_epi8
#define HY_PV_STORE(p, v) _mm512_storeu_si512((void *)(p), (v))
#define HY_PV_TRANSPOSE hy_transpose_16x8
#else
typedef __m256i hy_pv;
#define HY_PV_ROWS 8
#define HY_PV_AND _mm256_and_si256
#define HY_PV_OR _mm256_or_si256
#define HY_PV_SRLI16 _mm256_srli_epi16
#define HY_PV_SLLI16 _mm256_slli_epi16
#define HY_PV_SET1 _mm256_set1_epi8
#define HY_PV_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
/* The 32 bytes at src + i*stride for i < 8, as dwords: wc[c] lane i = dword c of row i */
static inline __attribute__((always_inline)) void hy_transpose_8x8(const uint8_t *src, long stride,
                                                                   __m256i wc[8]) {
    __m256i r[8], t[8], u[8];
    for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_si256((const __m256i *)(src + k * stride));
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int c = 0; c < 4; c++) {
        wc[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        wc[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}
#define HY_PV_TRANSPOSE hy_transpose_8x8
#endif

/* bit j of every byte of v, moved to bit 4 */
static inline __attribute__((always_inline)) hy_pv hy_pv_bit4(hy_pv v, int j) {
    return HY_PV_AND(HY_PV_SLLI16(HY_PV_SRLI16(v, j), 4), HY_PV_SET1(0x10));
}

#if defined(HY_Q512)
#define _hy_srai32 _mm512_srai_epi32
#define _hy_set1f _mm512_set1_ps
#else
#define _hy_srai32 _mm256_srai_epi32
#define _hy_set1f _mm256_set1_ps
/* the low 16 bits of 8 int32 lanes as 8 int16 (AVX2 has no vpmovdw) */
static inline __m128i _mm256_cvtepi32_epi16_compat(__m256i v) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i p = _mm256_shuffle_epi8(v, pick);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}
#endif

/* The factors and offsets of P = HY_GEMM_P whole rows of a Q4_K, Q5_K or Q6_K matrix, as
 * hy_q_panel_scales writes them row by row: each super-block's header words of HY_PV_ROWS rows
 * are gathered into the lanes of a vector, and the scales decoded for all of them at once. */
static inline void hy_q_panel_kquant_scales(int type, const uint8_t *w, long row_bytes, long n,
                                            float *cT, float *mT) {
    const int P = HY_GEMM_P, bb = hy_q_block_bytes(type);
#if defined(HY_Q512)
    typedef __m512i vi32;
    typedef __m512 vf32;
#define HY_GATHER(p) _mm512_i32gather_epi32(idx, (const void *)(p), 1)
#define HY_SRLI _mm512_srli_epi32
#define HY_SLLI _mm512_slli_epi32
#define HY_AND _mm512_and_si512
#define HY_OR _mm512_or_si512
#define HY_SET1 _mm512_set1_epi32
#define HY_CVT _mm512_cvtepi32_ps
#define HY_MUL _mm512_mul_ps
#define HY_STORE _mm512_storeu_ps
#define HY_F16LO(v) _mm512_cvtph_ps(_mm512_cvtepi32_epi16(HY_AND(v, HY_SET1(0xFFFF))))
    const vi32 idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32((int)row_bytes));
#else
    typedef __m256i vi32;
    typedef __m256 vf32;
#define HY_GATHER(p) _mm256_i32gather_epi32((const int *)(p), idx, 1)
#define HY_SRLI _mm256_srli_epi32
#define HY_SLLI _mm256_slli_epi32
#define HY_AND _mm256_and_si256
#define HY_OR _mm256_or_si256
#define HY_SET1 _mm256_set1_epi32
#define HY_CVT _mm256_cvtepi32_ps
#define HY_MUL _mm256_mul_ps
#define HY_STORE _mm256_storeu_ps
#define HY_F16LO(v) _mm256_cvtph_ps(_mm256_cvtepi32_epi16_compat(HY_AND(v, HY_SET1(0xFFFF))))
    const vi32 idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm256_set1_epi32((int)row_bytes));
#endif
#define HY_BYTE(v, k) HY_AND(HY_SRLI(v, 8 * (k)), HY_SET1(0xFF))
    for (long s = 0; s < n / 256; s++)
        for (int g = 0; g < P / HY_PV_ROWS; g++) {
            const uint8_t *blk = w + bb * s + HY_PV_ROWS * g * row_bytes;
            float *cs = cT + P * 16 * s + HY_PV_ROWS * g;
            if (type == HY_Q_Q6_K) {  /* c = d * sc per 16 (the offsets are integers) */
                const vf32 d = HY_F16LO(HY_GATHER(blk + 208));
                for (int k = 0; k < 4; k++) {
                    const vi32 sc4 = HY_GATHER(blk + 192 + 4 * k);
                    for (int t = 0; t < 4; t++)  /* the signed byte t of each lane */
                        HY_STORE(cs + P * (4 * k + t),
                                 HY_MUL(d, HY_CVT(_hy_srai32(HY_SLLI(sc4, 24 - 8 * t), 24))));
                }
                continue;
            }
            const vi32 hd = HY_GATHER(blk), s0 = HY_GATHER(blk + 4), s1 = HY_GATHER(blk + 8),
                       s2 = HY_GATHER(blk + 12);
            const vf32 d = HY_F16LO(hd), ndmin = HY_MUL(HY_F16LO(HY_SRLI(hd, 16)), _hy_set1f(-1.0f));
            float *ms = mT + P * 8 * s + HY_PV_ROWS * g;
            for (int j = 0; j < 4; j++) {  /* hy_k4_scale_min for sub-blocks j and j + 4 */
                const vi32 b0 = HY_BYTE(s0, j), b1 = HY_BYTE(s1, j), b2 = HY_BYTE(s2, j);
                HY_STORE(cs + P * 2 * j, HY_MUL(d, HY_CVT(HY_AND(b0, HY_SET1(63)))));
                HY_STORE(ms + P * j, HY_MUL(ndmin, HY_CVT(HY_AND(b1, HY_SET1(63)))));
                HY_STORE(cs + P * 2 * (j + 4), HY_MUL(d, HY_CVT(HY_OR(
                    HY_AND(b2, HY_SET1(0x0F)), HY_SLLI(HY_SRLI(b0, 6), 4)))));
                HY_STORE(ms + P * (j + 4), HY_MUL(ndmin, HY_CVT(HY_OR(
                    HY_SRLI(b2, 4), HY_SLLI(HY_SRLI(b1, 6), 4)))));
            }
        }
#undef HY_GATHER
#undef HY_SRLI
#undef HY_SLLI
#undef HY_AND
#undef HY_OR
#undef HY_SET1
#undef HY_CVT
#undef HY_MUL
#undef HY_STORE
#undef HY_F16LO
#undef HY_BYTE
}

/* the values of P = HY_GEMM_P whole rows of a Q4_K, Q5_K or Q6_K matrix into vi */
static inline void hy_q_panel_kquant(int type, const uint8_t *w, long row_bytes, long n,
                                     uint8_t *vi, const uint8_t *next, long next_bytes) {
    const int P = HY_GEMM_P, bb = hy_q_block_bytes(type);
    const hy_pv lo4 = HY_PV_SET1(0x0F), hi2 = HY_PV_SET1(0x30);
#define HY_OUT(b, g, c) (vi + 32 * P * (b) + 4 * P * (c) + 4 * HY_PV_ROWS * (g))
    for (long s = 0; s < n / 256; s++)
        for (int g = 0; g < P / HY_PV_ROWS; g++) {
            if (g == 0)
                hy_prefetch_part(next, next_bytes, s, n / 256);
            const uint8_t *blk = w + bb * s + HY_PV_ROWS * g * row_bytes;
            hy_pv qhT[8] = {0}, qT[8], q2T[8];
            if (type == HY_Q_Q6_K) {
                for (int half = 0; half < 2; half++) {
                    HY_PV_TRANSPOSE(blk + 64 * half, row_bytes, qT);
                    HY_PV_TRANSPOSE(blk + 64 * half + 32, row_bytes, q2T);
                    HY_PV_TRANSPOSE(blk + 128 + 32 * half, row_bytes, qhT);
                    const long b = 8 * s + 4 * half;
                    for (int c = 0; c < 8; c++) {
                        const hy_pv h = qhT[c];
                        HY_PV_STORE(HY_OUT(b, g, c), HY_PV_OR(HY_PV_AND(qT[c], lo4),
                                    HY_PV_AND(HY_PV_SLLI16(h, 4), hi2)));
                        HY_PV_STORE(HY_OUT(b + 1, g, c), HY_PV_OR(HY_PV_AND(q2T[c], lo4),
                                    HY_PV_AND(HY_PV_SLLI16(h, 2), hi2)));
                        HY_PV_STORE(HY_OUT(b + 2, g, c), HY_PV_OR(
                                    HY_PV_AND(HY_PV_SRLI16(qT[c], 4), lo4), HY_PV_AND(h, hi2)));
                        HY_PV_STORE(HY_OUT(b + 3, g, c), HY_PV_OR(
                                    HY_PV_AND(HY_PV_SRLI16(q2T[c], 4), lo4),
                                    HY_PV_AND(HY_PV_SRLI16(h, 2), hi2)));
                    }
                }
                continue;
            }
            const int five = type == HY_Q_Q5_K;
            if (five) HY_PV_TRANSPOSE(blk + 16, row_bytes, qhT);
            for (int jp = 0; jp < 4; jp++) {  /* sub-blocks 2jp (low nibbles), 2jp + 1 (high) */
                HY_PV_TRANSPOSE(blk + (five ? 48 : 16) + 32 * jp, row_bytes, qT);
                const long b = 8 * s + 2 * jp;
                for (int c = 0; c < 8; c++) {
                    hy_pv lo = HY_PV_AND(qT[c], lo4), hi = HY_PV_AND(HY_PV_SRLI16(qT[c], 4), lo4);
                    if (five) {
                        lo = HY_PV_OR(lo, hy_pv_bit4(qhT[c], 2 * jp));
                        hi = HY_PV_OR(hi, hy_pv_bit4(qhT[c], 2 * jp + 1));
                    }
                    HY_PV_STORE(HY_OUT(b, g, c), lo);
                    HY_PV_STORE(HY_OUT(b + 1, g, c), hi);
                }
            }
        }
#undef HY_OUT
}
#endif

/* The interleaved panel of np (<= P = HY_GEMM_P) encoded weight rows w (row_bytes apart; rows
 * past np zero) for the GEMM: vi[32*P*b + 4*P*j + 4*i ..] holds, for block b and chunk j
 * (values 4j..4j+3), the 4 values of row i; cT[P*h + i] is row i's factor for half block h,
 * mT[P*h + i] its offset (one per half for Q2_K, else one per block: mT[P*b + i]).  Each block
 * of the P rows is decoded into tmp (32*P bytes, in L1) and interleaved from there. */
static inline void hy_q_panel_build(int type, const uint8_t *w, long row_bytes, long n, int np,
                                    uint8_t *tmp, uint8_t *vi, float *cT, float *mT,
                                    const uint8_t *next, long next_bytes) {
    const int P = HY_GEMM_P;
    const long n16 = n / 16;
#if defined(HY_Q512) || (defined(HY_AVX2) && defined(__F16C__))
    if (np == P && (type == HY_Q_Q4_K || type == HY_Q_Q5_K || type == HY_Q_Q6_K)) {
        hy_q_panel_kquant(type, w, row_bytes, n, vi, next, next_bytes);  /* whole panels at once */
        hy_q_panel_kquant_scales(type, w, row_bytes, n, cT, mT);
        return;
    }
#endif
    memset(tmp, 0, (size_t)32 * P);
    if (np < P) {
        memset(cT, 0, sizeof(float) * P * n16);
        memset(mT, 0, sizeof(float) * P * n16);
    }
    for (int i = 0; i < np; i++)  /* factors and offsets straight into their columns */
        hy_q_panel_scales(type, w + i * row_bytes, n, cT + i, mT + i);
    switch (type) {  /* the format a constant in each loop */
#define HY_CASE(T) case T: hy_q_panel_interleave(T, w, row_bytes, n, np, tmp, vi, next, next_bytes); break;
    HY_CASE(HY_Q_Q8_0) HY_CASE(HY_Q_Q4_0) HY_CASE(HY_Q_Q4_1) HY_CASE(HY_Q_Q5_0) HY_CASE(HY_Q_Q5_1)
    HY_CASE(HY_Q_Q4_K) HY_CASE(HY_Q_Q5_K) HY_CASE(HY_Q_Q6_K)
#undef HY_CASE
    default: hy_q_panel_interleave(type, w, row_bytes, n, np, tmp, vi, next, next_bytes);
    }
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
/* the activations' scaled sum over half h of block b (s16 of hy_q_act) */
#define HY_S16(r, b, h) (da[(r) * nb + (b)] * (float)a16[(r) * 2 * nb + 2 * (b) + (h)])
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
            if (fmin && !per32) {  /* an offset per half block (Q2_K) */
                const __m512 mh0 = _mm512_loadu_ps(mT + 32 * (2 * b + h)), mh1 = _mm512_loadu_ps(mT + 32 * (2 * b + h) + 16);
                for (int r = 0; r < RB; r++) {
                    const __m512 sr = _mm512_set1_ps(HY_S16(r, b, h));
                    acc[r][0] = _mm512_fmadd_ps(mh0, sr, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(mh1, sr, acc[r][1]);
                }
            }
        }
        if (fmin && per32) {
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
                        s16[r] = hy_chain256(_mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wa, a)));
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
            if (fmin && !per32) {  /* an offset per half block (Q2_K) */
                const __m256 mh = _mm256_loadu_ps(mT + 8 * (2 * b + h));
                for (int r = 0; r < RB; r++)
                    acc[r] = _mm256_fmadd_ps(mh, _mm256_set1_ps(HY_S16(r, b, h)), acc[r]);
            }
        }
        if (fmin && per32) {
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
                    if (fmin && !per32) sum = fmaf(mT[P * (2 * b + h) + i], HY_S16(r, b, h), sum);
                }
                if (fmin && per32) sum = fmaf(mT[P * b + i], sa[r * nb + b], sum);
            }
            out[r * ldo + i] = sum;
        }
    }
#endif
#undef HY_IOFF
#undef HY_S16
}

/* hy_q_gemm_tile with the format's constants as compile-time constants.  Both are always
 * inlined: left to the compiler's inlining heuristics, the tile was emitted out of line in a few
 * generic copies where RB and the format flags were run-time values (register arrays on the
 * stack); always inlined, every (rows, format) case is its own specialised loop. */
static inline __attribute__((always_inline)) void hy_q_gemm_rows(const int RB, int type, long nb, const int8_t *qa,
                                  const float *da, const float *sa, const int32_t *a16,
                                  const uint8_t *vi, const float *cT, const float *mT, float *out,
                                  long ldo, int np) {
    const long n = 32 * nb;
#define HY_TILE(G, SGN, PER32, IOFF, FMIN) \
    hy_q_gemm_tile(RB, G, SGN, PER32, IOFF, FMIN, nb, qa, n, da, sa, a16, vi, cT, mT, out, ldo, np)
    switch (type) {
#if defined(HY_Q512)  /* panels hold w + 128: integer sums less 128 * sum(a), exactly sum(w * a) */
    case HY_Q_Q8_0: case HY_Q_IQ4_NL: case HY_Q_IQ4_XS: HY_TILE(1, 0, 1, 128, 0); break;
#else
    case HY_Q_Q8_0: case HY_Q_IQ4_NL: case HY_Q_IQ4_XS: HY_TILE(1, 1, 1, 0, 0); break;
#endif
    case HY_Q_Q2_K: HY_TILE(4, 0, 0, 0, 1); break;
    case HY_Q_Q3_K: HY_TILE(4, 0, 0, 4, 0); break;
    case HY_Q_Q4_0: HY_TILE(4, 0, 1, 8, 0); break;
    case HY_Q_Q5_0: HY_TILE(4, 0, 1, 16, 0); break;
    case HY_Q_Q6_K: HY_TILE(2, 0, 0, 32, 0); break;
    default: HY_TILE(4, 0, 1, 0, 1); break;  /* Q4_1, Q5_1, Q4_K, Q5_K */
    }
#undef HY_TILE
}

/* Every activation row against one panel of np (<= P) encoded weight rows w (row_bytes apart):
 * out[r*ldo + i].  qa, da, sa: the 8-bit activations, their scales and scaled block sums; a16:
 * their integer sums per 16 values.  tmp, vi, cT, mT: scratch (32*P bytes, P*n bytes and P*n/16
 * floats twice).  next, next_bytes: the encoded rows of the panel this thread is likely to take
 * next, prefetched into L2 while this panel is built, so that reading them from memory overlaps
 * this panel's work (NULL: none). */
static inline void hy_q_gemm_panel(int type, long rows, long n, const int8_t *qa, const float *da,
                                   const float *sa, const int32_t *a16, const uint8_t *w,
                                   long row_bytes, int np, uint8_t *tmp, uint8_t *vi, float *cT,
                                   float *mT, float *out, long ldo, const uint8_t *next,
                                   long next_bytes) {
    const long nb = n / 32;
    hy_q_panel_build(type, w, row_bytes, n, np, tmp, vi, cT, mT, next, next_bytes);
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
