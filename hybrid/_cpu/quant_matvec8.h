/* The AVX2 eight-row mat-vec for Q4_0 / Q4_1 / Q5_0 / Q5_1 (the kernel those formats take in
 * builds whose quantized kernels are 256-bit).
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_MATVEC8_H
#define HYBRID_QUANT_MATVEC8_H

#if defined(HY_AVX2) && !defined(HY_Q512)
/* Eight rows of 16 bytes, rows k and k+4 in the low and high lanes of y[k], to four registers of
 * four bytes of each row: lane L of t[i] holds dword i of lane L of y[0..3], in that order (a
 * 4x4 dword transpose inside each 128-bit lane) */
static inline void hy_transpose_dwords8x4(const __m256i y[4], __m256i t[4]) {
    const __m256i a0 = _mm256_unpacklo_epi32(y[0], y[1]), a1 = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i a2 = _mm256_unpacklo_epi32(y[2], y[3]), a3 = _mm256_unpackhi_epi32(y[2], y[3]);
    t[0] = _mm256_unpacklo_epi64(a0, a2);
    t[1] = _mm256_unpackhi_epi64(a0, a2);
    t[2] = _mm256_unpacklo_epi64(a1, a3);
    t[3] = _mm256_unpackhi_epi64(a1, a3);
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 decode for 8 weight rows at once where the quantized kernels are
 * 256-bit (AVX2, what a Zen 3 runs): row i (rows w + i*row_bytes for i < W, the last row repeated
 * past W) in 32-bit lane i.  Per block the 8 rows' 16 nibble bytes are transposed (dword c of
 * every row in one register), each activation dword is broadcast and one maddubs per dword
 * serves all 8 rows; the block's float work (scale, offset) is then one vector operation for the
 * 8 rows, where one row at a time paid it per row (and a scalar conversion of d).  The 8 rows'
 * headers (d, and m for Q4_1 / Q5_1) and Q5's high-bit words come in with 128-bit loads and
 * unpacks, as the nibbles do (a gather each was slower on AMD cores).
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
    __m256 acc[HY_PASS_ROWS], off[HY_PASS_ROWS];
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
        __m256i t[4], wc[4];
        for (int k = 0; k < 4; k++)
            t[k] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row[k] + at + qoff))),
                _mm_loadu_si128((const __m128i *)(row[k + 4] + at + qoff)), 1);
        hy_transpose_dwords8x4(t, wc);
        __m256i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            lo[c] = _mm256_and_si256(wc[c], m4);
            hi[c] = _mm256_and_si256(_mm256_srli_epi16(wc[c], 4), m4);
        }
        /* the 8 rows' first 8 bytes: dwords 0 and 1 of row i in lane i of hdr and dw1 (half the
         * nibbles' transpose) */
        __m256i h[4];
        for (int k = 0; k < 4; k++)
            h[k] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row[k] + at))),
                _mm_loadu_si128((const __m128i *)(row[k + 4] + at)), 1);
        const __m256i h01 = _mm256_unpacklo_epi32(h[0], h[1]), h23 = _mm256_unpacklo_epi32(h[2], h[3]);
        /* d in the low 16 bits, m (Q4_1, Q5_1) in the high */
        const __m256i hdr = _mm256_unpacklo_epi64(h01, h23);
        if (five) {  /* value j takes bit j of its row's 32-bit word: 16 where it is set */
            const __m256i dw1 = _mm256_unpackhi_epi64(h01, h23);  /* bytes 4..7 */
            const __m256i qh = with_min ? dw1 : _mm256_or_si256(_mm256_srli_epi32(hdr, 16),
                                                                  _mm256_slli_epi32(dw1, 16));
            for (int c = 0; c < 4; c++) {
                const __m256i l16 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, q5_lo[c]), q5_bit[c]), q5_bit[c]);
                const __m256i h16 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, q5_hi[c]), q5_bit[c]), q5_bit[c]);
                lo[c] = _mm256_or_si256(lo[c], _mm256_and_si256(l16, b4));
                hi[c] = _mm256_or_si256(hi[c], _mm256_and_si256(h16, b4));
            }
        }
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
            /* int16 pair sums of at most 2 * 15 * 128 (Q4) or 2 * 31 * 128 (Q5): Q4's eight
             * add up in one int16 sum, Q5's four in each of two, without saturation (the same
             * int32 sums either way) */
            __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32((int)hy_u32(a + 4 * c))));
                sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32((int)hy_u32(a + 16 + 4 * c))));
            }
            if (five) sum = _mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones));
            else sum = _mm256_madd_epi16(_mm256_add_epi16(sl, sh), ones);
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

#endif
