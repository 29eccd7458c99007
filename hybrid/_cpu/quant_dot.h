/* Each format's dot products of one weight row with R activation rows, on the kernels chosen
 * once here per build: the widest vector loop the build has (quant_dot_avx512.h,
 * quant_dot_avx2.h), the portable loops (quant_dot_portable.h) for the blocks they leave, or for
 * everything in a portable build.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_DOT_H
#define HYBRID_QUANT_DOT_H

#if defined(HY_Q512)
#define HY_Q8_0_BLOCKS hy_q8_0_blocks_512
#define HY_Q45_K_DOT hy_dot_q45_k_512
#define HY_Q6_K_DOT hy_dot_q6_k_512
#elif defined(HY_AVX2)
#define HY_Q8_0_BLOCKS hy_q8_0_blocks_avx2
#define HY_Q45_K_DOT hy_dot_q45_k_avx2
#define HY_Q6_K_DOT hy_dot_q6_k_avx2
#else
#define HY_Q8_0_BLOCKS(w, nb, R, qa, da, sum) 0L
#define HY_Q45_K_DOT hy_dot_q45_k_portable
#define HY_Q6_K_DOT hy_dot_q6_k_portable
#endif
/* the low-bit formats: 512-bit kernels where the build has them, else 256-bit, else portable */
#if defined(HY_Q512)
#define HY_Q2_K_DOT hy_dot_q2_k_512
#define HY_Q3_K_DOT hy_dot_q3_k_512
#define HY_IQ4_NL_DOT hy_dot_iq4_nl_512
#define HY_IQ4_XS_DOT hy_dot_iq4_xs_512
#elif defined(HY_AVX2)
#define HY_Q2_K_DOT hy_dot_q2_k_avx2
#define HY_Q3_K_DOT hy_dot_q3_k_avx2
#define HY_IQ4_NL_DOT hy_dot_iq4_nl_avx2
#define HY_IQ4_XS_DOT hy_dot_iq4_xs_avx2
#else
#define HY_Q2_K_DOT hy_dot_q2_k_portable
#define HY_Q3_K_DOT hy_dot_q3_k_portable
#define HY_IQ4_NL_DOT hy_dot_iq4_nl_portable
#define HY_IQ4_XS_DOT hy_dot_iq4_xs_portable
#endif
#if defined(HY_AVX2)
#define HY_Q4Q5_BLOCKS hy_q4q5_blocks_avx2
#else
#define HY_Q4Q5_BLOCKS(w, nb, R, qa, da, sa, five, with_min, sum, msum) 0L
#endif
/* the float rows' kernel (hy_half_rows: W weight rows times R activation rows) and the most
 * pairs of rows one pass holds in registers */
#if defined(HY_HALF512)
#define HY_HALF_KERNEL hy_half_rows
#define HY_HALF_PAIRS HY_HALF_MAX_RW
#elif defined(HY_HALF256)
#define HY_HALF_KERNEL hy_half_rows_256
#define HY_HALF_PAIRS HY_HALF256_MAX_RW
#endif

/* Q8_0 for R (<= HY_MR) activation rows: out[r] = w . activation row r (qa + r*n, da + r*nb).
 * Every row goes through exactly the operations of a single row (R = 1), so a row's result does
 * not depend on how many rows share the pass. */
static inline __attribute__((always_inline)) void
hy_dot_q8_0_rows(const uint8_t *w, long nb, const int R, const int8_t *qa, const float *da,
                 float *out) {
    float sum[HY_MR];
    for (int r = 0; r < HY_MR; r++) sum[r] = 0.0f;
    hy_q8_0_tail(w, HY_Q8_0_BLOCKS(w, nb, R, qa, da, sum), nb, R, qa, da, sum);
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
    float sum[HY_MR], msum[HY_MR];
    for (int r = 0; r < HY_MR; r++) sum[r] = msum[r] = 0.0f;
    hy_q4q5_tail(w, HY_Q4Q5_BLOCKS(w, nb, R, qa, da, sa, five, with_min, sum, msum), nb, R, qa,
                 da, sa, five, with_min, sum, msum);
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

/* Q4_K / Q5_K: nsb super-blocks of 256; activation block 8*s+j is sub-block j of super-block s */
static float hy_dot_q45_k(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                          const float *sa, int five) {
    return HY_Q45_K_DOT(w, nsb, qa, da, sa, five);
}

/* Q6_K: values n (0..63) with a signed 8-bit scale per 16 and one float16 d per 256 */
static float hy_dot_q6_k(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                         const float *s16) {
    return HY_Q6_K_DOT(w, nsb, qa, da, s16);
}

/* Q2_K / Q3_K: 2- and 3-bit values with a scale per 16, nsb super-blocks of 256 (s16 as for
 * Q6_K); IQ4_NL / IQ4_XS: 4-bit indices into a grid of 16 signed values */
static float hy_dot_q2_k(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                         const float *s16) {
    return HY_Q2_K_DOT(w, nsb, qa, da, s16);
}

static float hy_dot_q3_k(const uint8_t *w, long nsb, const int8_t *qa, const float *da,
                         const float *s16) {
    return HY_Q3_K_DOT(w, nsb, qa, da, s16);
}

static float hy_dot_iq4_nl(const uint8_t *w, long nb, const int8_t *qa, const float *da) {
    return HY_IQ4_NL_DOT(w, nb, qa, da);
}

static float hy_dot_iq4_xs(const uint8_t *w, long nsb, const int8_t *qa, const float *da) {
    return HY_IQ4_XS_DOT(w, nsb, qa, da);
}

/* F16 / BF16 rows times float32 x: the float rows' kernel for one pair of rows (so a row
 * alone gets the bits it gets in a pass) */
static float hy_dot_half(const uint8_t *w, long n, const float *x, int bf16) {
#if defined(HY_HALF_KERNEL)
    float out;  /* (bf16 a constant in each call) */
    if (bf16) HY_HALF_KERNEL(w, 0, 1, n, x, 0, 1, HY_HALF_BF16, 1, &out, 0);
    else HY_HALF_KERNEL(w, 0, 1, n, x, 0, 1, HY_HALF_F16, 1, &out, 0);
    return out;
#else
    return hy_dot_half_portable(w, n, x, bf16);
#endif
}

/* an F32 row times float32 x, as hy_dot_half */
static float hy_dot_f32(const uint8_t *w, long n, const float *x) {
#if defined(HY_HALF_KERNEL)
    float out;
    HY_HALF_KERNEL(w, 0, 1, n, x, 0, 1, HY_HALF_F32, 1, &out, 0);
    return out;
#else
    return hy_dot_stream((const float *)w, x, n);
#endif
}

#endif
