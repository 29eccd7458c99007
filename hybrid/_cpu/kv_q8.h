/* The q8_0 KV cache's block layout, and its writer and reader.
 *
 * A q8_0 cache row is ggml's Q8_0 (simd.h's hy_q8_row): per 32 values a float16 factor and 32
 * int8 values.  Inside a cache block the rows of one KV head (bs rows of D = 32*nb values, the
 * same bs * nb * 34 bytes as bs ggml rows) are stored by plane, so the attention passes load
 * sixteen rows' factors, or sixteen keys' values, with one load and no transposes or gathers:
 *
 *   factors  uint16 [nb][bs]      at byte 0: block b of row j at element b*bs + j
 *   values   at byte 2*nb*bs:
 *     K      int8 [D/4][bs][4]    values 4i..4i+3 of row j at byte (i*bs + j)*4: one 64-byte
 *                                 load holds four values of sixteen keys, as the integer score
 *                                 passes take them
 *     V      int8 [bs][D]         row j's values contiguous, as the value passes take them
 *
 * hybrid/kvpool.py's q8_block_rows reads a block back as ggml rows (tests, debugging). */
#ifndef HYBRID_KV_Q8_H
#define HYBRID_KV_Q8_H

#include <stdint.h>
#include <string.h>

#include "simd.h"

/* the factor plane of one KV head's rows, and where its values start */
static inline const uint16_t *hy_q8kv_factors(const void *head) { return (const uint16_t *)head; }
static inline const int8_t *hy_q8kv_values(const void *head, int D, int bs) {
    return (const int8_t *)head + 2L * (D / 32) * bs;
}

/* x [D] float32 quantized (hy_q8_row) into row `slot` of one KV head's K (key != 0) or V rows */
static inline void hy_q8kv_store(int key, const float *x, void *head, int slot, int bs, int D) {
    const int nb = D / 32;
    uint8_t row[34 * 16]; /* D <= 512 in one go; longer rows block by block */
    uint16_t *f = (uint16_t *)head;
    int8_t *val = (int8_t *)head + 2L * nb * bs;
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int m = nb - b0 < 16 ? nb - b0 : 16;
        hy_q8_row(x + 32L * b0, row, 32L * m);
        for (int b = 0; b < m; b++) {
            const uint8_t *blk = row + 34 * b;
            memcpy(f + (long)(b0 + b) * bs + slot, blk, 2);
            for (int i = 0; i < 8; i++) { /* four values at a time: column 8*(b0+b) + i */
                const long col = 8L * (b0 + b) + i;
                if (key) memcpy(val + (col * bs + slot) * 4, blk + 2 + 4 * i, 4);
                else memcpy(val + (long)slot * D + 4 * col, blk + 2 + 4 * i, 4);
            }
        }
    }
}

/* rows j0 .. j0+c-1 of one KV head's K (key != 0) or V rows -> float32 [c, D] (value times
 * factor, as the SIMD passes widen them) */
static inline void hy_q8kv_to_f32(int key, const void *head, int bs, int j0, int c, int D,
                                  float *dst) {
    const int nb = D / 32;
    const uint16_t *f = hy_q8kv_factors(head);
    const int8_t *val = hy_q8kv_values(head, D, bs);
    for (int j = j0; j < j0 + c; j++, dst += D)
        for (int b = 0; b < nb; b++) {
            uint16_t h = f[(long)b * bs + j];
            const float d = hy_half_to_float(h);
            for (int t = 32 * b; t < 32 * b + 32; t++) {
                const int8_t q = key ? val[((long)(t >> 2) * bs + j) * 4 + (t & 3)] : val[(long)j * D + t];
                dst[t] = (float)q * d;
            }
        }
}

#endif /* HYBRID_KV_Q8_H */
