// Paged causal attention on the GPU, float32 queries, float32 or float16 KV.
//
//   hybrid_paged_attention    one thread block per (query row, KV head, key split).  Row r
//                             belongs to sequence s = r / rows_per_seq and sits at position
//                             p = seq_pos[s] (or start_pos) + r % rows_per_seq; it sees keys 0..p
//                             of that sequence's block table.  Single-sequence prefill/decode
//                             (one table, rows_per_seq = rows) and batched decode (a table per
//                             sequence, rows_per_seq = 1) are the same launch.  All GROUP query heads of the
//                             KV head are served by each K/V load.  With one split the block writes
//                             the output; with several it writes (max, sum, acc) partials.
//   hybrid_paged_attention_merge   combines the splits of every (row, head) in fp32.
//
// Compile-time sizes: HEAD_DIM (<= 256), GROUP (query heads per KV head, <= 8), KV_F16,
// FUSED_ROPE (rotate q and each K row by its position on the fly; K is cached unrotated),
// ROPE_NEOX (1: pairs (i, i+D/2); 0: (2i, 2i+1)).  Blocks are [kv_heads, 2, block_size, D] as on
// the CPU; k_ptrs / v_ptrs hold each block's K / V address of head 0, heads head_stride apart.
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GROUP
#define GROUP 4
#endif
#ifndef KV_F16
#define KV_F16 0
#endif
#ifndef FUSED_ROPE
#define FUSED_ROPE 0
#endif
#ifndef ROPE_NEOX
#define ROPE_NEOX 1
#endif

#define WARPS 4
#define EPT ((HEAD_DIM + 31) / 32)  // elements of a row each lane holds

#if KV_F16
typedef hy_half kv_t;
__device__ __forceinline__ float kv_load(const kv_t *p) { return hy_h2f(*p); }
#else
typedef float kv_t;
__device__ __forceinline__ float kv_load(const kv_t *p) { return *p; }
#endif

#if FUSED_ROPE
// Rotate a row held in shared memory (D floats) by position `pos`; lanes of one warp cooperate.
__device__ __forceinline__ void rope_row(float *row, long long pos, const double *inv_freq) {
    const int lane = threadIdx.x & 31;
    __syncwarp();
    for (int i = lane; i < HEAD_DIM / 2; i += 32) {
        float s, c;
        hy_rope_sincos(pos, inv_freq[i], &s, &c);
#if ROPE_NEOX
        const int ia = i, ib = i + HEAD_DIM / 2;
#else
        const int ia = 2 * i, ib = 2 * i + 1;
#endif
        const float a = row[ia], b = row[ib];
        row[ia] = a * c - b * s;
        row[ib] = b * c + a * s;
    }
    __syncwarp();
}
#endif

extern "C" __global__ void hybrid_paged_attention(
    const float *__restrict__ q,            // [rows, heads*D]
    float *__restrict__ out,                // [rows, heads*D]
    const hy_u64 *__restrict__ k_table,     // [blocks] K block addresses (one sequence), or null
    const hy_u64 *__restrict__ v_table,     // [blocks] V block addresses
    const hy_u64 *__restrict__ k_tables,    // [seqs] address of each sequence's K table (batched)
    const hy_u64 *__restrict__ v_tables,    // [seqs] address of each sequence's V table
    const long long *__restrict__ seq_pos,  // [seqs] position of each sequence's first row, or null
    long long start_pos,                    // position of row 0 when seq_pos is null
    int rows_per_seq,                       // query rows of one sequence
    const double *__restrict__ inv_freq,    // [D/2] (fused RoPE only)
    float *__restrict__ part_m,             // [rows, heads, splits] (splits > 1 only)
    float *__restrict__ part_l,             // [rows, heads, splits]
    float *__restrict__ part_acc,           // [rows, heads, splits, D]
    int num_heads, int block_size, long long head_stride, int split_len, float scale) {
    __shared__ float q_s[GROUP][HEAD_DIM];
    __shared__ float w_m[WARPS][GROUP], w_l[WARPS][GROUP];
    __shared__ float w_acc[WARPS][GROUP][HEAD_DIM];
#if FUSED_ROPE
    __shared__ float k_s[WARPS][HEAD_DIM];
#endif
    const int row = blockIdx.x, g = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seq = row / rows_per_seq;
    const long long pos = (seq_pos ? seq_pos[seq] : start_pos) + row % rows_per_seq;
    const long long kb = (long long)split * split_len;
    const long long ke = min(kb + split_len, pos + 1);
    const hy_u64 *kt = k_tables ? (const hy_u64 *)k_tables[seq] : k_table;
    const hy_u64 *vt = v_tables ? (const hy_u64 *)v_tables[seq] : v_table;

    // scaled queries of the group (rotated by the row's position when RoPE is fused)
    for (int t = threadIdx.x; t < GROUP * HEAD_DIM; t += blockDim.x) {
        const int h = t / HEAD_DIM, d = t % HEAD_DIM;
        q_s[h][d] = q[(long)row * num_heads * HEAD_DIM + (long)(g * GROUP + h) * HEAD_DIM + d];
    }
    __syncthreads();
#if FUSED_ROPE
    for (int h = warp; h < GROUP; h += WARPS) rope_row(q_s[h], pos, inv_freq);
    __syncthreads();
#endif
    float qreg[GROUP][EPT];
#pragma unroll
    for (int h = 0; h < GROUP; h++)
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            const int d = lane * EPT + e;
            qreg[h][e] = d < HEAD_DIM ? q_s[h][d] * scale : 0.0f;
        }

    float m[GROUP], l[GROUP], acc[GROUP][EPT];
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        m[h] = HY_NEG_INF;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPT; e++) acc[h][e] = 0.0f;
    }

    // each warp takes every WARPS-th key of the split; one K/V row serves the whole group
    for (long long j = kb + warp; j < ke; j += WARPS) {
        const long long b = j / block_size, slot = j % block_size;
        const long long off = (long long)g * head_stride + slot * HEAD_DIM;
        const kv_t *krow = (const kv_t *)kt[b] + off;
        const kv_t *vrow = (const kv_t *)vt[b] + off;
        float kreg[EPT], vreg[EPT];
#if FUSED_ROPE
        for (int d = lane; d < HEAD_DIM; d += 32) k_s[warp][d] = kv_load(krow + d);
        rope_row(k_s[warp], j, inv_freq);
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            const int d = lane * EPT + e;
            kreg[e] = d < HEAD_DIM ? k_s[warp][d] : 0.0f;
        }
        __syncwarp();  // every lane has read the row before the next one overwrites it
#else
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            const int d = lane * EPT + e;
            kreg[e] = d < HEAD_DIM ? kv_load(krow + d) : 0.0f;
        }
#endif
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            const int d = lane * EPT + e;
            vreg[e] = d < HEAD_DIM ? kv_load(vrow + d) : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < EPT; e++) s += qreg[h][e] * kreg[e];
            s = hy_warp_sum(s);
            const float m_new = fmaxf(m[h], s);
            const float alpha = __expf(m[h] - m_new);  // 0 on the first key (m = -inf)
            const float p = __expf(s - m_new);
            l[h] = l[h] * alpha + p;
#pragma unroll
            for (int e = 0; e < EPT; e++) acc[h][e] = acc[h][e] * alpha + p * vreg[e];
            m[h] = m_new;
        }
    }

    // combine the warps of the block
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        if (lane == 0) {
            w_m[warp][h] = m[h];
            w_l[warp][h] = l[h];
        }
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            const int d = lane * EPT + e;
            if (d < HEAD_DIM) w_acc[warp][h][d] = acc[h][e];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < GROUP * HEAD_DIM; t += blockDim.x) {
        const int h = t / HEAD_DIM, d = t % HEAD_DIM;
        float mx = HY_NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; w++) mx = w_l[w][h] > 0.0f ? fmaxf(mx, w_m[w][h]) : mx;
        float ls = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            if (w_l[w][h] > 0.0f) {
                const float f = __expf(w_m[w][h] - mx);
                ls += w_l[w][h] * f;
                a += w_acc[w][h][d] * f;
            }
        }
        const int head = g * GROUP + h;
        if (splits == 1) {
            out[(long)row * num_heads * HEAD_DIM + (long)head * HEAD_DIM + d] = ls > 0.0f ? a / ls : 0.0f;
        } else {
            const long idx = ((long)row * num_heads + head) * splits + split;
            part_acc[idx * HEAD_DIM + d] = a;
            if (d == 0) {
                part_m[idx] = mx;
                part_l[idx] = ls;
            }
        }
    }
}

extern "C" __global__ void hybrid_paged_attention_merge(const float *__restrict__ part_m,
                                                        const float *__restrict__ part_l,
                                                        const float *__restrict__ part_acc,
                                                        float *__restrict__ out, int num_heads,
                                                        int splits) {
    const int row = blockIdx.x, head = blockIdx.y;
    const long base = ((long)row * num_heads + head) * splits;
    float mx = HY_NEG_INF;
    for (int s = 0; s < splits; s++)
        if (part_l[base + s] > 0.0f) mx = fmaxf(mx, part_m[base + s]);
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float ls = 0.0f, a = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float lv = part_l[base + s];
            if (lv > 0.0f) {
                const float f = __expf(part_m[base + s] - mx);
                ls += lv * f;
                a += part_acc[(base + s) * HEAD_DIM + d] * f;
            }
        }
        out[(long)row * num_heads * HEAD_DIM + (long)head * HEAD_DIM + d] = ls > 0.0f ? a / ls : 0.0f;
    }
}
