/* Row kernels of the decoder layer in plain C, shared by the Cython wrappers (elementwise.pyx)
 * and the fused decode step of quantized layers (quant.pyx):
 *
 *   hy_rmsnorm_row   out = x / sqrt(mean(x^2) + eps) * weight       (out may be x)
 *   hy_rope_angles   cos/sin [D/2] of one position's RoPE angles, formed in float64 (the costly
 *                    part, 2*D/2 libm calls: callers form them once per position and step)
 *   hy_rope_apply    rotate the heads of one row by them (neox: pairs (i, i + D/2); gptj:
 *                    pairs (2i, 2i + 1))
 */
#ifndef HYBRID_ROWOPS_H
#define HYBRID_ROWOPS_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

static inline void hy_rmsnorm_row(const float *x, const float *weight, float eps, float *out,
                                  long dim) {
    const float inv = (float)(1.0 / sqrt((double)(hy_dot(x, x, dim) / (float)dim + eps)));
    for (long d = 0; d < dim; d++) out[d] = (x[d] * inv) * weight[d];
}

/* cs[i] = cos(position * inv_freq[i]), sn[i] = sin(...) for i < half, angles in float64 */
static inline void hy_rope_angles(int64_t position, const double *inv_freq, int half, float *cs,
                                  float *sn) {
    for (int i = 0; i < half; i++) {
        const double ang = (double)position * inv_freq[i];
        cs[i] = (float)cos(ang);
        sn[i] = (float)sin(ang);
    }
}

/* rotate the heads of one row by the angles cs, sn [head_dim / 2] */
static inline void hy_rope_apply(float *x, int num_heads, int head_dim, int neox, const float *cs,
                                 const float *sn) {
    const int half = head_dim / 2;
    for (int h = 0; h < num_heads; h++) {
        float *v = x + (long)h * head_dim;
        if (neox) {
            for (int i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                const float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * cs[i] - b * sn[i];
                v[2 * i + 1] = b * cs[i] + a * sn[i];
            }
        }
    }
}

#endif
