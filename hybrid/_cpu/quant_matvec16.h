/* AVX-512 multi-row mat-vec kernels: 16 weight rows per pass (Q4_0/Q4_1/Q5_0/Q5_1, Q8_0).
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_MATVEC16_H
#define HYBRID_QUANT_MATVEC16_H

#if defined(HY_Q512)
/* The 16-row mat-vecs prefetch the group after the next into L2, not L1: that group, the next
 * and the one being read are three times 16 rows (30 KB at 576 values per Q8_0 row), more than
 * fits beside everything else in a 32 KB L1, so lines prefetched there would be evicted before
 * they are read. */
#define HY_ROWS16_PF_HINT _MM_HINT_T1

/* Shared by the 16-row mat-vecs: the first 16 bytes of the 16 rows' blocks (row i at
 * blk + i*row_bytes), four rows per register, then dwords 0 and 1 of every row as lanes:
 * dw0 lane i = dword 0 of row i, dw1 the same for dword 1 (NULL: not wanted).  128-bit loads and
 * permutes rather than gathers, which are slower. */
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
 * R (<= HY_PASS_ROWS) activation rows: out[r*ldo + o + i] = row o+i . activation row r.
 * The 16 rows' nibbles of a block are transposed in registers so that 32-bit lane i holds
 * row i: one vpdpbusd per 4 values then serves all 16 rows with the activations broadcast, and
 * the block's float work (scale, offset) is one vector operation for the 16 rows instead of
 * scalar work per row.  Q5's fifth bits come from the 16 rows' 32-bit high-bit words: one
 * vpshufbitqmb (AVX512_BITALG) per register picks each byte's bit, and a masked add puts 16 in.
 * The block headers come in with 128-bit loads and the same permutes (not gathers, which are
 * slower).  Per activation row the operations do not depend on R. */
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
    __m512 acc[4][HY_PASS_ROWS], off[4][HY_PASS_ROWS];
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < R; r++) acc[k][r] = off[k][r] = _mm512_setzero_ps();
    const uint8_t *pf = w + 32 * row_bytes;  /* two groups ahead */
    const int pf_lines = (int)((16 * row_bytes / 64 + nb - 1) / nb);
    for (long b = 0; b < nb; b++) {
        const uint8_t *blk = w + bb * b;
        /* the 16 rows after the next, front to back, spread over this group's blocks: one
         * forward stream for the prefetchers instead of 16 interleaved ones */
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
    __m512 acc[HY_PASS_ROWS], off[HY_PASS_ROWS];
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

#endif
