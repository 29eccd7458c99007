/* Dot products of one weight row (or W rows) with R activation rows, per format: the portable
 * loops, the AVX2 and the AVX-512 VNNI paths; the 8-row AVX2 kernel; F16/BF16 rows.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_DOT_H
#define HYBRID_QUANT_DOT_H

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
 * (shorter distances leave one stream below the memory's rate; prefetches past a matrix's end
 * are harmless) */
#define HY_PREFETCH_AHEAD 12288
#define HY_PREFETCH(p) _mm_prefetch((const char *)(p) + HY_PREFETCH_AHEAD, _MM_HINT_T0)
/* the same into L2 only, for kernels whose working set leaves L1 too little room for the
 * prefetched lines (the 512-bit Q6_K and K-quant kernels; Q8_0's single-row kernel is slower
 * so) */
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
#ifdef HY_AVX2  /* 256-bit: a 512-bit two-block version is slower */
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
    /* two groups ahead, front to back, into L2 (as hy_q45_matvec16): eight rows' streams
     * prefetched into L1 would evict lines before they are read */
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
 * window pass 3/4 of the L1D, lines prefetched into L1 would be evicted before their use
 * (a 32 KiB L1D with wide rows such as a down projection's); narrower rows keep L1. */
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
             * memory sees one forward stream (not W streams, one ahead of each row's cursor) */
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
 * float product (d * scale exact), cheaper than maddubs + scale shuffle + madd.
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

#endif
