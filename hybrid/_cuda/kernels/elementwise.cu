// Row kernels of the decoder layer on the GPU (float32 activations).
//   hybrid_rmsnorm_f32   one block per row: out = x / sqrt(mean(x^2) + eps) * w
//   hybrid_rope_f32      one thread per rotated pair; ROPE_NEOX=1 pairs (i, i+D/2), 0 pairs (2i, 2i+1)
//   hybrid_swiglu_f32    out = silu(gate) * up
//   hybrid_add_f32       out = a + b
//   hybrid_copy_f32      out = a
#include "common.cuh"

#ifndef ROPE_NEOX
#define ROPE_NEOX 1
#endif

extern "C" __global__ void hybrid_rmsnorm_f32(const float *__restrict__ x,  // [rows, dim]
                                              const float *__restrict__ w,  // [dim]
                                              float *__restrict__ out,      // [rows, dim]
                                              int dim, float eps) {
    __shared__ float red[32];
    const long row = blockIdx.x;
    const float *xr = x + row * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = hy_block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[row * dim + i] = xr[i] * inv * w[i];
}

extern "C" __global__ void hybrid_rope_f32(float *__restrict__ x,              // [rows, heads*D]
                                           const long long *__restrict__ pos,  // [rows]
                                           const double *__restrict__ inv_freq, // [D/2]
                                           int rows, int heads, int head_dim) {
    const int half = head_dim / 2;
    const long total = (long)rows * heads * half;
    for (long t = (long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const long rh = t / half;  // row * heads + head
        const long row = rh / heads;
        float s, c;
        hy_rope_sincos(pos[row], inv_freq[i], &s, &c);
        float *v = x + rh * head_dim;
#if ROPE_NEOX
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
#else
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = b * c + a * s;
#endif
    }
}

extern "C" __global__ void hybrid_swiglu_f32(const float *__restrict__ gate,
                                             const float *__restrict__ up,
                                             float *__restrict__ out, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + __expf(-g)) * up[i];
    }
}

extern "C" __global__ void hybrid_add_f32(const float *__restrict__ a, const float *__restrict__ b,
                                          float *__restrict__ out, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

extern "C" __global__ void hybrid_copy_f32(const float *__restrict__ a, float *__restrict__ out,
                                           long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long)gridDim.x * blockDim.x)
        out[i] = a[i];
}
