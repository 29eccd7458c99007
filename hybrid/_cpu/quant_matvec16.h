/* AVX-512 multi-row mat-vec kernels: 16 weight rows per pass (Q4_0/Q4_1/Q5_0/Q5_1, Q8_0) and
 * the streaming kernel for one activation row (VBMI).
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
 * R (<= HY_MR) activation rows: out[r*ldo + o + i] = row o+i . activation row r.
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
    __m512 acc[4][HY_MR], off[4][HY_MR];
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
/* Q4_0 / Q4_1 / Q5_0 / Q5_1 for up to HY_MR activation rows (decode), streaming: weight rows
 * are read front to back, four blocks (128 values) per step.  Two overlapping 64-byte loads cover
 * a row's four blocks (bytes [0, 64) and [4*bb - 64, 4*bb)); one vpermt2b (AVX512_VBMI) picks
 * their 64 nibble bytes, and for Q5 one their high-bit words; the scales (and mins) of four rows
 * come from two vpermt2w where they lie in the first load (Q4_0, Q4_1), else one vpermt2b per
 * row.  Four weight rows, one from each quarter of a thread's rows, share a pass, so each
 * quarter is one forward stream.  hy_q45_matvec16 above transposes 16 rows instead, which reads
 * the activations once per 16 rows (less work per activation row) but interleaves 16 streams,
 * which memory serves slower than this kernel's one.  Both give the same bits (see
 * hy_q45_matvec_stream).
 * HY_Q45_PF: the software prefetch distance in bytes. */
#ifndef HY_Q45_PF
#define HY_Q45_PF 2048
#endif
typedef struct {
    __m512i nib, hdr, qh;  /* vpermt2b indices: nibble bytes; [d x16 | m x16] words; qh per qword */
    __m512i hdr2;  /* vpermt2w indices: two rows' [d x16 | m x16] words from their first loads */
    __m512i sel_lo, sel_hi;  /* vpshufbitqmb selectors: bits j (values j) and 16 + j */
    int bb, five, with_min;  /* block bytes, Q5, Q4_1 / Q5_1 */
    int hdr_first;  /* the four blocks' headers lie in a row's first 64 bytes (Q4_0, Q4_1) */
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
    /* word lane w of two rows' first loads (the second row's words at 32 + ...): d of block
     * (w % 16) / 4 (m for w >= 16) of row w % 4, the even rows from the first load, the odd
     * rows from the second; a blend then takes rows 2 and 3 from a second such permute */
    uint16_t words[32];
    for (int w = 0; w < 32; w++)
        words[w] = (uint16_t)((bb * ((w % 16) / 4)) / 2 + (w >= 16) + ((w & 1) ? 32 : 0));
    pl->hdr2 = _mm512_loadu_si512(words);
    pl->hdr_first = 3 * bb + hoff <= 64;
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
 * one after another would take eight 128-bit FMAs and twelve extracts per step.) */
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
        __m512i lo[4], hi[4], first[4], hdr = _mm512_setzero_si512();
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
            first[i] = x0;
            if (!pl->hdr_first) hdr = _mm512_mask_blend_epi16(0x11111111u << i, hdr, _mm512_permutex2var_epi8(x0, pl->hdr, x1));
        }
        for (int i = W; i < 4; i++) lo[i] = hi[i] = first[i] = _mm512_setzero_si512();
        if (pl->hdr_first)  /* two permutes and a blend instead of four and four */
            hdr = _mm512_mask_blend_epi16(0xCCCCCCCCu, _mm512_permutex2var_epi16(first[0], pl->hdr2, first[1]),
                                          _mm512_permutex2var_epi16(first[2], pl->hdr2, first[3]));
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

#endif
