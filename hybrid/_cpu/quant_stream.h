/* The AVX-512 streaming mat-vecs for Q4_0 / Q4_1 / Q5_0 / Q5_1 (VBMI): up to HY_MR activation
 * rows against weight rows read front to back, four blocks (128 values) per step.
 * Part of quant.h, which includes the parts in order.
 *
 * Two overlapping 64-byte loads cover a row's four blocks (bytes [0, 64) and [4*bb - 64, 4*bb));
 * vpermt2b (AVX512_VBMI) picks their nibble bytes, their scales (and mins) and Q5's high-bit
 * words.  Four weight rows, one from each quarter of a thread's rows, share a pass, so each
 * quarter is one forward stream.  hy_q45_matvec16 (quant_matvec16.h) transposes 16 rows
 * instead, which interleaves 16 streams, which memory serves slower than these kernels' one.
 *
 * Two arrangements of a step, both giving the same bits as each other and as hy_q45_matvec16:
 *   few  128-bit lane b holds block b of one weight row; each activation row's integer sums
 *        are then reduced and transposed to one lane per block and row (nine operations per
 *        activation row and step);
 *   many four 128-bit shuffles per step put the four weight rows side by side, lane 4i+b of
 *        register j holding bytes 4j..4j+3 of block b of row i, so that an activation pattern
 *        broadcast to every 128-bit lane serves all four rows and eight vpdpbusd leave each
 *        block's sum in its own lane with no reduction.
 * Which is faster depends on the core (hy_q45_many).
 * In both, one FMA adds a step's scaled block sums into a register whose lanes keep each row's
 * running sums of blocks b, b+4, b+8, ... (b = 0..3; one more FMA the offsets), and a row's four
 * sums are added at the end, (s0 + s1) + (s2 + s3), as hy_q45_matvec16 adds its blocks.
 * HY_Q45_PF: the software prefetch distance in bytes. */
#ifndef HYBRID_QUANT_STREAM_H
#define HYBRID_QUANT_STREAM_H

#if defined(HY_Q512) && defined(__AVX512VBMI__)
#define HY_Q45_STREAM 1
#ifndef HY_Q45_PF
#define HY_Q45_PF 2048
#endif
/* activation rows from which a pass can take the "many" arrangement */
#define HY_Q45_MANY 3

/* Whether a call of `rows` activation rows takes the "many" arrangement (and its activation
 * layout): from HY_Q45_MANY rows on Intel cores, where it measured faster (the shuffles cost
 * about as much as two rows' reductions); never on AMD cores, where "few" measured faster in a
 * decode step of three to eight rows (read once at run time). */
static int hy_q45_many_ = -1;
/* set the choice: 1 "many" from HY_Q45_MANY rows, 0 "few" always, -1 the core's */
static inline void hy_q45_choose(int many) {
    hy_q45_many_ = many < 0 ? hy_cpu_is_intel() : many != 0;
}
static inline int hy_q45_many(int rows) {
    if (hy_q45_many_ < 0) hy_q45_choose(-1);
    return hy_q45_many_ && rows >= HY_Q45_MANY;
}

typedef struct {
    /* few: vpermt2b indices (nibble bytes, lane b = block b; [d x16 | m x16] words, word 4b+i;
     * high-bit words, qword 2b (+1) = block b), vpermt2w indices (two rows' words from their
     * first loads), vpshufbitqmb selectors (values j, 16 + j) */
    __m512i nib, hdr, qh, hdr2, sel_lo, sel_hi;
    /* many: the same, lane 4i+b for row i: vpermt2b indices (byte 16j + 4b + k is byte 4j + k of
     * block b's nibbles; words 4i+b and 16+4i+b: d and m of block b; lane i: the four blocks'
     * high-bit words), vpermt2w indices, one vpshufbitqmb selector per register */
    __m512i nib_r, hdr_r, qh_r, hdr2_r, sel_r[8];
    int bb, five, with_min;  /* block bytes, Q5, Q4_1 / Q5_1 */
    int hdr_first;  /* the four blocks' headers lie in a row's first 64 bytes (Q4_0, Q4_1) */
} hy_q45_plan;

/* byte p of the step's 4*bb bytes as an index into the two loads: bytes [0, 64) of the first,
 * then the second's (which starts at byte s) */
static inline uint8_t hy_q45_at(int p, int s) { return (uint8_t)(p < 64 ? p : 64 + p - s); }

static inline void hy_q45_plan_init(hy_q45_plan *pl, int five, int with_min) {
    const int hoff = with_min ? 4 : 2, qoff = hoff + (five ? 4 : 0), bb = qoff + 16;
    const int s = 4 * bb - 64;  /* the second load's offset */
    uint8_t nib[64], hdr[64], qh[64], sel_lo[64], sel_hi[64], nib_r[64], hdr_r[64], qh_r[64];
    uint16_t hdr2[32], hdr2_r[32];
    for (int p = 0; p < 64; p++) {
        const int lane = p / 16, dw = (p % 16) / 4, k = p % 4, w = p / 2;
        /* few: byte p is byte p % 16 of block `lane`'s nibbles; word w: d (m from word 16) of
         * block (w % 16) / 4; qword 2b + h: block b's high-bit word (twice) */
        nib[p] = hy_q45_at(qoff + bb * lane + p % 16, s);
        hdr[p] = hy_q45_at(bb * ((w % 16) / 4) + 2 * (w >= 16) + p % 2, s);
        qh[p] = hy_q45_at(hoff + bb * lane + k, s);
        sel_lo[p] = (uint8_t)(p % 16);
        sel_hi[p] = (uint8_t)(p % 16 + 16);
        /* many: byte p is byte 4 * lane + k of block dw's nibbles; word w: d (m) of block w % 4;
         * lane i (any): the four blocks' high-bit words */
        nib_r[p] = hy_q45_at(qoff + bb * dw + 4 * lane + k, s);
        hdr_r[p] = hy_q45_at(bb * (w % 4) + 2 * (w >= 16 && with_min) + p % 2, s);
        qh_r[p] = hy_q45_at(hoff + bb * dw + k, s);
    }
    for (int w = 0; w < 32; w++) {  /* even rows from the first source, odd from the second */
        hdr2[w] = (uint16_t)((bb * ((w % 16) / 4)) / 2 + (w >= 16) + ((w & 1) ? 32 : 0));
        hdr2_r[w] = (uint16_t)((bb * (w % 4)) / 2 + (w >= 16 && with_min) + (((w % 16) / 4) & 1 ? 32 : 0));
    }
    pl->nib = _mm512_loadu_si512(nib), pl->hdr = _mm512_loadu_si512(hdr);
    pl->qh = _mm512_loadu_si512(qh), pl->hdr2 = _mm512_loadu_si512(hdr2);
    pl->sel_lo = _mm512_loadu_si512(sel_lo), pl->sel_hi = _mm512_loadu_si512(sel_hi);
    pl->nib_r = _mm512_loadu_si512(nib_r), pl->hdr_r = _mm512_loadu_si512(hdr_r);
    pl->qh_r = _mm512_loadu_si512(qh_r), pl->hdr2_r = _mm512_loadu_si512(hdr2_r);
    /* many: byte k of lane 4i+b of register j is value 4j+k (+16 in the high nibbles, j >= 4) of
     * block b: bit 4j+k (+16) of block b's word, in the low (b even) or high half of its qword */
    for (int j = 0; j < 8; j++) {
        uint8_t sel[64];
        for (int p = 0; p < 64; p++)
            sel[p] = (uint8_t)(4 * (j % 4) + p % 4 + (j >= 4 ? 16 : 0) + (((p / 4) % 4) & 1 ? 32 : 0));
        pl->sel_r[j] = _mm512_loadu_si512(sel);
    }
    pl->hdr_first = 3 * bb + hoff <= 64;
    pl->bb = bb, pl->five = five, pl->with_min = with_min;
}

/* The activations as the kernels read them, per step of 4 blocks (zeros past the last block):
 *   few  (HY_Q45_PREP_FEW bytes): values 0..15 of the 4 blocks (64 bytes), values 16..31, then
 *        16 lanes each of da and sa, lane 4b+i for block b;
 *   many (HY_Q45_PREP_MANY bytes): for j = 0..3 the 16 bytes [values 4j..4j+3 of blocks 0..3],
 *        the same for values 16+4j.., then da and sa of the 4 blocks. */
#define HY_Q45_PREP_FEW 256
#define HY_Q45_PREP_MANY 160
static inline long hy_q45_prep_bytes(int many, long n) {
    return (many ? HY_Q45_PREP_MANY : HY_Q45_PREP_FEW) * ((n / 32 + 3) / 4);
}

static inline void hy_q45_prep(int many, const int8_t *qa, const float *da, const float *sa,
                               long nb, uint8_t *prep) {
    const __m512i lo_q = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);    /* values 0..15 of 4 blocks */
    const __m512i hi_q = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);  /* values 16..31 */
    const __m512i quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    /* dword 4j + b of the result: dword j of block b */
    const __m512i by_j = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    for (long g = 0; g < nb; g += 4) {
        const long t = nb - g < 4 ? nb - g : 4;
        const int8_t *a = qa + 32 * g;
        const __m512i q0 = _mm512_maskz_loadu_epi8(t >= 2 ? ~0ULL : 0xFFFFFFFFULL, a);
        const __m512i q1 = _mm512_maskz_loadu_epi8(t == 4 ? ~0ULL : (t == 3 ? 0xFFFFFFFFULL : 0ULL), a + 64);
        const __mmask8 mf = (__mmask8)((1u << t) - 1);
        const __m512i lo = _mm512_permutex2var_epi64(q0, lo_q, q1), hi = _mm512_permutex2var_epi64(q0, hi_q, q1);
        const __m128 d4 = _mm_maskz_loadu_ps(mf, da + g), s4 = _mm_maskz_loadu_ps(mf, sa + g);
        if (many) {
            _mm512_storeu_si512(prep, _mm512_permutexvar_epi32(by_j, lo));
            _mm512_storeu_si512(prep + 64, _mm512_permutexvar_epi32(by_j, hi));
            _mm_storeu_ps((float *)(prep + 128), d4);
            _mm_storeu_ps((float *)(prep + 144), s4);
            prep += HY_Q45_PREP_MANY;
        } else {
            _mm512_storeu_si512(prep, lo);
            _mm512_storeu_si512(prep + 64, hi);
            _mm512_storeu_ps(prep + 128, _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(d4)));
            _mm512_storeu_ps(prep + 192, _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(s4)));
            prep += HY_Q45_PREP_FEW;
        }
    }
}

/* few: lanes 4b+i of x summed over b, (b0 + b1) + (b2 + b3): row i's sums in lane i */
static inline __m128 hy_q45_sums_few(__m512 x) {
    return _mm_add_ps(_mm_add_ps(_mm512_castps512_ps128(x), _mm512_extractf32x4_ps(x, 1)),
                      _mm_add_ps(_mm512_extractf32x4_ps(x, 2), _mm512_extractf32x4_ps(x, 3)));
}

/* many: lanes 4i+b of x summed over b, (b0 + b1) + (b2 + b3): row i's sums in lane 4i */
static inline __m512 hy_q45_sums_many(__m512 x) {
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));     /* b0+b1, b1+b0, b2+b3, b3+b2 */
    return _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E));  /* (b0+b1) + (b2+b3) in each */
}

/* W (<= 4) weight rows (row i at w + i*wstep) times R (<= HY_MR) activation rows (hy_q45_prep's
 * in the layout of arrangement `many`, a constant, pstride bytes apart):
 * out[r*ldo + i*ostep] = row i . activation row r (without the bias). */
static inline __attribute__((always_inline)) void
hy_q45_matvec_stream(const hy_q45_plan *pl, const uint8_t *w, long wstep, const int W, long nb,
                     const int R, const int many, const uint8_t *prep, long pstride, float *out,
                     long ostep, long ldo) {
    const int bb = pl->bb, five = pl->five, s = 4 * bb - 64;
    const long step_bytes = many ? HY_Q45_PREP_MANY : HY_Q45_PREP_FEW;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[HY_MR], off[HY_MR];
    for (int r = 0; r < R; r++) acc[r] = off[r] = _mm512_setzero_ps();
    for (long g = 0; g < nb; g += 4, prep += step_bytes) {
        /* the last step may hold fewer than 4 blocks: masked loads read zeros past them, and
         * zero sums and scales leave the sums as they are */
        const long t = nb - g < 4 ? nb - g : 4;
        const __mmask64 mw0 = t == 4 ? ~0ULL : (t * bb >= 64 ? ~0ULL : (1ULL << (t * bb)) - 1);
        const __mmask64 mw1 = t == 4 ? ~0ULL : (t * bb <= s ? 0ULL : (1ULL << (t * bb - s)) - 1);
        /* v[j] (j < 4: low nibbles, values 4j..; j >= 4: high, 16 + 4(j-4)..):
         *   few:  v[j] for j = i, v[4 + i] for row i, lane 4b + c: values 4c.. of block b
         *   many: lane 4i + b of v[j]: values 4j.. (16 + 4(j-4)..) of block b of row i */
        __m512i v[8], nibs[4], first[4], hdr = _mm512_setzero_si512();
        /* Q5's high-bit words: many, lane i of qh[0] for row i; few, qh[i] for row i */
        __m512i qh[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                         _mm512_setzero_si512()};
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstep + bb * g;
            /* the hardware prefetchers here do not keep a stream ahead: prefetch the lines of
             * the step HY_Q45_PF bytes ahead */
            _mm_prefetch((const char *)blk + HY_Q45_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + HY_Q45_PF + 4 * bb - 1, _MM_HINT_T0);
            const __m512i x0 = _mm512_maskz_loadu_epi8(mw0, blk), x1 = _mm512_maskz_loadu_epi8(mw1, blk + s);
            nibs[i] = _mm512_permutex2var_epi8(x0, many ? pl->nib_r : pl->nib, x1);
            first[i] = x0;
            if (!pl->hdr_first) {  /* row i's words into its lanes */
                if (many)
                    hdr = _mm512_mask_blend_epi16(0x000F000Fu << (4 * i), hdr, _mm512_permutex2var_epi8(x0, pl->hdr_r, x1));
                else
                    hdr = _mm512_mask_blend_epi16(0x11111111u << i, hdr, _mm512_permutex2var_epi8(x0, pl->hdr, x1));
            }
            if (five && many)
                qh[0] = _mm512_mask_blend_epi8(0xFFFFULL << (16 * i), qh[0], _mm512_permutex2var_epi8(x0, pl->qh_r, x1));
            else if (five)
                qh[i] = _mm512_permutex2var_epi8(x0, pl->qh, x1);
        }
        for (int i = W; i < 4; i++) nibs[i] = first[i] = _mm512_setzero_si512();
        if (pl->hdr_first)  /* two permutes and a blend instead of four and four */
            hdr = many ? _mm512_mask_blend_epi16(0xFF00FF00u, _mm512_permutex2var_epi16(first[0], pl->hdr2_r, first[1]),
                                                 _mm512_permutex2var_epi16(first[2], pl->hdr2_r, first[3]))
                       : _mm512_mask_blend_epi16(0xCCCCCCCCu, _mm512_permutex2var_epi16(first[0], pl->hdr2, first[1]),
                                                 _mm512_permutex2var_epi16(first[2], pl->hdr2, first[3]));
        if (many) {  /* 128-bit lane j of row i's bytes to lane i of register j */
            const __m512i t0 = _mm512_shuffle_i32x4(nibs[0], nibs[1], 0x44), t1 = _mm512_shuffle_i32x4(nibs[0], nibs[1], 0xEE);
            const __m512i t2 = _mm512_shuffle_i32x4(nibs[2], nibs[3], 0x44), t3 = _mm512_shuffle_i32x4(nibs[2], nibs[3], 0xEE);
            nibs[0] = _mm512_shuffle_i32x4(t0, t2, 0x88), nibs[1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
            nibs[2] = _mm512_shuffle_i32x4(t1, t3, 0x88), nibs[3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
        }
        for (int j = 0; j < 4; j++) {
            v[j] = _mm512_and_si512(nibs[j], m4);
            v[4 + j] = _mm512_and_si512(_mm512_srli_epi16(nibs[j], 4), m4);
        }
#if defined(__AVX512BITALG__)
        if (five) {  /* value n of a block takes bit n of its word: 16 where set */
            const __m512i b4 = _mm512_set1_epi8(0x10);
            for (int j = 0; j < 8; j++) {
                const __mmask64 set = many ? _mm512_bitshuffle_epi64_mask(qh[0], pl->sel_r[j])
                                           : _mm512_bitshuffle_epi64_mask(qh[j % 4], j < 4 ? pl->sel_lo : pl->sel_hi);
                v[j] = _mm512_mask_add_epi8(v[j], set, v[j], b4);
            }
        }
#endif
        const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(hdr));
        const __m512 mn = pl->with_min ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hdr, 1)) : d;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {  /* (unrolled: the sums stay in registers) */
            const uint8_t *a = prep + r * pstride;
            __m512i sum;
            if (many) {  /* two chains of exact integer sums */
                __m512i p[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
                for (int j = 0; j < 8; j++)
                    p[j % 2] = _mm512_dpbusd_epi32(p[j % 2], v[j], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + 16 * j))));
                sum = _mm512_add_epi32(p[0], p[1]);
            } else {
                const __m512i alo = _mm512_loadu_si512(a), ahi = _mm512_loadu_si512(a + 64);
                __m512i p[4];  /* lane 4b+c: values 4c..4c+3 and 16+4c.. of block b */
                for (int i = 0; i < 4; i++)
                    p[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), v[i], alo), v[4 + i], ahi);
                /* block sums, lane 4b+i for row i (exact integers) */
                const __m512i p01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
                const __m512i p23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
                sum = _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
            }
            const __m512 da = many ? _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(a + 128))) : _mm512_loadu_ps(a + 128);
            const __m512 sa = many ? _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(a + 144))) : _mm512_loadu_ps(a + 192);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, da), acc[r]);
            off[r] = _mm512_fmadd_ps(mn, sa, off[r]);
        }
    }
    const float centre = pl->with_min ? 1.0f : (five ? -16.0f : -8.0f);
    for (int r = 0; r < R; r++) {
        float v[16];
        if (many) {
            _mm512_storeu_ps(v, _mm512_fmadd_ps(hy_q45_sums_many(off[r]), _mm512_set1_ps(centre), hy_q45_sums_many(acc[r])));
            for (int i = 0; i < W; i++) out[r * ldo + i * ostep] = v[4 * i];
        } else {
            _mm_storeu_ps(v, _mm_fmadd_ps(hy_q45_sums_few(off[r]), _mm_set1_ps(centre), hy_q45_sums_few(acc[r])));
            for (int i = 0; i < W; i++) out[r * ldo + i * ostep] = v[i];
        }
    }
}
#endif

#endif
