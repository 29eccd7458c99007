/* The portable dot products: plain C loops for every format, each row's operations those of a
 * single row.  A SIMD build runs them on the blocks its vector loops leave (the tails); a
 * portable build runs them on everything.  quant_dot.h chooses per format and build.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_DOT_PORTABLE_H
#define HYBRID_QUANT_DOT_PORTABLE_H

/* a build uses one ISA's version of each one-row dot product: the others are not called */
#define HY_UNUSED __attribute__((unused))

/* Q8_0 blocks b..nb-1 of R activation rows, added to sum[r] */
static inline __attribute__((always_inline)) void
hy_q8_0_tail(const uint8_t *w, long b, long nb, const int R, const int8_t *qa, const float *da,
             float *sum) {
    const long n = 32 * nb;
    for (; b < nb; b++) {
        const uint8_t *blk = w + 34 * b;
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int r = 0; r < R; r++) {
            int s = 0;
            for (int j = 0; j < 32; j++) s += q[j] * qa[r * n + 32 * b + j];
            sum[r] += (float)s * (hy_f16(blk) * da[r * nb + b]);
        }
    }
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 blocks b..nb-1 of R activation rows: the integer products into
 * sum[r], the offsets into msum[r] */
static inline __attribute__((always_inline)) void
hy_q4q5_tail(const uint8_t *w, long b, long nb, const int R, const int8_t *qa, const float *da,
             const float *sa, int five, int with_min, float *sum, float *msum) {
    const long n = 32 * nb;
    const hy_q45_layout lay = hy_q45_layout_of(five, with_min);
    const int hoff = lay.hoff, qoff = lay.qoff, bb = lay.bb;
    const float centre = lay.centre;
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
}

/* Q4_K / Q5_K, one activation row (scales per 256 values, hy_q_act): per super-block the
 * integer sum over its sub-blocks of scale * (values . activations), times d * da; less the
 * mins term dmin * min * sa per sub-block */
HY_UNUSED static float hy_dot_q45_k_portable(const uint8_t *w, long nsb, const int8_t *qa,
                                             const float *da, const float *sa, int five) {
    const int bb = five ? 176 : 144;
    float sum = 0.0f, msum = 0.0f;
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + bb * s;
        const uint8_t *qh = blk + 16, *q = five ? blk + 48 : blk + 16;
        const float d = hy_f16(blk), dmin = hy_f16(blk + 2);
        const long a0 = 8 * s;
        int isum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            hy_k4_scale_min(j, blk + 4, &sc, &mn);
            const int8_t *a = qa + 32 * (a0 + j);
            const uint8_t *qq = q + 32 * (j / 2);
            int bsum = 0;
            for (int l = 0; l < 32; l++) {
                int n = (j & 1) ? (qq[l] >> 4) : (qq[l] & 0x0F);
                if (five) n |= ((qh[l] >> j) & 1) << 4;
                bsum += n * a[l];
            }
            isum += sc * bsum;
            msum += dmin * (float)mn * sa[a0 + j];
        }
        sum += (float)isum * (d * da[a0]);
    }
    return sum - msum;
}

/* Q6_K, one activation row (scales per 256 values): per super-block the integer sum of
 * scale * (n - 32) * activation, times d * da */
HY_UNUSED static float hy_dot_q6_k_portable(const uint8_t *w, long nsb, const int8_t *qa,
                                            const float *da, const float *s16) {
    float sum = 0.0f;
    (void)s16;  /* (the vector kernels' offset sums; the loop here takes the offset per value) */
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 210 * s;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const float d = hy_f16(blk + 208);
        int isum = 0;
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
            const int8_t *scn = sc + 8 * n;
            const long a0 = 8 * s + 4 * n;
            for (int k = 0; k < 4; k++) {
                const int8_t *a = qa + 32 * (a0 + k);
                for (int l = 0; l < 32; l++) {
                    const uint8_t *src = (k & 1) ? ql + 32 : ql;
                    int nib = (k & 2) ? (src[l] >> 4) : (src[l] & 0x0F);
                    int q6 = (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                    isum += scn[2 * k + l / 16] * q6 * a[l];
                }
            }
        }
        sum += (float)isum * (d * da[8 * s]);
    }
    return sum;
}

/* Q2_K, one activation row: per 16 values, d * scale * sum(v * a), less the mins term
 * dmin * sum_16 min * s16 (s16 as hy_q_act gives it) */
HY_UNUSED static float hy_dot_q2_k_portable(const uint8_t *w, long nsb, const int8_t *qa,
                                            const float *da, const float *s16) {
    float sum = 0.0f, msum = 0.0f;
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 84 * s, *sc = blk, *q = blk + 16;
        const float d = hy_f16(blk + 80), dmin = hy_f16(blk + 82);
        for (int k = 0; k < 8; k++) {
            const int8_t *a = qa + 32 * (8 * s + k);
            const uint8_t *qq = q + 32 * (k / 4);
            int is[2] = {0, 0};
            for (int l = 0; l < 32; l++) is[l / 16] += ((qq[l] >> (2 * (k % 4))) & 3) * a[l];
            const int isum = (sc[2 * k] & 0x0F) * is[0] + (sc[2 * k + 1] & 0x0F) * is[1];
            sum += (float)isum * (d * da[8 * s + k]);
            msum += dmin * ((float)(sc[2 * k] >> 4) * s16[16 * s + 2 * k] +
                            (float)(sc[2 * k + 1] >> 4) * s16[16 * s + 2 * k + 1]);
        }
    }
    return sum - msum;
}

/* Q3_K, one activation row: unsigned u = q | high << 2 (0..7) in the integer products, the
 * value's offset -4 through the activations' sums per 16: 4 * d * sum_16 scale * s16 */
HY_UNUSED static float hy_dot_q3_k_portable(const uint8_t *w, long nsb, const int8_t *qa,
                                            const float *da, const float *s16) {
    float sum = 0.0f, osum = 0.0f;
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 110 * s, *hm = blk, *q = blk + 32;
        int8_t sc[16];
        hy_q3_k_scales(blk + 96, sc);
        const float d = hy_f16(blk + 108);
        for (int k = 0; k < 8; k++) {
            const int8_t *a = qa + 32 * (8 * s + k);
            const uint8_t *qq = q + 32 * (k / 4);
            int is[2] = {0, 0};
            for (int l = 0; l < 32; l++)
                is[l / 16] += (((qq[l] >> (2 * (k % 4))) & 3) | (((hm[l] >> k) & 1) << 2)) * a[l];
            sum += (float)(sc[2 * k] * is[0] + sc[2 * k + 1] * is[1]) * (d * da[8 * s + k]);
            osum += d * ((float)sc[2 * k] * s16[16 * s + 2 * k] +
                         (float)sc[2 * k + 1] * s16[16 * s + 2 * k + 1]);
        }
    }
    return sum - 4.0f * osum;
}

/* IQ4_NL, one activation row: the grid's signed values times the activations */
HY_UNUSED static float hy_dot_iq4_nl_portable(const uint8_t *w, long nb, const int8_t *qa,
                                              const float *da) {
    float sum = 0.0f;
    for (long b = 0; b < nb; b++) {
        const uint8_t *blk = w + 18 * b;
        const int8_t *a = qa + 32 * b;
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += hy_iq4_values[blk[2 + j] & 0x0F] * a[j] + hy_iq4_values[blk[2 + j] >> 4] * a[j + 16];
        sum += (float)isum * (hy_f16(blk) * da[b]);
    }
    return sum;
}

/* IQ4_XS, one activation row: IQ4_NL's values with a 6-bit scale per 32 */
HY_UNUSED static float hy_dot_iq4_xs_portable(const uint8_t *w, long nsb, const int8_t *qa,
                                              const float *da) {
    float sum = 0.0f;
    for (long s = 0; s < nsb; s++) {
        const uint8_t *blk = w + 136 * s;
        const float d = hy_f16(blk);
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = blk + 8 + 16 * j;
            const int8_t *a = qa + 32 * (8 * s + j);
            int isum = 0;
            for (int l = 0; l < 16; l++)
                isum += hy_iq4_values[q[l] & 0x0F] * a[l] + hy_iq4_values[q[l] >> 4] * a[l + 16];
            sum += (float)isum * (d * (float)hy_iq4_xs_scale(blk, j) * da[8 * s + j]);
        }
    }
    return sum;
}

/* F16 / BF16 values i..n-1 of a row times float32 x, added to sum */
static inline float hy_half_tail(const uint16_t *h, long i, long n, const float *x, int bf16,
                                 float sum) {
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
}

HY_UNUSED static float hy_dot_half_portable(const uint8_t *w, long n, const float *x, int bf16) {
    return hy_half_tail((const uint16_t *)w, 0, n, x, bf16, 0.0f);
}

#endif
