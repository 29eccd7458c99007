// Append K/V rows to a paged cache layer, converting to the cache's element type.
//   hybrid_kv_append_f32 / hybrid_kv_append_f16 (KV_F16=1)           n rows of one sequence
//   hybrid_kv_append_batch_f32 / hybrid_kv_append_batch_f16           row b to sequence b
// Block layout as on the CPU (hybrid/kvcache.py): a block holds [kv_heads, 2, block_size, D];
// k_ptrs[b] / v_ptrs[b] address the K / V rows of head 0 of block b; heads are head_stride apart.
#include "common.cuh"

#ifndef KV_F16
#define KV_F16 0
#endif
#if KV_F16
typedef hy_half kv_t;
__device__ __forceinline__ kv_t to_kv(float f) { return hy_f2h(f); }
#define KV_NAME hybrid_kv_append_f16
#define KV_BATCH_NAME hybrid_kv_append_batch_f16
#else
typedef float kv_t;
__device__ __forceinline__ kv_t to_kv(float f) { return f; }
#define KV_NAME hybrid_kv_append_f32
#define KV_BATCH_NAME hybrid_kv_append_batch_f32
#endif

extern "C" __global__ void KV_NAME(const float *__restrict__ k,      // [n, kv_heads*D]
                                   const float *__restrict__ v,      // [n, kv_heads*D]
                                   const hy_u64 *__restrict__ k_ptrs,  // [blocks]
                                   const hy_u64 *__restrict__ v_ptrs,  // [blocks]
                                   int n, long long start, int kv_heads, int head_dim,
                                   int block_size, long long head_stride) {
    const long total = (long)n * kv_heads * head_dim;
    for (long t = (long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        const int d = (int)(t % head_dim);
        const int h = (int)((t / head_dim) % kv_heads);
        const long row = t / ((long)head_dim * kv_heads);
        const long long p = start + row;
        const long long b = p / block_size, slot = p % block_size;
        const long long off = (long long)h * head_stride + slot * head_dim + d;
        ((kv_t *)k_ptrs[b])[off] = to_kv(k[t]);
        ((kv_t *)v_ptrs[b])[off] = to_kv(v[t]);
    }
}

// One decode token per sequence: row b of k, v goes to position positions[b] of sequence b, whose
// block tables live at k_tables[b] / v_tables[b] (device addresses).
extern "C" __global__ void KV_BATCH_NAME(const float *__restrict__ k,          // [B, kv_heads*D]
                                         const float *__restrict__ v,          // [B, kv_heads*D]
                                         const hy_u64 *__restrict__ k_tables,  // [B]
                                         const hy_u64 *__restrict__ v_tables,  // [B]
                                         const long long *__restrict__ positions,  // [B]
                                         int batch, int kv_heads, int head_dim, int block_size,
                                         long long head_stride) {
    const long total = (long)batch * kv_heads * head_dim;
    for (long t = (long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        const int d = (int)(t % head_dim);
        const int h = (int)((t / head_dim) % kv_heads);
        const long row = t / ((long)head_dim * kv_heads);
        const long long p = positions[row];
        const long long b = p / block_size, slot = p % block_size;
        const long long off = (long long)h * head_stride + slot * head_dim + d;
        ((kv_t *)((const hy_u64 *)k_tables[row])[b])[off] = to_kv(k[t]);
        ((kv_t *)((const hy_u64 *)v_tables[row])[b])[off] = to_kv(v[t]);
    }
}
