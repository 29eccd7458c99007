/* The AVX2 dot products (256-bit; vpdpbusd where the build has AVX-512 VNNI or AVX-VNNI): the
 * integer helpers, each format's vector loop, and the Q4_K / Q5_K factor helper the AVX-512
 * kernels share.  quant_dot.h chooses per format and build.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_DOT_AVX2_H
#define HYBRID_QUANT_DOT_AVX2_H

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
 * (shorter distances leave one stream below the memory's rate; prefetches past a matrix's end
 * are harmless) */
#define HY_PREFETCH_AHEAD 12288
/* Intel cores (read once at run time) take that prefetch into L2 and a second one into L1 this
 * near: on a Xeon a Q4_K stream from memory read 8.6 GB/s a core with the far one into L1 alone
 * and 10.2-10.9 with both (a plain reader 16); AMD cores keep the far one into L1 */
#define HY_PREFETCH_NEAR 1024
static int hy_q_pf_near_ = -1;
static inline int hy_q_pf_near(void) {
    if (hy_q_pf_near_ < 0) hy_q_pf_near_ = hy_cpu_is_intel();
    return hy_q_pf_near_;
}
#define HY_PREFETCH(p)                                                                           \
    (hy_q_pf_near() ? (_mm_prefetch((const char *)(p) + HY_PREFETCH_NEAR, _MM_HINT_T0),         \
                       _mm_prefetch((const char *)(p) + HY_PREFETCH_AHEAD, _MM_HINT_T1))        \
                    : _mm_prefetch((const char *)(p) + HY_PREFETCH_AHEAD, _MM_HINT_T0))
/* the same into L2 only, for kernels whose working set leaves L1 too little room for the
 * prefetched lines (the K formats' kernels, 256- and 512-bit; Q8_0's single-row kernel is
 * slower so) */
#define HY_PREFETCH_L2(p) _mm_prefetch((const char *)(p) + HY_PREFETCH_AHEAD, _MM_HINT_T1)
#define HY_LOADA(i) _mm256_loadu_si256((const __m256i *)(qa + 32 * (i)))

/* Q8_0: one group of t (1..4) blocks from b0 of R activation rows (block k of row r at
 * a + r*n + 32*k, its da at dar + r*nb + k) into acc[r].  Per block and row the integer products
 * (sign trick, maddubs, madd) give 8 int32 partial sums; unpacks and adds fold four blocks'
 * partials into one vector (block k in lanes k and 4+k), so the conversion, the factor product
 * and the FMA run once per four blocks instead of once per block.  Blocks past t count as zero
 * (nothing past them is read). */
static inline __attribute__((always_inline)) void
hy_q8_0_group_avx2(const uint8_t *b0, const long t, const int R, const int8_t *a, long n,
                   const float *dar, long nb, __m256 *acc) {
    HY_PREFETCH(b0);
    HY_PREFETCH(b0 + 64);
    HY_PREFETCH(b0 + 128);
    __m256i wv[4], wa[4];
    for (int k = 0; k < 4; k++) {
        wv[k] = k < t ? _mm256_loadu_si256((const __m256i *)(b0 + 34 * k + 2)) : _mm256_setzero_si256();
        wa[k] = _mm256_abs_epi8(wv[k]);
    }
    /* the four blocks' d in lanes k and 4+k: their float16 bits packed in a general register
     * (integer work, beside the vector pipes), then one conversion */
    uint64_t h4 = hy_u16(b0);
    if (t > 1) h4 |= (uint64_t)hy_u16(b0 + 34) << 16;
    if (t > 2) h4 |= (uint64_t)hy_u16(b0 + 68) << 32;
    if (t > 3) h4 |= (uint64_t)hy_u16(b0 + 102) << 48;
    const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h4));
    const __m256 dw = _mm256_set_m128(d4, d4);
    const __m128i live = _mm_cmpgt_epi32(_mm_set1_epi32((int)t), _mm_setr_epi32(0, 1, 2, 3));
    for (int r = 0; r < R; r++) {
        __m256i m[4];
        for (int k = 0; k < 4; k++)
            m[k] = k < t ? hy_dot_u8s8(wa[k], _mm256_sign_epi8(
                               _mm256_loadu_si256((const __m256i *)(a + r * n + 32 * k)), wv[k]))
                         : _mm256_setzero_si256();
        /* (exact integers: the same sums as three hadds, in fewer micro-ops) */
        const __m256i m01 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[0], m[1]),
                                             _mm256_unpackhi_epi32(m[0], m[1]));
        const __m256i m23 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[2], m[3]),
                                             _mm256_unpackhi_epi32(m[2], m[3]));
        const __m256i h = _mm256_add_epi32(_mm256_unpacklo_epi64(m01, m23),
                                           _mm256_unpackhi_epi64(m01, m23));
        const __m128 da4 = t == 4 ? _mm_loadu_ps(dar + r * nb) : _mm_maskload_ps(dar + r * nb, live);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(dw, _mm256_set_m128(da4, da4)),
                                 acc[r]);
    }
}

/* Q8_0: all blocks of R activation rows into sum[r] (assigned), four at a time
 * (hy_q8_0_group_avx2), the last group holding the 1-3 blocks left; returns past the last
 * block. */
static inline __attribute__((always_inline)) long
hy_q8_0_blocks_avx2(const uint8_t *w, long nb, const int R, const int8_t *qa, const float *da,
                    float *sum) {
    const long n = 32 * nb;
    long b = 0;
    __m256 acc[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (; b + 4 <= nb; b += 4) hy_q8_0_group_avx2(w + 34 * b, 4, R, qa + 32 * b, n, da + b, nb, acc);
    if (b < nb) hy_q8_0_group_avx2(w + 34 * b, nb - b, R, qa + 32 * b, n, da + b, nb, acc);
    for (int r = 0; r < R; r++) sum[r] = hy_hsum256(acc[r]);
    return nb;
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1: the whole pairs of blocks of R activation rows, the integer products
 * into sum[r] (assigned) and the offsets added to msum[r]; returns the first block left.
 * 256-bit in every SIMD build: a 512-bit two-block version is slower. */
static inline __attribute__((always_inline)) long
hy_q4q5_blocks_avx2(const uint8_t *w, long nb, const int R, const int8_t *qa, const float *da,
                    const float *sa, int five, int with_min, float *sum, float *msum) {
    const long n = 32 * nb;
    const hy_q45_layout lay = hy_q45_layout_of(five, with_min);
    const int hoff = lay.hoff, qoff = lay.qoff, bb = lay.bb;
    const float centre = lay.centre;
    long b = 0;
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
    return b;
}

/* Q4_K / Q5_K: nsb super-blocks of 256; activation block 8*s+j is sub-block j of super-block s.
 * The activations carry one scale per super-block (hy_q_act with groups of 256), so the
 * sub-blocks' 6-bit scales stay integers: per 32 values and activation row maddubs, madd with
 * the scale and an integer add; per super-block one conversion and one FMA with d * da.  The
 * mins term dmin * sum_j m_j*sa_j is one FMA per super-block. */
static inline void hy_k4_scales_u32(const uint8_t *s, uint32_t *sc_lo, uint32_t *sc_hi,
                                    uint32_t *mn_lo, uint32_t *mn_hi) {
    uint32_t a = hy_u32(s), b = hy_u32(s + 4), c = hy_u32(s + 8);
    *sc_lo = a & 0x3f3f3f3fu;
    *mn_lo = b & 0x3f3f3f3fu;
    *sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    *mn_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
}

/* the 8 six-bit values of two words from hy_k4_scales_u32 as int16 (scales) or floats (mins) */
static inline __m128i hy_k4_i16(uint32_t lo, uint32_t hi) {
    return _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)hi, (int)lo));
}
static inline __m256 hy_k4_f32(uint32_t lo, uint32_t hi) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)hi, (int)lo)));
}

/* a super-block's 8 scales as int16 (returned) and 8 mins as floats (mnf) */
static inline __m128i hy_k4_unpack(const uint8_t *blk, __m256 *mnf) {
    uint32_t sc_lo, sc_hi, mn_lo, mn_hi;
    hy_k4_scales_u32(blk + 4, &sc_lo, &sc_hi, &mn_lo, &mn_hi);
    *mnf = hy_k4_f32(mn_lo, mn_hi);
    return hy_k4_i16(sc_lo, sc_hi);
}

/* the mins term of one activation row: *accm += dmin * mnf * sa (one FMA per super-block) */
static inline void hy_k4_mins(__m256 mnf, float dmin, const float *sa, __m256 *accm) {
    *accm = _mm256_fmadd_ps(_mm256_mul_ps(mnf, _mm256_loadu_ps(sa)), _mm256_set1_ps(dmin), *accm);
}

/* acc + the int16 pairs of p16 times the int16 scales sc, summed in pairs into int32 (vpdpwssd
 * where the build has VNNI, else madd and add: the same integers) */
static inline __m256i hy_madd_acc(__m256i acc, __m256i p16, __m256i sc) {
#if defined(HY_DPWSSD)
    return HY_DPWSSD(acc, p16, sc);
#else
    return hy_chain256(_mm256_add_epi32(acc, _mm256_madd_epi16(p16, sc)));
#endif
}

/* int16 element j of each 128-bit lane of v in every int16 of that lane */
static inline __m256i hy_bcast16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
}

/* Q4_K / Q5_K, W weight rows (row i at w + i*wstep) times R activation rows (row r at qa + r*lda,
 * da/sa + r*ldd), W <= 2, W * R <= 4: the weights unpacked once for the R activation rows, the
 * activations loaded once for the W weight rows, and each pair takes exactly the operations of
 * one weight row and one activation row (the same bits): out[r*ldo + i].  Per pair one integer
 * and one float accumulator (the mins term goes into the same float lanes), so four pairs fit
 * the 16 vector registers. */
static inline __attribute__((always_inline)) void
hy_dot_q45_k_avx2_rows(const uint8_t *w, long wstep, const int W, long nsb, const int R,
                       const int8_t *qa, long lda, const float *da, const float *sa, long ldd,
                       int five, float *out, long ldo) {
    const int bb = five ? 176 : 144;
    __m256 acc[4];
    for (int k = 0; k < W * R; k++) acc[k] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (long s = 0; s < nsb; s++) {
        const long a0 = 8 * s;
        __m256i sc[2], hbits[2], is[4];
        uint32_t mn_lo[2], mn_hi[2];
        float d[2];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + bb * s;
            /* the W rows' bytes are one span: prefetch it front to back, W blocks per step */
            const uint8_t *pf = w + bb * (W * s + i);
            HY_PREFETCH_L2(pf);
            HY_PREFETCH_L2(pf + 64);
            HY_PREFETCH_L2(pf + 128);
            uint32_t sc_lo, sc_hi;
            hy_k4_scales_u32(blk + 4, &sc_lo, &sc_hi, &mn_lo[i], &mn_hi[i]);
            sc[i] = _mm256_broadcastsi128_si256(hy_k4_i16(sc_lo, sc_hi));
            d[i] = hy_f16(blk);
            hbits[i] = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        }
        for (int k = 0; k < W * R; k++) is[k] = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < W; i++) {
                const uint8_t *q = w + i * wstep + bb * s + (five ? 48 : 16);
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * g));
                __m256i lo = _mm256_and_si256(raw, low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                if (five) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(hbits[i], 2 * g), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(hbits[i], 2 * g + 1), one), 4));
                }
                const __m256i s0 = hy_bcast16(sc[i], 2 * g), s1 = hy_bcast16(sc[i], 2 * g + 1);
                for (int r = 0; r < R; r++) {
                    const int8_t *ar = qa + r * lda + 32 * (a0 + 2 * g);
                    const int k = i * R + r;
                    is[k] = hy_madd_acc(is[k], _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)ar)), s0);
                    is[k] = hy_madd_acc(is[k], _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(ar + 32))), s1);
                }
            }
        for (int i = 0; i < W; i++) {
            /* -dmin * min_j (exact), made here so that it holds no register in the loop above */
            const __m256 mnf = _mm256_mul_ps(hy_k4_f32(mn_lo[i], mn_hi[i]),
                                             _mm256_set1_ps(-hy_f16(w + i * wstep + bb * s + 2)));
            for (int r = 0; r < R; r++) {
                const int k = i * R + r;
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[k]), _mm256_set1_ps(d[i] * da[r * ldd + a0]), acc[k]);
                acc[k] = _mm256_fmadd_ps(mnf, _mm256_loadu_ps(sa + r * ldd + a0), acc[k]);
            }
        }
    }
    for (int i = 0; i < W; i++)
        for (int r = 0; r < R; r++) out[r * ldo + i] = hy_hsum256(acc[i * R + r]);
}

/* Q4_K / Q5_K, one activation row */
HY_UNUSED static float hy_dot_q45_k_avx2(const uint8_t *w, long nsb, const int8_t *qa,
                                         const float *da, const float *sa, int five) {
    float out;
    hy_dot_q45_k_avx2_rows(w, 0, 1, nsb, 1, qa, 0, da, sa, 0, five, &out, 0);
    return out;
}

/* Shuffle control that picks, from 8 int16 in each 128-bit lane, element 2j into every int16 of
 * the low lane and element 2j+1 into every int16 of the high lane: the scales of the two 16-value
 * halves of a 32-value block */
static inline __m256i hy_scale_pair_ctrl(int j) {
    return _mm256_set_m128i(_mm_set1_epi16((short)(((4 * j + 3) << 8) | (4 * j + 2))),
                            _mm_set1_epi16((short)(((4 * j + 1) << 8) | (4 * j))));
}

/* Q6_K, W weight rows (row i at w + i*wstep) times R activation rows (row r at qa + r*lda,
 * da + r*ldd, s16 + 2*r*ldd; s16 as hy_q_act gives it, with one scale per super-block),
 * W <= 2, W * R <= 4: unsigned values n (0..63) in maddubs, their 8-bit scales through madd
 * into int32, one conversion and FMA with d * da per super-block, and the -32 offsets as
 * -32 * d * scale * s16 (two FMAs per super-block) into the same float lanes.  The weights
 * unpacked once for the R activation rows, the activations loaded once for the W weight rows,
 * each pair the same operations as alone (the same bits): out[r*ldo + i] */
static inline __attribute__((always_inline)) void
hy_dot_q6_k_avx2_rows(const uint8_t *w, long wstep, const int W, long nsb, const int R,
                      const int8_t *qa, long lda, const float *da, const float *s16, long ldd,
                      float *out, long ldo) {
    __m256 acc[4];
    for (int k = 0; k < W * R; k++) acc[k] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (long s = 0; s < nsb; s++) {
        __m256i is[4];
        float d[2];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + 210 * s;
            const int8_t *sc = (const int8_t *)(blk + 192);
            /* the W rows' bytes are one span: prefetch it front to back, W blocks per step */
            const uint8_t *pf = w + 210 * (W * s + i);
            HY_PREFETCH_L2(pf);
            HY_PREFETCH_L2(pf + 64);
            HY_PREFETCH_L2(pf + 128);
            HY_PREFETCH_L2(pf + 192);
            d[i] = hy_f16(blk + 208);
            /* the offsets first: -32 * d * scale (exact) times the sums per 16 */
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
            const __m256 dv = _mm256_set1_ps(-32.0f * d[i]);
            const __m256 dsc0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), dv);
            const __m256 dsc1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))), dv);
            for (int r = 0; r < R; r++) {
                const float *s16r = s16 + 2 * r * ldd + 16 * s;
                const int k = i * R + r;
                acc[k] = _mm256_fmadd_ps(dsc0, _mm256_loadu_ps(s16r), acc[k]);
                acc[k] = _mm256_fmadd_ps(dsc1, _mm256_loadu_ps(s16r + 8), acc[k]);
                is[k] = _mm256_setzero_si256();
            }
        }
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < W; i++) {
                const uint8_t *blk = w + i * wstep + 210 * s;
                const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
                const long a0 = 8 * s + 4 * n;
                const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
                const __m256i s16x = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(blk + 192 + 8 * n))));
                /* 32 values k (0..3): nibbles of ql's 32 bytes k & 1 (low for k < 2, high after),
                 * bits 2k, 2k+1 of qh on top; one 32-byte half of ql at a time (k, k + 2), so few
                 * vectors stay live (the integer sums' order does not change them) */
                for (int half = 0; half < 2; half++) {
                    const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * half));
                    for (int up = 0; up < 2; up++) {
                        const int k = half + 2 * up;
                        const __m256i lo = up ? _mm256_and_si256(_mm256_srli_epi16(l, 4), low4) : _mm256_and_si256(l, low4);
                        const __m256i hs = k < 2 ? _mm256_slli_epi16(h, 4 - 2 * k) : k == 2 ? h : _mm256_srli_epi16(h, 2);
                        const __m256i v = _mm256_or_si256(lo, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
                        /* int16 scale 2k of 8 in the low lane, 2k+1 in the high lane */
                        const __m256i sck = _mm256_shuffle_epi8(s16x, hy_scale_pair_ctrl(k));
                        for (int r = 0; r < R; r++) {
                            const __m256i p16 = _mm256_maddubs_epi16(
                                v, _mm256_loadu_si256((const __m256i *)(qa + r * lda + 32 * (a0 + k))));
                            is[i * R + r] = hy_madd_acc(is[i * R + r], p16, sck);
                        }
                    }
                }
            }
        for (int i = 0; i < W; i++)
            for (int r = 0; r < R; r++)
                acc[i * R + r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i * R + r]),
                                                 _mm256_set1_ps(d[i] * da[r * ldd + 8 * s]), acc[i * R + r]);
    }
    for (int i = 0; i < W; i++)
        for (int r = 0; r < R; r++) out[r * ldo + i] = hy_hsum256(acc[i * R + r]);
}

/* Q6_K, one activation row */
HY_UNUSED static float hy_dot_q6_k_avx2(const uint8_t *w, long nsb, const int8_t *qa,
                                        const float *da, const float *s16) {
    float out;
    hy_dot_q6_k_avx2_rows(w, 0, 1, nsb, 1, qa, 0, da, s16, 0, &out, 0);
    return out;
}


/* Q2_K / Q3_K: the 2-bit values of block k = 4h + j, bits 2j of the 32 bytes of half h */
#define HY_Q2_BITS(raw, j) _mm256_and_si256(_mm256_srli_epi16((raw), 2 * (j)), _mm256_set1_epi8(3))

/* Q2_K, one activation row: per 16 values the integer sum times the 4-bit scale (madd with the
 * scales as int16), one FMA per block with d * da; the mins term dmin * sum_16 min * s16 is two
 * FMAs per super-block */
HY_UNUSED static float hy_dot_q2_k_avx2(const uint8_t *w, long nsb, const int8_t *qa,
                                        const float *da, const float *s16) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 accm = _mm256_setzero_ps();
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 84 * s;
        HY_PREFETCH(blk);
        HY_PREFETCH(blk + 64);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)blk);
        const __m128i mn = _mm_and_si128(_mm_srli_epi16(sc8, 4), low4);
        const __m256 dmin = _mm256_set1_ps(hy_f16(blk + 82));
        accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)), dmin),
                               _mm256_loadu_ps(s16 + 16 * s), accm);
        accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8))), dmin),
                               _mm256_loadu_ps(s16 + 16 * s + 8), accm);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, low4));
        const __m256 cf = _mm256_mul_ps(_mm256_set1_ps(hy_f16(blk + 80)), _mm256_loadu_ps(da + 8 * s));
        for (int h = 0; h < 2; h++) {
            const __m256i sch = h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
            for (int j = 0; j < 4; j++) {
                const __m256i p16 = _mm256_maddubs_epi16(HY_Q2_BITS(raw, j), HY_LOADA(8 * s + 4 * h + j));
                const __m256i p32 = _mm256_madd_epi16(p16, _mm256_shuffle_epi8(sch, hy_scale_pair_ctrl(j)));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32),
                                         _mm256_permutevar8x32_ps(cf, _mm256_set1_epi32(4 * h + j)), acc[j]);
            }
        }
    }
    return hy_hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
           - hy_hsum256(accm);
}

/* the 16 scales of a Q3_K super-block less 32, as 16 signed bytes (hy_q3_k_scales' order) */
static inline __m128i hy_q3_k_scales_vec(const uint8_t *s) {
    const uint32_t a0 = hy_u32(s), a1 = hy_u32(s + 4), tmp = hy_u32(s + 8);
    const uint32_t m2 = 0x0f0f0f0fu, m1 = 0x03030303u;
    /* (built in registers: four 32-bit stores read back as one vector would stall) */
    return _mm_sub_epi8(_mm_setr_epi32((int)((a0 & m2) | ((tmp & m1) << 4)),
                                       (int)((a1 & m2) | (((tmp >> 2) & m1) << 4)),
                                       (int)(((a0 >> 4) & m2) | (((tmp >> 4) & m1) << 4)),
                                       (int)(((a1 >> 4) & m2) | (((tmp >> 6) & m1) << 4))),
                        _mm_set1_epi8(32));
}

/* Q3_K, one activation row: u = q | high << 2 (0..7) unsigned in maddubs, madd with the signed
 * scales, one FMA per block with d * da; the values' offset -4 is 4 * d * sum_16 scale * s16 */
HY_UNUSED static float hy_dot_q3_k_avx2(const uint8_t *w, long nsb, const int8_t *qa,
                                        const float *da, const float *s16) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 acco = _mm256_setzero_ps();
    const __m256i one = _mm256_set1_epi8(1);
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 110 * s;
        HY_PREFETCH(blk);
        HY_PREFETCH(blk + 64);
        const __m128i sc8 = hy_q3_k_scales_vec(blk + 96);
        const __m256 dv = _mm256_set1_ps(hy_f16(blk + 108));
        acco = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), dv),
                               _mm256_loadu_ps(s16 + 16 * s), acco);
        acco = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))), dv),
                               _mm256_loadu_ps(s16 + 16 * s + 8), acco);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m256 cf = _mm256_mul_ps(dv, _mm256_loadu_ps(da + 8 * s));
        const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
        for (int h = 0; h < 2; h++) {
            const __m256i sch = h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
            for (int j = 0; j < 4; j++) {
                const int k = 4 * h + j;
                const __m256i u = _mm256_or_si256(HY_Q2_BITS(raw, j), _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(hm, k), one), 2));
                const __m256i p16 = _mm256_maddubs_epi16(u, HY_LOADA(8 * s + k));
                const __m256i p32 = _mm256_madd_epi16(p16, _mm256_shuffle_epi8(sch, hy_scale_pair_ctrl(j)));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32),
                                         _mm256_permutevar8x32_ps(cf, _mm256_set1_epi32(k)), acc[j]);
            }
        }
    }
    return hy_hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
           - 4.0f * hy_hsum256(acco);
}

/* IQ4_NL / IQ4_XS: the grid values of 32 indices (hy_nibbles16's order), signed bytes */
static inline __m256i hy_iq4_lookup(const uint8_t *q) {
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hy_iq4_values));
    return _mm256_shuffle_epi8(grid, hy_nibbles16(q));
}

/* IQ4_NL, one activation row: two blocks per step, |v| times a with v's sign; the portable loop
 * takes an odd last block */
HY_UNUSED static float hy_dot_iq4_nl_avx2(const uint8_t *w, long nb, const int8_t *qa,
                                          const float *da) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    long b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *b0 = w + 18 * b, *b1 = b0 + 18;
        HY_PREFETCH(b0);
        const __m256i p0 = hy_dot_s8s8(hy_iq4_lookup(b0 + 2), HY_LOADA(b));
        const __m256i p1 = hy_dot_s8s8(hy_iq4_lookup(b1 + 2), HY_LOADA(b + 1));
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(hy_f16(b0) * da[b]), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(hy_f16(b1) * da[b + 1]), acc1);
    }
    return hy_hsum256(_mm256_add_ps(acc0, acc1)) +
           hy_dot_iq4_nl_portable(w + 18 * b, nb - b, qa + 32 * b, da + b);
}

/* IQ4_XS super-block factors: lane j = d * (scale_j - 32) * da[j] */
static inline __m256 hy_iq4_xs_factors(const uint8_t *blk, const float *da) {
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)hy_u32(blk + 4)),
        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)), _mm256_set1_epi32(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(blk[2] | (blk[3] << 8)),
        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(hy_f16(blk)), _mm256_cvtepi32_ps(ls)),
                         _mm256_loadu_ps(da));
}

/* IQ4_XS, one activation row: IQ4_NL's products per sub-block, one FMA each with its factor */
HY_UNUSED static float hy_dot_iq4_xs_avx2(const uint8_t *w, long nsb, const int8_t *qa,
                                          const float *da) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 136 * s;
        HY_PREFETCH(blk);
        HY_PREFETCH(blk + 64);
        HY_PREFETCH(blk + 128);
        const __m256 cf = hy_iq4_xs_factors(blk, da + 8 * s);
        for (int j = 0; j < 8; j += 2) {
            const __m256i p0 = hy_dot_s8s8(hy_iq4_lookup(blk + 8 + 16 * j), HY_LOADA(8 * s + j));
            const __m256i p1 = hy_dot_s8s8(hy_iq4_lookup(blk + 24 + 16 * j), HY_LOADA(8 * s + j + 1));
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_permutevar8x32_ps(cf, _mm256_set1_epi32(j)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_permutevar8x32_ps(cf, _mm256_set1_epi32(j + 1)), acc1);
        }
    }
    return hy_hsum256(_mm256_add_ps(acc0, acc1));
}

/* F16 / BF16 / F32 weight rows: the kind of a row of floats */
enum { HY_HALF_F16 = 0, HY_HALF_BF16 = 1, HY_HALF_F32 = 2 };

#if defined(HY_F16C) && !defined(__AVX512F__)
#define HY_HALF256 1
#define HY_HALF256_MAX_RW 6
/* 8 values of a row of `kind` at element i */
static inline __attribute__((always_inline)) __m256 hy_float8_at(const uint8_t *row, long i,
                                                                  const int kind) {
    if (kind == HY_HALF_F32) return _mm256_loadu_ps((const float *)row + i);
    const __m128i u = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (kind == HY_HALF_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(u), 16));
    return _mm256_cvtph_ps(u);
}

/* value i of a row of `kind` */
static inline float hy_float_at(const uint8_t *row, long i, const int kind) {
    if (kind == HY_HALF_F32) return ((const float *)row)[i];
    const uint16_t h = ((const uint16_t *)row)[i];
    if (kind == HY_HALF_F16) return hy_half_to_float(h);
    const uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

/* W (1..4) F16 / BF16 / F32 weight rows (row i at w + i*row_bytes) times R float32 activation
 * rows (row r at x + r*xstride), W*R <= 6: out[r*ostride + i].  16 values per step in two
 * 256-bit halves, each pair of rows with two accumulators, then the values past the last whole
 * step one by one; every weight vector is loaded (and widened) once for the R rows.  A pair of
 * rows takes exactly the same operations whatever W and R are (the same bits).  Where pf is set
 * each weight line is prefetched HY_PREFETCH_AHEAD on (a caller clears it on a second pass over
 * the same rows). */
static inline __attribute__((always_inline)) void
hy_half_rows_256(const uint8_t *w, long row_bytes, const int W, long n, const float *x,
                 long xstride, const int R, const int kind, const int pf, float *out, long ostride) {
    __m256 a0[HY_HALF256_MAX_RW], a1[HY_HALF256_MAX_RW];  /* [r * W + i] */
    const int esz = kind == HY_HALF_F32 ? 4 : 2;
    long k = 0;
    for (int j = 0; j < W * R; j++) a0[j] = a1[j] = _mm256_setzero_ps();
    for (; k + 16 <= n; k += 16) {
        __m256 w0[4], w1[4];
        for (int i = 0; i < W; i++) {
            const uint8_t *row = w + i * row_bytes;
            if (pf) HY_PREFETCH(row + k * esz);  /* (a step: one line of F32, half of F16) */
            w0[i] = hy_float8_at(row, k, kind);
            w1[i] = hy_float8_at(row, k + 8, kind);
        }
        for (int r = 0; r < R; r++) {
            const __m256 x0 = _mm256_loadu_ps(x + r * xstride + k);
            const __m256 x1 = _mm256_loadu_ps(x + r * xstride + k + 8);
            for (int i = 0; i < W; i++) {
                a0[r * W + i] = _mm256_fmadd_ps(w0[i], x0, a0[r * W + i]);
                a1[r * W + i] = _mm256_fmadd_ps(w1[i], x1, a1[r * W + i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < W; i++) {
            const uint8_t *row = w + i * row_bytes;
            const float *xr = x + r * xstride;
            float sum = hy_hsum256(_mm256_add_ps(a0[r * W + i], a1[r * W + i]));
            for (long t = k; t < n; t++) sum += hy_float_at(row, t, kind) * xr[t];
            out[r * ostride + i] = sum;
        }
}

#endif
#endif

#endif
