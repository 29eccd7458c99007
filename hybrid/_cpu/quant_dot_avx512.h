/* The AVX-512 dot products: Q8_0 two blocks per vector, Q4_K / Q5_K and Q6_K for one or two
 * weight rows per pass (vpdpbusd), and F16 / BF16 for up to four weight rows per pass.
 * quant_dot.h chooses per format and build.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_DOT_AVX512_H
#define HYBRID_QUANT_DOT_AVX512_H

#if defined(HY_Q512)
/* The values of Q8_0 blocks b0 and b0 + 34 bytes side by side (the second zeros where `two` is
 * 0, an odd last block), with the software prefetch of the weight stream. */
static inline __attribute__((always_inline)) __m512i hy_q8_0_pair_512(const uint8_t *b0, int two) {
    HY_PREFETCH(b0);
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
    const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(b0 + 36)) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
}

/* Q8_0: all blocks of R activation rows into sum[r] (assigned); returns past the last block */
static inline __attribute__((always_inline)) long
hy_q8_0_blocks_512(const uint8_t *w, long nb, const int R, const int8_t *qa, const float *da,
                   float *sum) {
    const long n = 32 * nb;
    long b = 0;
    /* two blocks per 512-bit vector (an odd last block leaves the upper half zero); |w| times
     * a with w's sign */
    __m512 acc[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (; b < nb; b += 2) {
        const int two = b + 1 < nb;
        const uint8_t *b0 = w + 34 * b, *b1 = b0 + 34;
        const __m512i wv = hy_q8_0_pair_512(b0, two);
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
    return b;
}

/* Q8_0's prepared activations (hy_q_prep_acts): per pair of blocks, 64 bytes of values
 * a + 128 (unsigned), then 16 floats, da of the first block in lanes 0-7 and of the second in
 * lanes 8-15 (zeros past the last block). */
static inline long hy_q8_prep_bytes(long n) { return 128 * ((n / 32 + 1) / 2); }

static inline void hy_q8_prep(const int8_t *qa, const float *da, long nb, uint8_t *prep) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i half = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (long b = 0; b < nb; b += 2, prep += 128) {
        const int two = b + 1 < nb;
        const __m512i a = _mm512_maskz_loadu_epi8(two ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu, qa + 32 * b);
        _mm512_storeu_si512(prep, _mm512_maskz_xor_epi32(two ? (__mmask16)0xFFFF : (__mmask16)0xFF, a, flip));
        _mm512_storeu_ps(prep + 64, _mm512_permutexvar_ps(half, _mm512_castps128_ps512(
            _mm_maskz_loadu_ps(two ? 3 : 1, da + b))));
    }
}

/* Q8_0 against R (<= 8) prepared activation rows (hy_q8_prep, pstride bytes apart):
 * out[r*ldo].  The same bits as hy_q8_0_blocks_512 (then hy_dot_q8_0_rows): the same exact
 * integer sums per lane, here (a + 128) . w - 128 * (sum of w), the same factors d * da, the same
 * FMAs and final sum; but per activation row and pair of blocks only the vpdpbusd (activations
 * straight from memory), the factor product, the conversion and the FMA, with the weights' sign
 * work and sums done once for all rows. */
static inline __attribute__((always_inline)) void
hy_q8_0_rows_prep(const uint8_t *w, long nb, const int R, const uint8_t *prep, long pstride,
                  float *out, long ldo) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        const uint8_t *b0 = w + 34 * b, *b1 = b0 + 34;
        const __m512i wv = hy_q8_0_pair_512(b0, two);
        const __m512i nw = _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, wv));
        const __m512 dw = _mm512_mask_blend_ps((__mmask16)0xFF00, _mm512_set1_ps(hy_f16(b0)),
                                               _mm512_set1_ps(two ? hy_f16(b1) : 0.0f));
        const uint8_t *pp = prep + 64 * b;
        for (int r = 0; r < R; r++) {
            const uint8_t *pr = pp + r * pstride;
            const __m512i p = _mm512_dpbusd_epi32(nw, _mm512_loadu_si512((const void *)pr), wv);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                     _mm512_mul_ps(dw, _mm512_loadu_ps((const float *)(pr + 64))), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r * ldo] = _mm512_reduce_add_ps(acc[r]);
}

/* Whether the Q4_K / Q5_K two-row kernel prefetches into L2 rather than L1, for rows of n
 * values: where one activation row (n bytes and two floats per 32) and the 12 KiB prefetch
 * window pass 3/4 of the L1D, lines prefetched into L1 would be evicted before their use
 * (a 32 KiB L1D with wide rows such as a down projection's); narrower rows keep L1. */
static inline int hy_q_kquant_pf_l2(long n) {
    return n + n / 4 + HY_PREFETCH_AHEAD > hy_l1d_bytes() * 3 / 4;
}

/* the software prefetch of a Q4_K / Q5_K super-block's lines, into L2 or L1 (see
 * hy_q_kquant_pf_l2) */
static inline __attribute__((always_inline)) void hy_q45_k_prefetch(const uint8_t *p, int pf_l2) {
    if (pf_l2) {
        HY_PREFETCH_L2(p);
        HY_PREFETCH_L2(p + 64);
        HY_PREFETCH_L2(p + 128);
    } else {
        HY_PREFETCH(p);
        HY_PREFETCH(p + 64);
        HY_PREFETCH(p + 128);
    }
}

/* Step g (0 or 2) of the Q4_K / Q5_K super-block at blk: 64 nibble bytes as the values of
 * sub-blocks 2g and 2g+2 side by side (lo, low nibbles) and 2g+1 and 2g+3 (hi, high nibbles),
 * with Q5_K's fifth bits from hb (the block's 32 high-bit bytes in both halves). */
static inline __attribute__((always_inline)) void
hy_q45_k_step_512(const uint8_t *blk, __m512i hb, int g, int five, __m512i *lo, __m512i *hi) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    const __m512i raw = _mm512_loadu_si512((const void *)(blk + (five ? 48 : 16) + 32 * g));
    *lo = _mm512_and_si512(raw, low4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    if (five) {  /* bits 2g / 2g+1 (low half), 2g+2 / 2g+3 (high half) */
        const __m512i half16 = _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_setzero_si512(), _mm512_set1_epi16(2));
        const __m512i hs = _mm512_srlv_epi16(hb, _mm512_add_epi16(_mm512_set1_epi16((short)(2 * g)), half16));
        *lo = _mm512_or_si512(*lo, _mm512_slli_epi16(_mm512_and_si512(hs, one), 4));
        *hi = _mm512_or_si512(*hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hs, 1), one), 4));
    }
}

/* int16 lanes 0-15 holding element j0 and lanes 16-31 element j1 of a vector's 16-bit lanes:
 * the index vector of _mm512_permutexvar_epi16 that spreads two sub-blocks' scales over a step */
static inline __m512i hy_idx16_pair(int j0, int j1) {
    return _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_set1_epi32(j0 | (j0 << 16)),
                                   _mm512_set1_epi32(j1 | (j1 << 16)));
}

/* the most activation rows a K-format pass serves (more would spill the pass's registers) */
#define HY_K_MAX_R 6

/* Q4_K / Q5_K with 512-bit vectors: 64 nibble bytes (sub-blocks 2g..2g+3) per load, sub-blocks
 * 2g and 2g+2 (low nibbles) or 2g+1 and 2g+3 (high) side by side.  The activations carry one
 * scale per super-block (hy_q_act with groups of 256), so per 64 values and activation row the
 * integer work is vpmaddubsw (values times activations, pairs into int16) and vpdpwssd (times
 * the sub-block's 6-bit scale, into int32); per super-block one conversion and one FMA with
 * d * da, and the mins term dmin * min * sa as one 256-bit FMA.  W weight rows (row i at
 * w + i*wstep) times R activation rows (row r at qa + r*lda, da/sa + r*ldd), W <= 2,
 * W * R <= HY_K_MAX_R (W = 1 past four rows): the weights unpacked once for the R activation
 * rows, up to four rows' activations arranged once for the W weight rows, and each pair takes
 * exactly the operations of one weight row and one activation row (the same bits):
 * out[r*ldo + i]. */
static inline __attribute__((always_inline)) void
hy_dot_q45_k_512_rows(const uint8_t *w, long wstep, const int W, long nsb, const int R,
                      const int8_t *qa, long lda, const float *da, const float *sa, long ldd,
                      int five, int pf_l2, float *out, long ldo) {
    const int bb = five ? 176 : 144;
    const int split = W * R <= 4;  /* two integer chains per pair where registers allow */
    __m512 acc[HY_K_MAX_R];
    __m256 accm[HY_K_MAX_R];
    for (int i = 0; i < W * R; i++) acc[i] = _mm512_setzero_ps(), accm[i] = _mm256_setzero_ps();
    for (long s = 0; s < nsb; s++) {
        const long a0 = 8 * s;
        __m512i sc[2], hb[2];
        float dw[2];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + bb * s;
            /* the W rows' bytes are one span: prefetch it front to back, W blocks per step, so
             * memory sees one forward stream (not W streams, one ahead of each row's cursor) */
            hy_q45_k_prefetch(w + bb * (W * s + i), pf_l2);
            __m256 mnf;
            sc[i] = _mm512_castsi128_si512(hy_k4_unpack(blk, &mnf));
            const float dmin = hy_f16(blk + 2);
            dw[i] = hy_f16(blk);
            for (int r = 0; r < R; r++) hy_k4_mins(mnf, dmin, sa + r * ldd + a0, &accm[i * R + r]);
            hb[i] = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                         : _mm512_setzero_si512();
        }
        __m512i i0[HY_K_MAX_R], i1[HY_K_MAX_R];
        for (int k = 0; k < W * R; k++) i0[k] = i1[k] = _mm512_setzero_si512();
        for (int g = 0; g < 4; g += 2) {
            /* (up to four rows arranged once for the W weight rows; more, one at a time) */
            __m512i alo[HY_K_MAX_R], ahi[HY_K_MAX_R];
#define HY_LOADR(i) _mm256_loadu_si256((const __m256i *)(ar + 32 * (i)))
#define HY_ARRANGE(r, lo_, hi_) do {                                                             \
                const int8_t *ar = qa + (r) * lda;                                               \
                lo_ = _mm512_inserti64x4(_mm512_castsi256_si512(HY_LOADR(a0 + 2 * g)), HY_LOADR(a0 + 2 * g + 2), 1); \
                hi_ = _mm512_inserti64x4(_mm512_castsi256_si512(HY_LOADR(a0 + 2 * g + 1)), HY_LOADR(a0 + 2 * g + 3), 1); \
            } while (0)
            if (R <= 4)
                for (int r = 0; r < R; r++) HY_ARRANGE(r, alo[r], ahi[r]);
            for (int i = 0; i < W; i++) {
                __m512i lo, hi;
                hy_q45_k_step_512(w + i * wstep + bb * s, hb[i], g, five, &lo, &hi);
                const __m512i s0 = _mm512_permutexvar_epi16(hy_idx16_pair(2 * g, 2 * g + 2), sc[i]);
                const __m512i s1 = _mm512_permutexvar_epi16(hy_idx16_pair(2 * g + 1, 2 * g + 3), sc[i]);
                for (int r = 0; r < R; r++) {
                    const int k = i * R + r;
                    __m512i al, ah;
                    if (R <= 4) al = alo[r], ah = ahi[r];
                    else HY_ARRANGE(r, al, ah);
                    /* (exact integers: one chain or two give the same sums) */
                    if (split) {
                        i0[k] = _mm512_dpwssd_epi32(i0[k], _mm512_maddubs_epi16(lo, al), s0);
                        i1[k] = _mm512_dpwssd_epi32(i1[k], _mm512_maddubs_epi16(hi, ah), s1);
                    } else {
                        i0[k] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(i0[k], _mm512_maddubs_epi16(lo, al), s0),
                                                    _mm512_maddubs_epi16(hi, ah), s1);
                    }
                }
            }
#undef HY_ARRANGE
#undef HY_LOADR
        }
        for (int i = 0; i < W; i++)
            for (int r = 0; r < R; r++) {
                const int k = i * R + r;
                const __m512i isum = split ? _mm512_add_epi32(i0[k], i1[k]) : i0[k];
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                         _mm512_set1_ps(dw[i] * da[r * ldd + a0]), acc[k]);
            }
    }
    for (int i = 0; i < W; i++)
        for (int r = 0; r < R; r++)
            out[r * ldo + i] = _mm512_reduce_add_ps(acc[i * R + r]) - hy_hsum256(accm[i * R + r]);
}

HY_UNUSED static float hy_dot_q45_k_512(const uint8_t *w, long nsb, const int8_t *qa,
                                        const float *da, const float *sa, int five) {
    float out;
    hy_dot_q45_k_512_rows(w, 0, 1, nsb, 1, qa, 0, da, sa, 0, five, 0, &out, 0);
    return out;
}

/* One Q6_K super-block: returns d * scale of its 16 groups (exact: an 8-bit integer times a
 * float16), sets *sc to the 16 scales as int16 and v[k] to the values (0..63) of step k, the two
 * 128-value halves side by side (half n: ql at 64n, qh at 128 + 32n), as hy_dot_q6_k_512_rows
 * multiplies them. */
static inline __attribute__((always_inline)) __m512 hy_q6_k_unpack_512(const uint8_t *blk, __m512i v[4],
                                                                      __m512i *sc) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i l0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)blk)),
                                          _mm256_loadu_si256((const __m256i *)(blk + 64)), 1);
    const __m512i l1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 32))),
                                          _mm256_loadu_si256((const __m256i *)(blk + 96)), 1);
    const __m512i h = _mm512_loadu_si512((const void *)(blk + 128));
    v[0] = _mm512_or_si512(_mm512_and_si512(l0, low4),
                           _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x03)), 4));
    v[1] = _mm512_or_si512(_mm512_and_si512(l1, low4),
                           _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x0C)), 2));
    v[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low4),
                           _mm512_and_si512(h, _mm512_set1_epi8(0x30)));
    v[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low4),
                           _mm512_srli_epi16(_mm512_and_si512(h, _mm512_set1_epi8((char)0xC0)), 2));
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
    *sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)), _mm512_set1_ps(hy_f16(blk + 208)));
}

/* the int16 index vector of Q6_K step k's scales (lanes: groups 2k, 2k+1 of half 0, then
 * 8+2k, 9+2k of half 1, 8 int16 lanes each) */
static inline __m512i hy_q6_k_idx16(int k) {
#define HY_P(j) ((j) | ((j) << 16))
    return _mm512_set_epi32(HY_P(9 + 2 * k), HY_P(9 + 2 * k), HY_P(9 + 2 * k), HY_P(9 + 2 * k),
                            HY_P(8 + 2 * k), HY_P(8 + 2 * k), HY_P(8 + 2 * k), HY_P(8 + 2 * k),
                            HY_P(1 + 2 * k), HY_P(1 + 2 * k), HY_P(1 + 2 * k), HY_P(1 + 2 * k),
                            HY_P(2 * k), HY_P(2 * k), HY_P(2 * k), HY_P(2 * k));
#undef HY_P
}

/* Q6_K with 512-bit vectors: values n (0..63) with a signed 8-bit scale per 16 and one float16
 * d per 256, the two 128-value halves of a super-block side by side (half n in 256-bit lane n),
 * so each step serves 64 values.  The activations carry one scale per super-block, so per step
 * and activation row the integer work is vpmaddubsw (unsigned n times activations) and vpdpwssd
 * (times the group's scale, into int32); per super-block one conversion and one FMA with d * da.
 * The -32 offsets: sum = d * sum_g sc_g * (sum n*qa*da - 32 * s16_g), where s16_g = da * (sum of
 * qa over the 16 values of g), one vector FMA per super-block.
 * W weight rows times R activation rows, W <= 2, W * R <= HY_K_MAX_R, share a pass as in
 * hy_dot_q45_k_512_rows (each pair the same operations, the same bits): out[r*ldo + i]. */
static inline __attribute__((always_inline)) void
hy_dot_q6_k_512_rows(const uint8_t *w, long wstep, const int W, long nsb, const int R,
                     const int8_t *qa, long lda, const float *da, const float *s16, long ldd,
                     float *out, long ldo) {
    const int split = W * R <= 4;  /* two integer chains per pair where registers allow */
    __m512 acc[HY_K_MAX_R], acco[HY_K_MAX_R];  /* [i * R + r] */
    for (int i = 0; i < W * R; i++) acc[i] = acco[i] = _mm512_setzero_ps();
    for (long s = 0; s < nsb; s++) {
        __m512i v[2][4], sc[2];
        float dw[2];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + 210 * s;
            const uint8_t *pf = w + 210 * (W * s + i);  /* one forward stream, as for Q4_K */
            HY_PREFETCH_L2(pf);
            HY_PREFETCH_L2(pf + 64);
            HY_PREFETCH_L2(pf + 128);
            HY_PREFETCH_L2(pf + 192);
            const __m512 scf = hy_q6_k_unpack_512(blk, v[i], &sc[i]);
            dw[i] = hy_f16(blk + 208);
            for (int r = 0; r < R; r++)
                acco[i * R + r] = _mm512_fmadd_ps(scf, _mm512_loadu_ps(s16 + 2 * r * ldd + 16 * s), acco[i * R + r]);
        }
        __m512i is[HY_K_MAX_R][2];
        for (int k = 0; k < W * R; k++) is[k][0] = is[k][1] = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            /* (up to four rows loaded once for the W weight rows; more, one at a time) */
            __m512i av[HY_K_MAX_R];
#define HY_Q6_ACTS(r) _mm512_inserti64x4(                                                         \
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qa + (r) * lda + 256 * s + 32 * k))), \
                _mm256_loadu_si256((const __m256i *)(qa + (r) * lda + 256 * s + 128 + 32 * k)), 1)
            if (R <= 4)
                for (int r = 0; r < R; r++) av[r] = HY_Q6_ACTS(r);
            for (int i = 0; i < W; i++) {
                const __m512i sck = _mm512_permutexvar_epi16(hy_q6_k_idx16(k), sc[i]);
                for (int r = 0; r < R; r++) {
                    const __m512i a = R <= 4 ? av[r] : HY_Q6_ACTS(r);
                    /* (exact integers: one chain or two give the same sums) */
                    const int c = split ? (k & 1) : 0;
                    is[i * R + r][c] = _mm512_dpwssd_epi32(is[i * R + r][c], _mm512_maddubs_epi16(v[i][k], a), sck);
                }
            }
#undef HY_Q6_ACTS
        }
        for (int i = 0; i < W; i++)
            for (int r = 0; r < R; r++) {
                const int j = i * R + r;
                const __m512i isum = split ? _mm512_add_epi32(is[j][0], is[j][1]) : is[j][0];
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                         _mm512_set1_ps(dw[i] * da[r * ldd + 8 * s]), acc[j]);
            }
    }
    for (int i = 0; i < W; i++)
        for (int r = 0; r < R; r++) {
            const int j = i * R + r;
            out[r * ldo + i] = _mm512_reduce_add_ps(acc[j]) - 32.0f * _mm512_reduce_add_ps(acco[j]);
        }
}

HY_UNUSED static float hy_dot_q6_k_512(const uint8_t *w, long nsb, const int8_t *qa,
                                       const float *da, const float *s16) {
    float out;
    hy_dot_q6_k_512_rows(w, 0, 1, nsb, 1, qa, 0, da, s16, 0, &out, 0);
    return out;
}
#endif

#if defined(HY_AVX2) && defined(__AVX512F__)
#define HY_HALF512 1
/* W (1..4) F16 / BF16 / F32 weight rows (row i at w + i*row_bytes) times R float32 activation
 * rows (row r at x + r*xstride), W*R <= 12: out[r*ostride + i].  32 values per step in two
 * 512-bit halves, each pair of rows with two accumulators; every weight vector is loaded (and
 * widened) once for the R rows and every activation vector once for the W rows.  The last
 * partial step reads masked (zeros past n).  A pair of rows takes exactly the same operations
 * whatever W and R are (the same bits).  Where pf is set each weight row prefetches, into L2,
 * the line at the same place in the row four rows on; a caller clears it on a second pass over
 * the same rows.  (bench_quant's float16 and float32 mat-vec rows measure it.) */
#define HY_HALF_MAX_RW 12

/* 16 values of a row of `kind` at element i, lanes past mask m zero */
static inline __attribute__((always_inline)) __m512 hy_float16_at(const uint8_t *row, long i,
                                                                   __mmask16 m, const int kind) {
    if (kind == HY_HALF_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    const __m256i u = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    if (kind == HY_HALF_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(u), 16));
    return _mm512_cvtph_ps(u);
}

static inline __attribute__((always_inline)) void
hy_half_rows(const uint8_t *w, long row_bytes, const int W, long n, const float *x, long xstride,
             const int R, const int kind, const int pf, float *out, long ostride) {
    __m512 a0[HY_HALF_MAX_RW], a1[HY_HALF_MAX_RW];  /* [r * W + i] */
    const int esz = kind == HY_HALF_F32 ? 4 : 2;
    for (int j = 0; j < W * R; j++) a0[j] = a1[j] = _mm512_setzero_ps();
    for (long k = 0; k < n; k += 32) {
        const long left = n - k;
        const __mmask16 m0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        const __mmask16 m1 = left >= 32 ? (__mmask16)0xFFFF
                                        : (left <= 16 ? (__mmask16)0 : (__mmask16)((1u << (left - 16)) - 1u));
        __m512 w0[4], w1[4];
        for (int i = 0; i < W; i++) {
            const uint8_t *row = w + i * row_bytes;
            if (pf) {  /* the line(s) four rows on */
                _mm_prefetch((const char *)row + k * esz + 4 * row_bytes, _MM_HINT_T1);
                if (esz == 4) _mm_prefetch((const char *)row + k * esz + 64 + 4 * row_bytes, _MM_HINT_T1);
            }
            w0[i] = hy_float16_at(row, k, m0, kind);
            w1[i] = hy_float16_at(row, k + 16, m1, kind);
        }
        for (int r = 0; r < R; r++) {
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + r * xstride + k);
            const __m512 x1 = _mm512_maskz_loadu_ps(m1, x + r * xstride + k + 16);
            for (int i = 0; i < W; i++) {
                a0[r * W + i] = _mm512_fmadd_ps(w0[i], x0, a0[r * W + i]);
                a1[r * W + i] = _mm512_fmadd_ps(w1[i], x1, a1[r * W + i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < W; i++)
            out[r * ostride + i] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r * W + i], a1[r * W + i]));
}
#endif


#if defined(HY_Q512)
/* The low-bit formats with 512-bit vectors: two 32-value blocks per vector.  Lane i (128 bits)
 * of a 2-block vector holds half i of the pair: 16 values with one scale (Q2_K, Q3_K). */

/* 16 int32 lanes: the first 8 take lane a of v (8 floats), the last 8 lane b */
static inline __m512 hy_pair_factor(__m256 v, int a, int b) {
    const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)),
                                           _mm256_set1_epi32(b), 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v));
}

/* Q2_K (three = 0) / Q3_K (three = 1), one activation row: two blocks per vector (vpdpbusd), a
 * float factor per 16 values (d * scale * da, one permute per pair of blocks);
 * Q2_K's mins term dmin * sum_16 min * s16 and Q3_K's centre term 4 * d * sum_16 scale * s16 are
 * one FMA per super-block. */
static inline __attribute__((always_inline)) float
hy_dot_q23_k_512(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                 const float *s16, const int three) {
    const int bb = three ? 110 : 84;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, acco = _mm512_setzero_ps();
    const __m512i m3 = _mm512_set1_epi8(3), b2 = _mm512_set1_epi8(4);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (long s = 0; s < nsb; s++) {
        const __m512 da2 = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(da + 8 * s)));
        const __m512 s16v = _mm512_loadu_ps(s16 + 16 * s);
        const int8_t *a = qa + 256 * s;
        {
            const uint8_t *blk = w + bb * s;
            HY_PREFETCH(blk);
            HY_PREFETCH(blk + 64);
            __m512 f;
            if (three) {
                const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hy_q3_k_scales_vec(blk + 96)));
                const __m512 dsc = _mm512_mul_ps(scf, _mm512_set1_ps(hy_f16(blk + 108)));
                acco = _mm512_fmadd_ps(dsc, s16v, acco);
                f = _mm512_mul_ps(dsc, da2);
            } else {
                const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
                const __m512 mnf = _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4));
                acco = _mm512_fmadd_ps(_mm512_mul_ps(mnf, _mm512_set1_ps(hy_f16(blk + 82))), s16v, acco);
                f = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(0x0F))),
                                                _mm512_set1_ps(hy_f16(blk + 80))), da2);
            }
            const uint8_t *q = three ? blk + 32 : blk + 16;
            __m512i hm2 = _mm512_setzero_si512();
            if (three) {
                const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
                hm2 = _mm512_inserti64x4(_mm512_castsi256_si512(hm), hm, 1);
            }
            for (int h = 0; h < 2; h++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * h));
                const __m512i r2 = _mm512_inserti64x4(_mm512_castsi256_si512(raw), raw, 1);
                for (int j = 0; j < 4; j += 2) {
                    const int k = 4 * h + j;
                    const __m512i sh = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * j))),
                                                          _mm256_set1_epi16((short)(2 * j + 2)), 1);
                    __m512i u;
                    if (three) {
                        /* bit k (k + 1 in the upper half) of each hmask byte to bit 2 */
                        __m512i high;
                        if (k == 0)
                            high = _mm512_sllv_epi16(hm2, _mm512_inserti64x4(_mm512_castsi256_si512(
                                _mm256_set1_epi16(2)), _mm256_set1_epi16(1), 1));
                        else
                            high = _mm512_srlv_epi16(hm2, _mm512_inserti64x4(_mm512_castsi256_si512(
                                _mm256_set1_epi16((short)(k - 2))), _mm256_set1_epi16((short)(k - 1)), 1));
                        /* (q2 & 3) | (high & 4) */
                        u = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(r2, sh), _mm512_and_si512(high, b2), m3, 0xEC);
                    } else {
                        u = _mm512_and_si512(_mm512_srlv_epi16(r2, sh), m3);
                    }
                    /* lane l of the pair's sums is half 2k + l/4 */
                    const __m512i half = _mm512_add_epi32(_mm512_set1_epi32(2 * k), _mm512_srli_epi32(
                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
                    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                                          _mm512_loadu_si512((const void *)(a + 32 * k)));
                    acc[j / 2] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(half, f), acc[j / 2]);
                }
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) -
           (three ? 4.0f : 1.0f) * _mm512_reduce_add_ps(acco);
}

HY_UNUSED static float hy_dot_q2_k_512(const uint8_t *w, long nsb, const int8_t *qa,
                                       const float *da, const float *s16) {
    return hy_dot_q23_k_512(w, nsb, qa, da, s16, 0);
}

HY_UNUSED static float hy_dot_q3_k_512(const uint8_t *w, long nsb, const int8_t *qa,
                                       const float *da, const float *s16) {
    return hy_dot_q23_k_512(w, nsb, qa, da, s16, 1);
}

/* IQ4 grid values + 128 (unsigned) of 32 index bytes r (two arrays of 16): by 128-bit lane
 * [lo(r0), hi(r0), lo(r1), hi(r1)] */
static inline __m512i hy_iq4_lookup_pair(__m256i r) {
    const __m512i grid = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)hy_iq4_values), _mm_set1_epi8((char)0x80)));
    const __m512i z = _mm512_castsi256_si512(r);
    const __m512i v = _mm512_srlv_epi16(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 1, 0, 0)),
                                        _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL,
                                                          0, 0, 0x0004000400040004LL, 0x0004000400040004LL));
    return _mm512_shuffle_epi8(grid, _mm512_and_si512(v, _mm512_set1_epi8(0x0F)));
}

/* grid values u - 128 times signed activations a: 16 int32 sums of 4, exact (u a - 128 a) */
static inline __m512i hy_dot_iq4_512(__m512i u, const int8_t *qa) {
    const __m512i a = _mm512_loadu_si512((const void *)qa);
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), a));
}

/* IQ4_NL, one activation row: two blocks per vector; the portable loop takes an odd last one */
HY_UNUSED static float hy_dot_iq4_nl_512(const uint8_t *w, long nb, const int8_t *qa,
                                         const float *da) {
    __m512 acc = _mm512_setzero_ps();
    long b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *b0 = w + 18 * b, *b1 = b0 + 18;
        HY_PREFETCH(b0);
        const __m256i r = _mm256_inserti128_si256(_mm256_castsi128_si256(
            _mm_loadu_si128((const __m128i *)(b0 + 2))), _mm_loadu_si128((const __m128i *)(b1 + 2)), 1);
        const __m512i p = hy_dot_iq4_512(hy_iq4_lookup_pair(r), qa + 32 * b);
        const __m512 f = _mm512_mask_blend_ps((__mmask16)0xFF00, _mm512_set1_ps(hy_f16(b0) * da[b]),
                                              _mm512_set1_ps(hy_f16(b1) * da[b + 1]));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), f, acc);
    }
    return _mm512_reduce_add_ps(acc) + hy_dot_iq4_nl_portable(w + 18 * b, nb - b, qa + 32 * b, da + b);
}

/* IQ4_XS, one activation row: two sub-blocks per vector */
HY_UNUSED static float hy_dot_iq4_xs_512(const uint8_t *w, long nsb, const int8_t *qa,
                                         const float *da) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 136 * s;
        HY_PREFETCH(blk);
        HY_PREFETCH(blk + 64);
        HY_PREFETCH(blk + 128);
        const __m256 cf = hy_iq4_xs_factors(blk, da + 8 * s);
        for (int j = 0; j < 8; j += 2) {
            const __m512i p = hy_dot_iq4_512(hy_iq4_lookup_pair(_mm256_loadu_si256((const __m256i *)(blk + 8 + 16 * j))),
                                             qa + 32 * (8 * s + j));
            acc[j / 2 & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), hy_pair_factor(cf, j, j + 1), acc[j / 2 & 1]);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}
#endif

#endif
