// Paged causal attention on the GPU, float32 queries, float32 or float16 KV.
//
//   hybrid_paged_attention_f32 / _f16 (by KV dtype)   one thread block (4 warps) per (query row, KV head, key split).
//                             Row r belongs to sequence s = r / rows_per_seq and sits at position
//                             p = seq_pos[s] (or start_pos) + r % rows_per_seq; it sees keys 0..p
//                             of that sequence's block table.  Single-sequence prefill/decode
//                             (one table, rows_per_seq = rows) and batched decode (a table per
//                             sequence, rows_per_seq = 1) are the same launch.  With one split the
//                             block writes the output; with several it writes (max, sum, acc)
//                             partials for the merge kernel.
//   hybrid_paged_attention_merge_f32   combines the splits of every (row, head) in fp32.
//
// Inner loop: a K or V row is read with 16-byte vector loads by LANES lanes (VEC elements per
// load: 4 float32 or 8 float16), so a warp works on KPW = 32 / LANES keys at once and a dot
// product needs log2(LANES) shuffles.  Every key loaded serves all GROUP query heads of the KV
// head.  Each group of LANES lanes keeps its own online softmax; the groups of a warp merge by
// shuffles, the warps of the block through shared memory.
//
// Compile-time sizes: HEAD_DIM (64, 80, 96, 128 or 256), GROUP (query heads per KV head,
// <= 8), KV_F16, FUSED_ROPE (rotate q and each K row by its position on the fly; K is cached
// unrotated), ROPE_NEOX (1: pairs (i, i+D/2); 0: (2i, 2i+1)).  Blocks are
// [kv_heads, 2, block_size, D] as on the CPU; a table holds each block's K (or V) address of
// head 0, heads head_stride elements apart; rows are 16-byte aligned.
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
#define FULL_MASK 0xffffffffu
#define ROPE_ANCHOR 32  // fused RoPE: exact key angles every this many iterations
#if KV_F16
typedef hy_half kv_t;
#define VEC 8
#define ATTENTION_NAME hybrid_paged_attention_f16
#else
typedef float kv_t;
#define VEC 4
#define ATTENTION_NAME hybrid_paged_attention_f32
#endif
#define NVEC (HEAD_DIM / VEC)  // 16-byte vectors in a row
#define LANES (NVEC > 16 ? 32 : NVEC > 8 ? 16 : NVEC > 4 ? 8 : 4)  // lanes reading one row
#define VPL ((NVEC + LANES - 1) / LANES)  // vectors per lane
#define KPW (32 / LANES)  // keys a warp reads at once
#define EPL (VPL * VEC)  // row elements a lane holds

#if HEAD_DIM % VEC != 0 || NVEC % 2 != 0
#error "HEAD_DIM must be a multiple of 2 * VEC"
#endif
#if FUSED_ROPE && ROPE_NEOX && VPL > 1 && NVEC / 2 != LANES
#error "fused NeoX RoPE with several vectors per lane needs each half in one vector slot"
#endif

// One 16-byte vector of a K or V row, kept raw while its load is in flight
#if KV_F16
typedef uint4 raw_t;
__device__ __forceinline__ void unpack(const raw_t &r, float *out) {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = hy_h2f((hy_half)(w[i] & 0xffffu));
        out[2 * i + 1] = hy_h2f((hy_half)(w[i] >> 16));
    }
}
#else
typedef float4 raw_t;
__device__ __forceinline__ void unpack(const raw_t &r, float *out) {
    out[0] = r.x;
    out[1] = r.y;
    out[2] = r.z;
    out[3] = r.w;
}
#endif

// Start loading the vectors this lane holds of key j's K and V rows (zeros for a key at or
// past `ke` and in idle lanes); returns whether the key exists.
__device__ __forceinline__ bool load_key(const hy_u64 *kt, const hy_u64 *vt, long long j,
                                         long long ke, int g, long long head_stride,
                                         int block_size, int sl, raw_t *kraw, raw_t *vraw) {
    const bool valid = j < ke;
    const kv_t *krow = nullptr, *vrow = nullptr;
    if (valid) {
        const long long b = j / block_size, slot = j % block_size;
        const long long off = (long long)g * head_stride + slot * HEAD_DIM;
        krow = (const kv_t *)kt[b] + off;
        vrow = (const kv_t *)vt[b] + off;
    }
#pragma unroll
    for (int v = 0; v < VPL; v++) {
        const int vi = v * LANES + sl;
        if (valid && vi < NVEC) {
            kraw[v] = *(const raw_t *)(krow + vi * VEC);
            vraw[v] = *(const raw_t *)(vrow + vi * VEC);
        } else {
            kraw[v] = raw_t{};
            vraw[v] = raw_t{};
        }
    }
    return valid;
}

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

// RoPE frequency index of element (v, e) of the EPL row elements this lane holds
__device__ __forceinline__ int rope_index(int v, int e, int sl) {
    const int vi = v * LANES + sl;
    if (vi >= NVEC) return 0;  // an idle lane: any valid index
    const int d = vi * VEC + e;
#if ROPE_NEOX
    return d < HEAD_DIM / 2 ? d : d - HEAD_DIM / 2;
#else
    return d / 2;
#endif
}

// Rotate the EPL elements this lane holds of a K row by the angles whose cos / sin are c / s
// (per element).  Every lane of the warp must call it: NeoX partners may sit in another lane.
__device__ __forceinline__ void rope_regs(float *x, const float *c, const float *s, int sub, int sl) {
#if ROPE_NEOX
#if VPL == 1
    const int half_v = NVEC / 2;
    const bool first = sl < half_v;
    const int src = sl < NVEC ? sub * LANES + (first ? sl + half_v : sl - half_v) : (int)(threadIdx.x & 31);
    float other[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) other[e] = __shfl_sync(FULL_MASK, x[e], src);
#pragma unroll
    for (int e = 0; e < VEC; e++) x[e] = first ? x[e] * c[e] - other[e] * s[e] : x[e] * c[e] + other[e] * s[e];
#else  // two vectors per lane: vector sl of the first half, vector LANES + sl of the second
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float a = x[e], b = x[VEC + e];
        x[e] = a * c[e] - b * s[e];
        x[VEC + e] = b * c[e] + a * s[e];
    }
#endif
#else  // GPT-J pairs (2i, 2i+1) are neighbours inside one vector
#pragma unroll
    for (int e = 0; e < EPL; e += 2) {
        const float a = x[e], b = x[e + 1];
        x[e] = a * c[e] - b * s[e];
        x[e + 1] = b * c[e] + a * s[e];
    }
#endif
}
#endif

extern "C" __global__ void ATTENTION_NAME(
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
    const int row = blockIdx.x, g = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / LANES, sl = lane % LANES;  // which key of the warp, lane within it
    const int seq = row / rows_per_seq;
    const long long pos = (seq_pos ? seq_pos[seq] : start_pos) + row % rows_per_seq;
    const long long kb = (long long)split * split_len;
    const long long ke = min(kb + split_len, pos + 1);
    const hy_u64 *kt = k_tables ? (const hy_u64 *)k_tables[seq] : k_table;
    const hy_u64 *vt = v_tables ? (const hy_u64 *)v_tables[seq] : v_table;

    // the queries of the group (rotated by the row's position when RoPE is fused), scaled
    for (int t = threadIdx.x; t < GROUP * HEAD_DIM; t += blockDim.x) {
        const int h = t / HEAD_DIM, d = t % HEAD_DIM;
        q_s[h][d] = q[(long)row * num_heads * HEAD_DIM + (long)(g * GROUP + h) * HEAD_DIM + d];
    }
    __syncthreads();
#if FUSED_ROPE
    for (int h = warp; h < GROUP; h += WARPS) rope_row(q_s[h], pos, inv_freq);
    __syncthreads();
#endif
    float qreg[GROUP][EPL];
#pragma unroll
    for (int h = 0; h < GROUP; h++)
#pragma unroll
        for (int v = 0; v < VPL; v++)
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int vi = v * LANES + sl;
                qreg[h][v * VEC + e] = vi < NVEC ? q_s[h][vi * VEC + e] * scale : 0.0f;
            }

    float m[GROUP], l[GROUP], acc[GROUP][EPL];
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        m[h] = HY_NEG_INF;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[h][e] = 0.0f;
    }

#if FUSED_ROPE
    // the angle of each held element advances by STEP keys per iteration: rotate (cos, sin) by
    // a fixed step (4 FMAs) and recompute exactly every ROPE_ANCHOR iterations
    const int STEP = WARPS * KPW;
    float rc[EPL], rs[EPL], dc[EPL], ds[EPL];
#pragma unroll
    for (int v = 0; v < VPL; v++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            hy_rope_sincos(STEP, inv_freq[rope_index(v, e, sl)], &ds[v * VEC + e], &dc[v * VEC + e]);
    int since_anchor = ROPE_ANCHOR;
#endif
    // warp w reads keys kb + w*KPW .. + KPW-1, then the next WARPS*KPW; every lane runs the
    // same trip count (the shuffles need the whole warp), lanes past the end read nothing
    // software pipelining: the next key's K and V are in flight while this one is used
    raw_t kn[VPL], vn[VPL];
    bool next_valid = load_key(kt, vt, kb + warp * KPW + sub, ke, g, head_stride, block_size, sl, kn, vn);
    for (long long jb = kb + warp * KPW; jb < ke; jb += WARPS * KPW) {
        const long long j = jb + sub;
        const bool valid = next_valid;
        float kr[EPL], vr[EPL];
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            unpack(kn[v], kr + v * VEC);
            unpack(vn[v], vr + v * VEC);
        }
        next_valid = load_key(kt, vt, j + WARPS * KPW, ke, g, head_stride, block_size, sl, kn, vn);
#if FUSED_ROPE
        if (since_anchor == ROPE_ANCHOR) {
#pragma unroll
            for (int v = 0; v < VPL; v++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    hy_rope_sincos(j, inv_freq[rope_index(v, e, sl)], &rs[v * VEC + e], &rc[v * VEC + e]);
            since_anchor = 0;
        }
        rope_regs(kr, rc, rs, sub, sl);
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const float c = rc[e] * dc[e] - rs[e] * ds[e];
            rs[e] = rs[e] * dc[e] + rc[e] * ds[e];
            rc[e] = c;
        }
        since_anchor++;
#endif
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) s += qreg[h][e] * kr[e];
#pragma unroll
            for (int o = LANES / 2; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
            if (valid) {
                const float m_new = fmaxf(m[h], s);
                const float alpha = __expf(m[h] - m_new);  // 0 on the first key (m = -inf)
                const float p = __expf(s - m_new);
                l[h] = l[h] * alpha + p;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[h][e] = acc[h][e] * alpha + p * vr[e];
                m[h] = m_new;
            }
        }
    }

    // merge the KPW key streams of the warp: lanes sl of different streams hold the same elements
#pragma unroll
    for (int o = LANES; o < 32; o <<= 1) {
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
            const float mo = __shfl_xor_sync(FULL_MASK, m[h], o);
            const float lo = __shfl_xor_sync(FULL_MASK, l[h], o);
            const float mn = fmaxf(m[h], mo);
            const float a = l[h] > 0.0f ? __expf(m[h] - mn) : 0.0f;
            const float b = lo > 0.0f ? __expf(mo - mn) : 0.0f;
            l[h] = l[h] * a + lo * b;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                const float ao = __shfl_xor_sync(FULL_MASK, acc[h][e], o);
                acc[h][e] = acc[h][e] * a + ao * b;
            }
            m[h] = mn;
        }
    }

    // combine the warps of the block
    if (sub == 0) {
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
            if (sl == 0) {
                w_m[warp][h] = m[h];
                w_l[warp][h] = l[h];
            }
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int vi = v * LANES + sl;
                if (vi < NVEC) {
#pragma unroll
                    for (int e = 0; e < VEC; e++) w_acc[warp][h][vi * VEC + e] = acc[h][v * VEC + e];
                }
            }
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

extern "C" __global__ void hybrid_paged_attention_merge_f32(const float *__restrict__ part_m,
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
