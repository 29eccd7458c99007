/* The per-format traits table: each format's layout, row decoding, one-row dot product and the
 * weight rows one pass of this build's mat-vec reads, chosen once per format and build.  Python
 * reads it through quant.kernel_traits() (hybrid/quant/formats.py holds the same layouts).
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_TRAITS_H
#define HYBRID_QUANT_TRAITS_H

/* Weight rows one pass of the mat-vec's multi-row kernel reads, per build (quant_matvec.h):
 * AVX-512 VNNI: 16 for Q4_0 / Q4_1, Q5_0 / Q5_1 (with BITALG) and Q8_0 (where 16 rows span at
 * most HY_Q8_ROWS16_SPAN bytes), 2 for the K formats, 4 for F16 / BF16; AVX2: 8 for Q4_0 / Q4_1
 * / Q5_0 / Q5_1; else 1. */
#define HY_Q8_ROWS16_SPAN 12288
#if defined(HY_Q512)
#define HY_Q4_ROWS 16
#if defined(__AVX512BITALG__)
#define HY_Q5_ROWS 16
#else
#define HY_Q5_ROWS 1
#endif
#define HY_Q8_ROWS 16
#define HY_K_ROWS 2
#elif defined(HY_AVX2)
#define HY_Q4_ROWS 8
#define HY_Q5_ROWS 8
#define HY_Q8_ROWS 1
#define HY_K_ROWS 2
#else
#define HY_Q4_ROWS 1
#define HY_Q5_ROWS 1
#define HY_Q8_ROWS 1
#define HY_K_ROWS 1
#endif
#if defined(HY_HALF_KERNEL)
#define HY_HALF_ROWS 4
#else
#define HY_HALF_ROWS 1
#endif

/* one weight row of n values . one activation row: qa/da/sa/s16 (hy_q_act) for the integer
 * formats, x (float32) for F16 / BF16 / F32 */
typedef float (*hy_q_dot_fn)(const uint8_t *w, long n, const int8_t *qa, const float *da,
                             const float *sa, const float *s16, const float *x);
/* y[0..n) = the n values of a row (n a multiple of the block size) */
typedef void (*hy_q_decode_fn)(const uint8_t *row, float *y, long n);

typedef struct {
    const char *name;           /* as hybrid/quant/formats.py names it */
    int block_values;           /* values per block (0: not a stored format) */
    int block_bytes;            /* bytes per block */
    int integer;                /* dot products on 8-bit activations (else widen and FMA) */
    hy_q_decode_fn decode_row;  /* exactly as gguf.quants decodes */
    hy_q_dot_fn dot;
    int rows_per_pass;          /* weight rows per pass of the mat-vec (see above) */
} hy_q_traits;

static void hy_decode_row_f16(const uint8_t *row, float *y, long n) {
    hy_f16_to_f32((const uint16_t *)row, y, n);
}

static void hy_decode_row_bf16(const uint8_t *row, float *y, long n) {
    for (long i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)((const uint16_t *)row)[i] << 16;
        memcpy(y + i, &bits, 4);
    }
}

static inline void hy_decode_q4_k(const uint8_t *b, float *y) { hy_decode_q45_k(b, y, 0); }
static inline void hy_decode_q5_k(const uint8_t *b, float *y) { hy_decode_q45_k(b, y, 1); }

/* a block format's row decoder: block after block */
#define HY_DECODE_BLOCKS(fmt, values, bytes)                                   \
    static void hy_decode_row_##fmt(const uint8_t *row, float *y, long n) {    \
        for (long i = 0; i < n / (values); i++)                                \
            hy_decode_##fmt(row + i * (bytes), y + (values) * i);              \
    }
HY_DECODE_BLOCKS(q8_0, 32, 34)
HY_DECODE_BLOCKS(q4_0, 32, 18)
HY_DECODE_BLOCKS(q4_1, 32, 20)
HY_DECODE_BLOCKS(q5_0, 32, 22)
HY_DECODE_BLOCKS(q5_1, 32, 24)
HY_DECODE_BLOCKS(q4_k, 256, 144)
HY_DECODE_BLOCKS(q5_k, 256, 176)
HY_DECODE_BLOCKS(q6_k, 256, 210)
HY_DECODE_BLOCKS(q2_k, 256, 84)
HY_DECODE_BLOCKS(q3_k, 256, 110)
HY_DECODE_BLOCKS(iq4_nl, 32, 18)
HY_DECODE_BLOCKS(iq4_xs, 256, 136)
#undef HY_DECODE_BLOCKS

/* a format's one-row dot product in the table's signature */
#define HY_DOT_ROW(fmt, expr)                                                           \
    static float hy_dot_row_##fmt(const uint8_t *w, long n, const int8_t *qa,           \
                                  const float *da, const float *sa, const float *s16,   \
                                  const float *x) {                                     \
        (void)qa, (void)da, (void)sa, (void)s16, (void)x;                               \
        return expr;                                                                    \
    }
HY_DOT_ROW(f16, hy_dot_half(w, n, x, 0))
HY_DOT_ROW(bf16, hy_dot_half(w, n, x, 1))
HY_DOT_ROW(q8_0, hy_dot_q8_0(w, n / 32, qa, da))
HY_DOT_ROW(q4_0, hy_dot_q4q5(w, n / 32, qa, da, sa, 0, 0))
HY_DOT_ROW(q4_1, hy_dot_q4q5(w, n / 32, qa, da, sa, 0, 1))
HY_DOT_ROW(q5_0, hy_dot_q4q5(w, n / 32, qa, da, sa, 1, 0))
HY_DOT_ROW(q5_1, hy_dot_q4q5(w, n / 32, qa, da, sa, 1, 1))
HY_DOT_ROW(q4_k, hy_dot_q45_k(w, n / 256, qa, da, sa, 0))
HY_DOT_ROW(q5_k, hy_dot_q45_k(w, n / 256, qa, da, sa, 1))
HY_DOT_ROW(q6_k, hy_dot_q6_k(w, n / 256, qa, da, s16))
HY_DOT_ROW(q2_k, hy_dot_q2_k(w, n / 256, qa, da, s16))
HY_DOT_ROW(q3_k, hy_dot_q3_k(w, n / 256, qa, da, s16))
HY_DOT_ROW(iq4_nl, hy_dot_iq4_nl(w, n / 32, qa, da))
HY_DOT_ROW(iq4_xs, hy_dot_iq4_xs(w, n / 256, qa, da))
HY_DOT_ROW(f32, hy_dot_f32(w, n, x))
#undef HY_DOT_ROW

/* indexed by the HY_Q_* code; F32 rows serve only the mat-vec's own float32 path */
static const hy_q_traits hy_q_table[HY_Q_LAST + 1] = {
    [HY_Q_F16] = {"float16", 1, 2, 0, hy_decode_row_f16, hy_dot_row_f16, HY_HALF_ROWS},
    [HY_Q_BF16] = {"bfloat16", 1, 2, 0, hy_decode_row_bf16, hy_dot_row_bf16, HY_HALF_ROWS},
    [HY_Q_Q8_0] = {"q8_0", 32, 34, 1, hy_decode_row_q8_0, hy_dot_row_q8_0, HY_Q8_ROWS},
    [HY_Q_Q4_0] = {"q4_0", 32, 18, 1, hy_decode_row_q4_0, hy_dot_row_q4_0, HY_Q4_ROWS},
    [HY_Q_Q4_1] = {"q4_1", 32, 20, 1, hy_decode_row_q4_1, hy_dot_row_q4_1, HY_Q4_ROWS},
    [HY_Q_Q5_0] = {"q5_0", 32, 22, 1, hy_decode_row_q5_0, hy_dot_row_q5_0, HY_Q5_ROWS},
    [HY_Q_Q5_1] = {"q5_1", 32, 24, 1, hy_decode_row_q5_1, hy_dot_row_q5_1, HY_Q5_ROWS},
    [HY_Q_Q4_K] = {"q4_k", 256, 144, 1, hy_decode_row_q4_k, hy_dot_row_q4_k, HY_K_ROWS},
    [HY_Q_Q5_K] = {"q5_k", 256, 176, 1, hy_decode_row_q5_k, hy_dot_row_q5_k, HY_K_ROWS},
    [HY_Q_Q6_K] = {"q6_k", 256, 210, 1, hy_decode_row_q6_k, hy_dot_row_q6_k, HY_K_ROWS},
    [HY_Q_F32] = {"float32", 0, 0, 0, NULL, hy_dot_row_f32, HY_HALF_ROWS},
    [HY_Q_Q2_K] = {"q2_k", 256, 84, 1, hy_decode_row_q2_k, hy_dot_row_q2_k, 1},
    [HY_Q_Q3_K] = {"q3_k", 256, 110, 1, hy_decode_row_q3_k, hy_dot_row_q3_k, 1},
    [HY_Q_IQ4_NL] = {"iq4_nl", 32, 18, 1, hy_decode_row_iq4_nl, hy_dot_row_iq4_nl, 1},
    [HY_Q_IQ4_XS] = {"iq4_xs", 256, 136, 1, hy_decode_row_iq4_xs, hy_dot_row_iq4_xs, 1},
};

/* the traits of format code `type`, or NULL for an unknown code */
static inline const hy_q_traits *hy_q_traits_of(int type) {
    return type >= HY_Q_F16 && type <= HY_Q_LAST ? &hy_q_table[type] : NULL;
}

/* Values per block and bytes per block of a format (0 for an unknown code or F32). */
static inline int hy_q_block_values(int type) {
    const hy_q_traits *t = hy_q_traits_of(type);
    return t ? t->block_values : 0;
}

static inline int hy_q_block_bytes(int type) {
    const hy_q_traits *t = hy_q_traits_of(type);
    return t ? t->block_bytes : 0;
}

/* The values per activation scale that a format's dot products read (hy_q_act): its block of
 * 32 or super-block of 256 values for the integer formats, 0 for the float ones. */
static inline int hy_q_act_group(int type) {
    const hy_q_traits *t = hy_q_traits_of(type);
    return t && t->integer ? t->block_values : 0;
}

static inline void hy_q_decode_row(int type, const uint8_t *row, float *y, long n) {
    hy_q_table[type].decode_row(row, y, n);
}

static inline float hy_q_dot(int type, const uint8_t *w, long n, const int8_t *qa, const float *da,
                             const float *sa, const float *s16, const float *x) {
    return hy_q_table[type].dot(w, n, qa, da, sa, s16, x);
}

#endif
