// Shared helpers of hybrid's CUDA kernels.  No CUDA headers are needed: float16 conversions are
// inline PTX, so NVRTC alone compiles every kernel.
#pragma once

typedef unsigned short hy_half;       // IEEE binary16 bits
typedef unsigned long long hy_u64;    // device pointers in block tables

#define HY_NEG_INF (-__int_as_float(0x7f800000))

#ifdef HY_HOST_EMULATION  // tests/cuda_host/emulator.h runs the kernels on CPU threads
__device__ __forceinline__ float hy_h2f(hy_half h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

__device__ __forceinline__ hy_half hy_f2h(float f) {
    _Float16 v = (_Float16)f;  // round to nearest even, as cvt.rn
    hy_half h;
    memcpy(&h, &v, 2);
    return h;
}
#else
__device__ __forceinline__ float hy_h2f(hy_half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ hy_half hy_f2h(float f) {
    hy_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

__device__ __forceinline__ float hy_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float hy_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float hy_block_sum(float v, float *shared32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = hy_warp_sum(v);
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    const int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? shared32[lane] : 0.0f;
    v = hy_warp_sum(v);
    __syncthreads();
    return v;
}

// sin and cos of the RoPE angle pos * inv_freq.  The angle is formed and reduced to [-pi, pi] in
// double (a float product is off by ~2e-3 rad at position 32k), then evaluated in float, where
// the fast intrinsics are accurate to ~5e-7 on that range.
__device__ __forceinline__ void hy_rope_sincos(long long pos, double inv_freq, float *s, float *c) {
    double a = (double)pos * inv_freq;
    a -= rint(a * 0.15915494309189535) * 6.283185307179586;
    sincosf((float)a, s, c);
}
