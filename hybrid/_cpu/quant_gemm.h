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

/* the 32 grid values of 16 IQ4 index bytes as a panel's signed values (+128 where the GEMM
 * takes unsigned bytes, as for Q8_0) */
static inline void hy_q_panel_signed(const uint8_t *q, uint8_t *vb) {
    for (int j = 0; j < 16; j++) {
        vb[j] = (uint8_t)hy_iq4_values[q[j] & 0x0F];
        vb[j + 16] = (uint8_t)hy_iq4_values[q[j] >> 4];
    }
#if defined(HY_Q512)
    for (int j = 0; j < 32; j++) vb[j] ^= 0x80;
#endif
}

/* one weight row -> v [n] (uint8, or int8 for Q8_0, IQ4_NL, IQ4_XS), c [n/16], m [n/16] */
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
    if (type == HY_Q_IQ4_NL) {
        for (long b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + 18 * b;
            hy_q_panel_signed(blk + 2, v + 32 * b);
            c[2 * b] = c[2 * b + 1] = hy_f16(blk);
            m[2 * b] = m[2 * b + 1] = 0.0f;
        }
        return;
    }
    for (long s = 0; s < n / 256; s++) {
        const uint8_t *blk = row + bb * s;
        uint8_t *vs = v + 256 * s;
        float *cs = c + 16 * s, *ms = m + 16 * s;
        if (type == HY_Q_Q2_K) {  /* v: 2-bit values; c, m per 16: d * scale, -dmin * min */
            const float d = hy_f16(blk + 80), dmin = hy_f16(blk + 82);
            for (int k = 0; k < 8; k++)
                for (int l = 0; l < 32; l++)
                    vs[32 * k + l] = (uint8_t)((blk[16 + 32 * (k / 4) + l] >> (2 * (k % 4))) & 3);
            for (int g = 0; g < 16; g++) {
                cs[g] = d * (float)(blk[g] & 0x0F);
                ms[g] = -dmin * (float)(blk[g] >> 4);
            }
        } else if (type == HY_Q_Q3_K) {  /* v: q | high << 2 (0..7); value c * (v - 4) */
            int8_t sc[16];
            hy_q3_k_scales(blk + 96, sc);
            const float d = hy_f16(blk + 108);
            for (int k = 0; k < 8; k++)
                for (int l = 0; l < 32; l++)
                    vs[32 * k + l] = (uint8_t)(((blk[32 + 32 * (k / 4) + l] >> (2 * (k % 4))) & 3) |
                                               (((blk[l] >> k) & 1) << 2));
            for (int g = 0; g < 16; g++) {
                cs[g] = d * (float)sc[g];
                ms[g] = -4.0f * cs[g];
            }
        } else if (type == HY_Q_IQ4_XS) {  /* v: the grid's signed values; c per 32 */
            const float d = hy_f16(blk);
            for (int j = 0; j < 8; j++) {
                hy_q_panel_signed(blk + 8 + 16 * j, vs + 32 * j);
                cs[2 * j] = cs[2 * j + 1] = d * (float)hy_iq4_xs_scale(blk, j);
                ms[2 * j] = ms[2 * j + 1] = 0.0f;
            }
        } else if (type == HY_Q_Q6_K) {
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
    case HY_Q_Q8_0: case HY_Q_IQ4_NL: case HY_Q_IQ4_XS: return 1;
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
    if (type == HY_Q_Q2_K)  /* float offsets, one per half block */
        for (long h = 0; h < n / 16; h++)
            for (int i = 0; i < P; i++) mT[P * h + i] = m[i * (n / 16) + h];
    else  /* one per block (m holds two equal per block) */
        for (long b = 0; b < nb; b++)
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
