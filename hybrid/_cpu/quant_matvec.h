/* The mat-vec dispatcher: which kernel serves a range of weight rows for R activation rows,
 * chosen by format and build.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_MATVEC_H
#define HYBRID_QUANT_MATVEC_H

/* How the weight kernels prefetch their streams (quant_dot_avx2.h's HY_PREFETCH): 0 not at all
 * (portable builds), 1 far ahead into L1, 2 near into L1 and far into L2 (Intel cores) */
static inline int hy_q_weight_pf(void) {
#if defined(HY_AVX2)
    return hy_q_pf_near() ? 2 : 1;
#else
    return 0;
#endif
}

/* The stream kernel's arrangement (quant_stream.h) for a call of `rows` activation rows: 1
 * "many", 0 "few", -1 where the build has no stream kernel.  hy_q_stream_force makes later
 * calls take "many" from HY_Q45_MANY rows (1), "few" always (0) or the core's choice (-1): tests
 * run both on any core. */
static inline int hy_q_stream_many(int rows) {
#if defined(HY_Q45_STREAM)
    return hy_q45_many(rows);
#else
    (void)rows;
    return -1;
#endif
}
static inline void hy_q_stream_force(int many) {
#if defined(HY_Q45_STREAM)
    hy_q45_choose(many);
#else
    (void)many;
#endif
}

/* Prepared activations: the layouts some kernels read instead of the plain 8-bit blocks, laid
 * out once per call, one span of hy_q_prep_bytes(n) per activation row (0 where the build has
 * no such kernel).  Its parts, each at hy_q_prep_at: the stream kernel's (hy_q45_prep, any
 * number of rows, in the layout of the arrangement a call of that many rows takes:
 * hy_q45_many), and, for several rows, the Q8_0 multi-row kernel's (hy_q8_prep).
 * hy_q_prep_flags says which parts a format reads; hy_q_prep_acts lays out one row's. */
enum { HY_PREP_Q45 = 1, HY_PREP_Q8 = 2 };

static inline long hy_q_prep_part_bytes(int part, long n) {
#if defined(HY_Q512)
    switch (part) {
#if defined(HY_Q45_STREAM)
    case HY_PREP_Q45: return hy_q45_prep_bytes(0, n);  /* (the larger layout) */
#endif
    case HY_PREP_Q8: return hy_q8_prep_bytes(n);
    default: return 0;
    }
#else
    (void)part, (void)n;
    return 0;
#endif
}

/* where part `part` starts inside a row's span */
static inline long hy_q_prep_at(int part, long n) {
    long at = 0;
    for (int p = 1; p < part; p <<= 1) at += hy_q_prep_part_bytes(p, n);
    return at;
}

static inline long hy_q_prep_bytes(long n) { return hy_q_prep_at(HY_PREP_Q8 << 1, n); }

static inline int hy_q_prep_flags(int type) {
#if defined(HY_Q45_STREAM)
    if (hy_q45_rows16(type)) return HY_PREP_Q45;
#endif
#if defined(HY_Q512)
    return type == HY_Q_Q8_0 ? HY_PREP_Q8 : 0;
#else
    (void)type;
    return 0;
#endif
}

/* Whether the Q8_0 multi-row kernel reads prepared activations for rows of n values: where four
 * rows' layouts (2n bytes each) fit in 3/4 of the L1D beside the weights; wider rows take the
 * kernel that reads the plain blocks (n bytes a row), which then runs faster (both give the same
 * bits). */
static inline int hy_q_prep_fits(long n) {
    return 8 * n <= hy_l1d_bytes() * 3 / 4;
}

/* the parts `flags` names of one activation row (of a call with `rows` rows: the multi-row
 * parts only where rows > 1 and hy_q_prep_fits) */
static inline void hy_q_prep_acts(const int8_t *qa, const float *da, const float *sa, long n,
                                  int rows, int flags, uint8_t *prep) {
#if defined(HY_Q45_STREAM)
    if (flags & HY_PREP_Q45)  /* the layout of the passes a call of `rows` rows takes */
        hy_q45_prep(hy_q45_many(rows), qa, da, sa, n / 32, prep + hy_q_prep_at(HY_PREP_Q45, n));
#endif
#if defined(HY_Q512)
    if (rows < 2 || !hy_q_prep_fits(n)) return;
    if (flags & HY_PREP_Q8) hy_q8_prep(qa, da, n / 32, prep + hy_q_prep_at(HY_PREP_Q8, n));
#else
    (void)qa, (void)da, (void)sa, (void)n, (void)rows, (void)flags, (void)prep;
#endif
}

/* out[r*ldo + i] += bias[i] for the rows r < rows and the weight rows i in [o, o1) (nothing
 * without a bias) */
static inline void hy_add_bias(const float *bias, int rows, long o, long o1, float *out, long ldo) {
    if (bias)
        for (int r = 0; r < rows; r++)
            for (long i = o; i < o1; i++) out[r * ldo + i] += bias[i];
}

/* weight rows per chunk where the multi-row loops take a chunk (kept in cache) for each pass of
 * activation rows in turn (HY_CHUNK_LOOP) */
#ifndef HY_PREP_CHUNK
#define HY_PREP_CHUNK 32
#endif

/* The loop over weight rows [o, o1) for `rows` activation rows, bias added, chunk by chunk of
 * HY_PREP_CHUNK weight rows: in each chunk the rows go in as few passes of up to HY_MR as cover
 * them, shared out evenly (a pass costs nearly its weights' unpacking whatever its rows), and
 * HY_CHUNK(R, r), which the caller defines, runs the chunk's weight rows [o, oe_) against
 * activation rows r..r+R-1, R a constant in each expansion (so every kernel keeps its sums in
 * registers). */
#define HY_CHUNK_CASE_(R) case R: HY_CHUNK(R, r_); break;
#define HY_CHUNK_LOOP                                                                          \
    for (; o < o1; o += HY_PREP_CHUNK) {                                                       \
        const long oe_ = o1 - o < HY_PREP_CHUNK ? o1 : o + HY_PREP_CHUNK;                      \
        HY_EVEN_PASSES(rows, HY_MR, r_, left_) {                                               \
            switch (left_) { HY_R_CASES(HY_CHUNK_CASE_) }                                      \
        }                                                                                      \
        hy_add_bias(bias, rows, o, oe_, out, ldo);                                             \
    }

#if defined(HY_Q45_STREAM)
/* Weight rows [o, o1) of a stream-kernel format for R activation rows: four weight rows per
 * pass, one from each quarter of the range, so each quarter is one forward stream through
 * consecutive rows (prefetches running past a row's end fetch the next row read); then the rows
 * past the quarters.  One function per R and arrangement (hy_q45_stream_range_R "few",
 * hy_q45_stream_many_R "many"), kept out of line: inlined into the dispatcher the kernel's loop
 * lost its registers to the dispatcher's other paths. */
#define HY_Q45_STREAM_RANGE_(NAME, R, MANY)                                                     \
    static __attribute__((noinline)) void NAME(                                                \
        const hy_q45_plan *pl, const uint8_t *w, long row_bytes, long o, long o1, long nb,     \
        const uint8_t *prep, long pstride, float *out, long ldo) {                            \
        const long q = (o1 - o) / 4;                                                           \
        for (long k = 0; k < q; k++)                                                           \
            hy_q45_matvec_stream(pl, w + (o + k) * row_bytes, q * row_bytes, 4, nb, R, MANY,   \
                                 prep, pstride, out + o + k, q, ldo);                          \
        for (long i = o + 4 * q; i < o1; i++)                                                  \
            hy_q45_matvec_stream(pl, w + i * row_bytes, 0, 1, nb, R, MANY, prep, pstride,      \
                                 out + i, 0, ldo);                                             \
    }
#define HY_Q45_STREAM_RANGE(R)                                                                  \
    HY_Q45_STREAM_RANGE_(hy_q45_stream_range_##R, R, 0)                                         \
    HY_Q45_STREAM_RANGE_(hy_q45_stream_many_##R, R, 1)
HY_R_CASES(HY_Q45_STREAM_RANGE)
#undef HY_Q45_STREAM_RANGE
#undef HY_Q45_STREAM_RANGE_
#endif

#if defined(HY_Q512)
/* Weight rows [o, o1) (a multiple of 16) 16 at a time (hy_q8_matvec16, hy_q45_matvec16) for R
 * activation rows, one function per R kept out of line as the stream kernel's */
#define HY_ROWS16(R)                                                                            \
    static __attribute__((noinline)) void hy_rows16_##R(                                       \
        int type, const uint8_t *w, long row_bytes, long o, long o1, long nb, const int8_t *qa, \
        const float *da, const float *sa, int five, int with_min, float *out, long ldo) {      \
        for (; o < o1; o += 16) {                                                              \
            if (type == HY_Q_Q8_0)                                                             \
                hy_q8_matvec16(w + o * row_bytes, row_bytes, nb, R, qa, da, sa, out + o, ldo); \
            else hy_q45_matvec16(w + o * row_bytes, row_bytes, nb, R, qa, da, sa, five,        \
                                 with_min, out + o, ldo);                                      \
        }                                                                                      \
    }
HY_PASS_CASES(HY_ROWS16)
#undef HY_ROWS16
#endif

/* Weight rows [o, o1) of Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 against R activation rows, through
 * the dot products' multi-row form (each row the same bits as alone): out[r*ldo + i].  One
 * function per R, kept out of line. */
#define HY_MULTI_ROWS(R)                                                                        \
    static __attribute__((noinline)) void hy_multi_rows_##R(                                   \
        int type, const uint8_t *w, long row_bytes, long o, long o1, long nb, const int8_t *q, \
        const float *d, const float *sb, float *out, long ldo) {                               \
        for (long i = o; i < o1; i++) {                                                        \
            const uint8_t *wr = w + i * row_bytes;                                             \
            float v[R];                                                                        \
            switch (type) {                                                                    \
            case HY_Q_Q8_0: hy_dot_q8_0_rows(wr, nb, R, q, d, v); break;                       \
            case HY_Q_Q4_0: hy_dot_q4q5_rows(wr, nb, R, q, d, sb, 0, 0, v); break;             \
            case HY_Q_Q4_1: hy_dot_q4q5_rows(wr, nb, R, q, d, sb, 0, 1, v); break;             \
            case HY_Q_Q5_0: hy_dot_q4q5_rows(wr, nb, R, q, d, sb, 1, 0, v); break;             \
            default: hy_dot_q4q5_rows(wr, nb, R, q, d, sb, 1, 1, v); break;                    \
            }                                                                                  \
            for (int r = 0; r < R; r++) out[r * ldo + i] = v[r];                               \
        }                                                                                      \
    }
HY_R_CASES(HY_MULTI_ROWS)
#undef HY_MULTI_ROWS

#if defined(HY_AVX2) && !defined(HY_Q512)
/* Weight rows [o, o1) 8 at a time (hy_q45_matvec8) for R activation rows, one function per R kept
 * out of line as the AVX-512 stream kernel's */
#define HY_ROWS8(R)                                                                             \
    static __attribute__((noinline)) void hy_rows8_##R(                                        \
        const uint8_t *w, long row_bytes, long o, long o1, long nb, const int8_t *qa,          \
        const float *da, const float *sa, int five, int with_min, float *out, long ldo) {      \
        for (; o < o1; o += 8) {                                                               \
            const int W = o1 - o < 8 ? (int)(o1 - o) : 8;                                      \
            if (five) hy_q45_matvec8(w + o * row_bytes, row_bytes, W, nb, R, qa, da, sa, 1,    \
                                     with_min, out + o, ldo);                                  \
            else hy_q45_matvec8(w + o * row_bytes, row_bytes, W, nb, R, qa, da, sa, 0,         \
                                with_min, out + o, ldo);                                       \
        }                                                                                      \
    }
HY_PASS_CASES(HY_ROWS8)
#undef HY_ROWS8
#endif

/* out[r*ldo + o] = row o of w . activation row r (+ bias[o]) for o in [o0, o1), r < rows.
 * Each weight row is read from memory once and used for every activation row. */
static inline void hy_q_matvec_range(int type, const uint8_t *w, long row_bytes, long n, long o0,
                                     long o1, int rows, const int8_t *qa, const float *da,
                                     const float *sa, const float *s16, const uint8_t *prep,
                                     const float *x, const float *bias, float *out, long ldo) {
    const long nb = n / 32;
    const int multi = type == HY_Q_Q8_0 || type == HY_Q_Q4_0 || type == HY_Q_Q4_1 ||
                      type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
    const int per_pass = hy_q_table[type].rows_per_pass;  /* weight rows (quant_traits.h) */
    long o = o0;
    (void)per_pass;  /* (a portable build has no multi-row kernel) */
#if defined(HY_Q512)
    const int five = type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
    /* Q8_0 takes the 16-row kernel only where 16 rows are a short span (up to 704 values per
     * row), read as one stream; on wider rows one row at a time reads memory faster, and one
     * row's cheap integer work is no bottleneck.  The choice depends on the matrix only, never
     * on the number of activation rows. */
    const int rows16 = per_pass == 16
                       && (type != HY_Q_Q8_0 || 16 * row_bytes <= HY_Q8_ROWS16_SPAN);
#if defined(HY_Q45_STREAM)
    const int stream = hy_q45_rows16(type);
    if (stream && prep != NULL) {
        hy_q45_plan pl;
        hy_q45_plan_init(&pl, five, type == HY_Q_Q4_1 || type == HY_Q_Q5_1);
        const long pstride = hy_q_prep_bytes(n);
        if (rows <= HY_MR) {
            /* up to HY_MR activation rows this kernel reads the weights from memory faster than
             * the 16-row kernel; with more, that one reads them once for 16 rows */
            switch (rows) {  /* (R >= HY_Q45_MANY first: no "many" function for fewer rows) */
#define HY_RS(R) case R: (R >= HY_Q45_MANY && hy_q45_many(R) ? hy_q45_stream_many_##R : hy_q45_stream_range_##R)(&pl, w, row_bytes, o, o1, nb, prep, pstride, out, ldo); break;
            HY_R_CASES(HY_RS)
#undef HY_RS
            }
            hy_add_bias(bias, rows, o, o1, out, ldo);
            return;
        }
        /* more activation rows: the 16-row kernel below (the same bits) takes the whole groups
         * of 16 rows, reading the activations once per group; this one the rows past them, in
         * passes of rows shared out evenly (four rows or more each, so the arrangement of
         * hy_q45_many(rows), the activations' layout) */
        const long end = o + (o1 - o) / 16 * 16;
        const int many = hy_q45_many(rows);
        for (long i = end; i < o1; i++) {
            HY_EVEN_PASSES(rows, HY_MR, r, left) {
#define HY_RS(R) case R:                                                                        \
    if (many) hy_q45_matvec_stream(&pl, w + i * row_bytes, 0, 1, nb, R, 1, prep + r * pstride, pstride, out + r * ldo + i, 0, ldo); \
    else hy_q45_matvec_stream(&pl, w + i * row_bytes, 0, 1, nb, R, 0, prep + r * pstride, pstride, out + r * ldo + i, 0, ldo);      \
    break;
                switch (left) { HY_R_CASES(HY_RS) }
#undef HY_RS
            }
            hy_add_bias(bias, rows, i, i + 1, out, ldo);
        }
        o1 = end;
    }
#endif
    if (rows16 && qa != NULL) {  /* 16 weight rows per pass */
        const int mn = type == HY_Q_Q4_1 || type == HY_Q_Q5_1;
        const long end = o + (o1 - o) / 16 * 16;
        /* up to HY_PASS_ROWS activation rows: one call over every group of 16 weight rows; more:
         * each group for the rows in as few passes as that allows, shared out evenly (the
         * passes after the first find its weights in L1) */
        const long span = rows <= HY_PASS_ROWS ? end - o : 16;
        for (long og = o; og < end; og += span)
            HY_EVEN_PASSES(rows, HY_PASS_ROWS, r, left) {
#define HY_R16(R) case R: hy_rows16_##R(type, w, row_bytes, og, og + span, nb, qa + r * n, da + r * nb, sa + r * nb, five, mn, out + r * ldo, ldo); break;
                switch (left) { HY_PASS_CASES(HY_R16) }
#undef HY_R16
            }
        hy_add_bias(bias, rows, o, end, out, ldo);
        o = end;
    }
    /* Q4_K / Q5_K / Q6_K: several activation rows take one weight row per pass, unpacked once
     * for up to HY_K_MAX_R of them (the rows shared out evenly over the fewest passes); one
     * activation row takes two weight rows per pass, which share its loads and arrangement
     * (the odd row left over takes the one-row path).  Each pair takes the operations of a
     * single row (the same bits). */
#define HY_K_PASSES(CASE)                                                                       \
    HY_EVEN_PASSES(rows, HY_K_MAX_R, r, left) {                                                 \
        switch (left) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) }                       \
    }
    if (per_pass == 2 && qa != NULL && type == HY_Q_Q6_K && rows > 1) {
        for (; o < o1; o++) {
#define HY_R6(R) case R: hy_dot_q6_k_512_rows(w + o * row_bytes, 0, 1, n / 256, R, qa + r * n, n, \
                                              da + r * nb, s16 + 2 * r * nb, nb, out + r * ldo + o, ldo); break;
            HY_K_PASSES(HY_R6)
#undef HY_R6
            hy_add_bias(bias, rows, o, o + 1, out, ldo);
        }
    }
    if (per_pass == 2 && qa != NULL && (type == HY_Q_Q4_K || type == HY_Q_Q5_K) && rows > 1) {
        const int pf_l2 = hy_q_kquant_pf_l2(n), five = type == HY_Q_Q5_K;
        for (; o < o1; o++) {
#define HY_RK(R) case R: \
            if (five) hy_dot_q45_k_512_rows(w + o * row_bytes, 0, 1, n / 256, R, qa + r * n, n, da + r * nb, sa + r * nb, nb, 1, pf_l2, out + r * ldo + o, ldo); \
            else hy_dot_q45_k_512_rows(w + o * row_bytes, 0, 1, n / 256, R, qa + r * n, n, da + r * nb, sa + r * nb, nb, 0, pf_l2, out + r * ldo + o, ldo); \
            break;
            HY_K_PASSES(HY_RK)
#undef HY_RK
            hy_add_bias(bias, rows, o, o + 1, out, ldo);
        }
    }
#undef HY_K_PASSES
    if (per_pass == 2 && qa != NULL) {
        const int pf_l2 = hy_q_kquant_pf_l2(n);
        for (; o + 2 <= o1; o += 2)
            for (int r = 0; r < rows; r++) {
                float v[2];
                if (type == HY_Q_Q6_K)
                    hy_dot_q6_k_512_rows(w + o * row_bytes, row_bytes, 2, n / 256, 1, qa + r * n, 0,
                                         da + r * nb, s16 + 2 * r * nb, 0, v, 1);
                else if (type == HY_Q_Q5_K)  /* (five a constant in each call) */
                    hy_dot_q45_k_512_rows(w + o * row_bytes, row_bytes, 2, n / 256, 1, qa + r * n, 0,
                                          da + r * nb, sa + r * nb, 0, 1, pf_l2, v, 1);
                else
                    hy_dot_q45_k_512_rows(w + o * row_bytes, row_bytes, 2, n / 256, 1, qa + r * n, 0,
                                          da + r * nb, sa + r * nb, 0, 0, pf_l2, v, 1);
                for (int i = 0; i < 2; i++) out[r * ldo + o + i] = v[i] + (bias ? bias[o + i] : 0.0f);
            }
    }
#endif
#if defined(HY_HALF_KERNEL)
    /* F16 / BF16 / F32 (hy_half_rows; hy_half_rows_256 with AVX2's sixteen registers): W weight
     * rows per pass for up to six activation rows at once, so the weights stream in one pass
     * and prefetch as they go; more rows take passes of six, the first pass prefetching.
     * AVX-512: one or two activation rows take four weight rows, three to six two; AVX2: one
     * row four weight rows, two rows two, three to six one. */
    if (per_pass == 4 && x != NULL) {
#if defined(HY_HALF512)
        const int W = rows <= 2 ? 4 : 2;
#else
        const int W = rows == 1 ? 4 : rows == 2 ? 2 : 1;
#endif
        for (; o + W <= o1; o += W) {
            float *op = out + o;
            const uint8_t *wo = w + o * row_bytes;
            for (int r = 0; r < rows; r += 6) {
                const int pf = r == 0, left = rows - r < 6 ? rows - r : 6;
#define HY_HALF_PASS(WW, R)                                                                      \
                case 8 * WW + R: if (WW * R <= HY_HALF_PAIRS) {                                         \
                    if (type == HY_Q_BF16) HY_HALF_KERNEL(wo, row_bytes, WW, n, x + r * n, n, R, HY_HALF_BF16, pf, op + r * ldo, ldo); \
                    else if (type == HY_Q_F32) HY_HALF_KERNEL(wo, row_bytes, WW, n, x + r * n, n, R, HY_HALF_F32, pf, op + r * ldo, ldo); \
                    else HY_HALF_KERNEL(wo, row_bytes, WW, n, x + r * n, n, R, HY_HALF_F16, pf, op + r * ldo, ldo); \
                } break;
                switch (8 * W + left) {
                    HY_HALF_PASS(4, 1) HY_HALF_PASS(4, 2)
                    HY_HALF_PASS(2, 1) HY_HALF_PASS(2, 2) HY_HALF_PASS(2, 3) HY_HALF_PASS(2, 4)
                    HY_HALF_PASS(2, 5) HY_HALF_PASS(2, 6)
                    HY_HALF_PASS(1, 1) HY_HALF_PASS(1, 2) HY_HALF_PASS(1, 3) HY_HALF_PASS(1, 4)
                    HY_HALF_PASS(1, 5) HY_HALF_PASS(1, 6)
                }
#undef HY_HALF_PASS
            }
            hy_add_bias(bias, rows, o, o + W, out, ldo);
        }
    }
#endif
#if defined(HY_AVX2) && !defined(HY_Q512)
    /* Q4_K / Q5_K and Q6_K for several activation rows: each weight row unpacked once for up to
     * four of them; one activation row takes two weight rows per pass, which share its loads
     * (the odd row left over takes the one-row path).  Each pair of a weight row and an
     * activation row takes the operations of a single row (the same bits). */
    if ((type == HY_Q_Q4_K || type == HY_Q_Q5_K || type == HY_Q_Q6_K) && rows == 1 && qa != NULL) {
        for (; o + 2 <= o1; o += 2) {
            float v[2];
            const uint8_t *wr = w + o * row_bytes;
            if (type == HY_Q_Q6_K) hy_dot_q6_k_avx2_rows(wr, row_bytes, 2, n / 256, 1, qa, 0, da, s16, 0, v, 1);
            else if (type == HY_Q_Q5_K) hy_dot_q45_k_avx2_rows(wr, row_bytes, 2, n / 256, 1, qa, 0, da, sa, 0, 1, v, 1);
            else hy_dot_q45_k_avx2_rows(wr, row_bytes, 2, n / 256, 1, qa, 0, da, sa, 0, 0, v, 1);
            for (int i = 0; i < 2; i++) out[o + i] = v[i] + (bias ? bias[o + i] : 0.0f);
        }
    }
    if ((type == HY_Q_Q4_K || type == HY_Q_Q5_K || type == HY_Q_Q6_K) && rows > 1 && qa != NULL) {
        for (; o < o1; o++) {
            const uint8_t *wr = w + o * row_bytes;
            for (int r = 0; r < rows; r += 4) {
                const int left = rows - r < 4 ? rows - r : 4;
#define HY_RK2(R) case R: \
                if (type == HY_Q_Q6_K) hy_dot_q6_k_avx2_rows(wr, 0, 1, n / 256, R, qa + r * n, n, da + r * nb, s16 + 2 * r * nb, nb, out + r * ldo + o, ldo); \
                else if (type == HY_Q_Q5_K) hy_dot_q45_k_avx2_rows(wr, 0, 1, n / 256, R, qa + r * n, n, da + r * nb, sa + r * nb, nb, 1, out + r * ldo + o, ldo); \
                else hy_dot_q45_k_avx2_rows(wr, 0, 1, n / 256, R, qa + r * n, n, da + r * nb, sa + r * nb, nb, 0, out + r * ldo + o, ldo); \
                break;
                switch (left) { HY_RK2(1) HY_RK2(2) HY_RK2(3) HY_RK2(4) }
#undef HY_RK2
            }
            hy_add_bias(bias, rows, o, o + 1, out, ldo);
        }
        return;
    }
    /* Q4_0 / Q4_1 / Q5_0 / Q5_1: 8 weight rows per pass, every row (hy_q45_matvec8) */
    if (per_pass == 8 && qa != NULL) {
        const int mn = type == HY_Q_Q4_1 || type == HY_Q_Q5_1;
        const int five = type == HY_Q_Q5_0 || type == HY_Q_Q5_1;
        /* up to HY_PASS_ROWS activation rows: one call over every weight row; more: each group
         * of 8 weight rows for the rows in as few passes as that allows, shared out evenly */
        const long span = rows <= HY_PASS_ROWS ? o1 - o : 8;
        for (long og = o; og < o1; og += span)
            HY_EVEN_PASSES(rows, HY_PASS_ROWS, r, left) {
#define HY_R8(R) case R: hy_rows8_##R(w, row_bytes, og, og + span < o1 ? og + span : o1, nb, qa + r * n, da + r * nb, sa + r * nb, five, mn, out + r * ldo, ldo); break;
                switch (left) { HY_PASS_CASES(HY_R8) }
#undef HY_R8
            }
        hy_add_bias(bias, rows, o, o1, out, ldo);
        return;
    }
#endif
#if defined(HY_Q512)
    /* Q8_0 for several activation rows: the prepared activations (hy_q8_prep), up to HY_MR
     * activation rows per pass over each weight row (the same bits as the one-row dot) */
    if (type == HY_Q_Q8_0 && rows > 1 && prep != NULL && hy_q_prep_fits(n)) {
        const long pstride = hy_q_prep_bytes(n);
        const uint8_t *p8 = prep + hy_q_prep_at(HY_PREP_Q8, n);
#define HY_CHUNK(R, r)                                                                         \
    for (long i_ = o; i_ < oe_; i_++)                                                          \
        hy_q8_0_rows_prep(w + i_ * row_bytes, nb, R, p8 + (r) * pstride, pstride,              \
                          out + (r) * ldo + i_, ldo)
        HY_CHUNK_LOOP
#undef HY_CHUNK
        return;
    }
#endif
    /* several activation rows: the multi-row dot products, chunk by chunk (the weight rows in
     * cache again for the passes after the first) */
    if (multi && rows > 1) {
#define HY_CHUNK(R, r) hy_multi_rows_##R(type, w, row_bytes, o, oe_, nb, qa + (r) * n, da + (r) * nb, \
                                         sa + (r) * nb, out + (r) * ldo, ldo)
        HY_CHUNK_LOOP
#undef HY_CHUNK
        return;
    }
    const hy_q_dot_fn dot = hy_q_table[type].dot;
    for (; o < o1; o++) {
        const uint8_t *wr = w + o * row_bytes;
        const float bo = bias ? bias[o] : 0.0f;
        for (int r = 0; r < rows; r++)
            out[r * ldo + o] = dot(wr, n, qa ? qa + r * n : NULL, da ? da + r * nb : NULL,
                                   sa ? sa + r * nb : NULL, s16 ? s16 + 2 * r * nb : NULL,
                                   x ? x + r * n : NULL) + bo;
    }
}

#endif
