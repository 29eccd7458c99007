// out = x @ W.T (+ bias) (+ residual) with W stored [out_features, in_features] like
// torch.nn.Linear; `residual` may be `out` itself (each element is read, then written, by one
// thread).
//   hybrid_gemv_f32   decode-sized x (a few rows): one warp per output row streams that W row once
//                     with 16-byte loads and serves every row of x
//   hybrid_gemv_split3_f32   the same over stacked Q/K/V weights, writing three outputs
//   hybrid_gemv_swiglu_f32   the same over stacked gate/up weights, writing silu(gate) * up
//   hybrid_gemm_f32   prefill-sized x: 64x64 output tiles, 16-wide K slices in shared memory
#include "common.cuh"

#ifndef GEMV_MAX_ROWS
#define GEMV_MAX_ROWS 8
#endif

// Dot products of weight row `wr` [in_f] with every row of x [rows, in_f], summed over the
// warp: acc[r] holds row r's result in every lane.
__device__ __forceinline__ void gemv_row(const float *__restrict__ x, const float *__restrict__ wr,
                                         int rows, int in_f, float *acc) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; r++) acc[r] = 0.0f;
    const bool vec = (in_f % 4 == 0) && (((unsigned long long)wr & 15) == 0) &&
                     (((unsigned long long)x & 15) == 0);
    if (vec) {
        const float4 *w4 = (const float4 *)wr;
#pragma unroll 4
        for (int i = lane; i < in_f / 4; i += 32) {
            const float4 a = w4[i];
#pragma unroll
            for (int r = 0; r < GEMV_MAX_ROWS; r++) {
                if (r < rows) {
                    const float4 b = ((const float4 *)(x + (long)r * in_f))[i];
                    acc[r] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
            }
        }
    } else {
        for (int i = lane; i < in_f; i += 32) {
            const float a = wr[i];
#pragma unroll
            for (int r = 0; r < GEMV_MAX_ROWS; r++)
                if (r < rows) acc[r] += a * x[(long)r * in_f + i];
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; r++)
        if (r < rows) acc[r] = hy_warp_sum(acc[r]);
}

extern "C" __global__ void hybrid_gemv_f32(const float *__restrict__ x,     // [rows, in]
                                           const float *__restrict__ w,     // [out, in]
                                           const float *__restrict__ bias,  // [out] or null
                                           const float *residual,           // [rows, out] or null
                                           float *out,                      // [rows, out]
                                           int rows, int in_f, int out_f) {
    const int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= out_f) return;
    float acc[GEMV_MAX_ROWS];
    gemv_row(x, w + (long)o * in_f, rows, in_f, acc);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < GEMV_MAX_ROWS; r++)
            if (r < rows) {
                const long i = (long)r * out_f + o;
                out[i] = acc[r] + (bias ? bias[o] : 0.0f) + (residual ? residual[i] : 0.0f);
            }
    }
}

// The Q, K and V projections in one pass: w stacks [n0 + n1 + n2, in] rows, output feature o
// goes to out0 [rows, n0], out1 [rows, n1] or out2 [rows, n2].
extern "C" __global__ void hybrid_gemv_split3_f32(const float *__restrict__ x,
                                                  const float *__restrict__ w,
                                                  const float *__restrict__ bias,  // or null
                                                  float *__restrict__ out0,
                                                  float *__restrict__ out1,
                                                  float *__restrict__ out2, int rows, int in_f,
                                                  int n0, int n1, int n2) {
    const int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= n0 + n1 + n2) return;
    float acc[GEMV_MAX_ROWS];
    gemv_row(x, w + (long)o * in_f, rows, in_f, acc);
    float *dst;
    int n, c;
    if (o < n0) {
        dst = out0, n = n0, c = o;
    } else if (o < n0 + n1) {
        dst = out1, n = n1, c = o - n0;
    } else {
        dst = out2, n = n2, c = o - n0 - n1;
    }
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < GEMV_MAX_ROWS; r++)
            if (r < rows) dst[(long)r * n + c] = acc[r] + (bias ? bias[o] : 0.0f);
    }
}

// The gate and up projections and SwiGLU in one pass: w stacks [2 * inter, in] rows (gate
// rows, then up rows); out [rows, inter] = silu(x @ gate.T) * (x @ up.T).
extern "C" __global__ void hybrid_gemv_swiglu_f32(const float *__restrict__ x,
                                                  const float *__restrict__ w,
                                                  float *__restrict__ out, int rows, int in_f,
                                                  int inter) {
    const int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= inter) return;
    float g[GEMV_MAX_ROWS], u[GEMV_MAX_ROWS];
    gemv_row(x, w + (long)o * in_f, rows, in_f, g);
    gemv_row(x, w + (long)(inter + o) * in_f, rows, in_f, u);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < GEMV_MAX_ROWS; r++)
            if (r < rows) out[(long)r * inter + o] = g[r] / (1.0f + __expf(-g[r])) * u[r];
    }
}

#define TILE 64
#define KSLICE 16

extern "C" __global__ void hybrid_gemm_f32(const float *__restrict__ x,     // [m, k]
                                           const float *__restrict__ w,     // [n, k]
                                           const float *__restrict__ bias,  // [n] or null
                                           const float *residual,           // [m, n] or null
                                           float *out,                      // [m, n]
                                           int m, int n, int k) {
    __shared__ float xs[KSLICE][TILE + 1];
    __shared__ float ws[KSLICE][TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 256 threads, 4x4 outputs each
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += KSLICE) {
        for (int t = threadIdx.x; t < TILE * KSLICE; t += blockDim.x) {
            const int r = t / KSLICE, c = t % KSLICE;
            const int gr = row0 + r, gc = col0 + r, gk = k0 + c;
            xs[c][r] = (gr < m && gk < k) ? x[(long)gr * k + gk] : 0.0f;
            ws[c][r] = (gc < n && gk < k) ? w[(long)gc * k + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < KSLICE; c++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[c][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = ws[c][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = row0 + ty * 4 + i;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = col0 + tx * 4 + j;
            if (c < n) {
                const long idx = (long)r * n + c;
                out[idx] = acc[i][j] + (bias ? bias[c] : 0.0f) + (residual ? residual[idx] : 0.0f);
            }
        }
    }
}
