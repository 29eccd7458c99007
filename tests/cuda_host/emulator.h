// Host emulation of the CUDA execution model, enough to run hybrid's kernels on the CPU.
//
// Tests compile a kernel source as C++ with this header in front (g++ -std=c++20 -include
// emulator.h).  The threads of a block are fibers (ucontext) on one OS thread, switched only
// at barriers: __syncthreads and __syncwarp wait for the block's / warp's live fibers, warp
// shuffles exchange through a per-warp buffer between two warp barriers, __shared__ variables
// are function statics (blocks run one after another).  A fiber that returns drops out of the
// barriers, as an exited GPU thread does.  This checks the kernels' logic (indexing, online
// softmax, split-K merge, conversions) without a GPU; it says nothing about speed.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#define HY_HOST_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

struct HyBarrier {
    unsigned expected = 0, arrived = 0;
    unsigned long phase = 0;
};

struct HyFiber {
    ucontext_t ctx;
    unsigned tid = 0;
    bool done = false;
};

struct HyBlock {
    std::vector<HyFiber> fibers;
    std::vector<std::vector<char>> stacks;
    HyBarrier block;
    std::vector<HyBarrier> warps;
    std::vector<uint64_t> exchange;  // one 8-byte slot per thread for shuffles
    ucontext_t scheduler;
    unsigned current = 0;
    void (*body)() = nullptr;
};
inline HyBlock hy_blk;
inline unsigned long hy_events = 0;  // arrivals and exits: a scheduler pass without one is a deadlock

inline void hy_yield() { swapcontext(&hy_blk.fibers[hy_blk.current].ctx, &hy_blk.scheduler); }

inline void hy_release(HyBarrier &b) {
    if (b.expected && b.arrived == b.expected) {
        b.arrived = 0;
        b.phase++;
    }
}

inline void hy_wait(HyBarrier &b) {
    const unsigned long phase = b.phase;
    b.arrived++;
    hy_events++;
    hy_release(b);
    while (b.phase == phase) hy_yield();
}

inline void __syncthreads() { hy_wait(hy_blk.block); }
inline void __syncwarp(unsigned = 0xffffffffu) { hy_wait(hy_blk.warps[threadIdx.x / 32]); }

template <class T>
inline T hy_shfl(T v, int src_lane) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    std::memcpy(&hy_blk.exchange[warp * 32 + lane], &v, sizeof(T));
    __syncwarp();
    T r;
    std::memcpy(&r, &hy_blk.exchange[warp * 32 + (unsigned)src_lane % 32], sizeof(T));
    __syncwarp();
    return r;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask) { return hy_shfl(v, (int)(threadIdx.x % 32) ^ mask); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) { return hy_shfl(v, src); }
template <class T>
inline T __shfl_down_sync(unsigned, T v, int d) {
    int src = (int)(threadIdx.x % 32) + d;
    return hy_shfl(v, src < 32 ? src : (int)(threadIdx.x % 32));
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::max;
using std::min;

inline void hy_fiber_main() {
    HyFiber &f = hy_blk.fibers[hy_blk.current];
    hy_blk.body();
    f.done = true;  // drop out of the barriers, then never run again
    hy_events++;
    hy_blk.block.expected--;
    hy_release(hy_blk.block);
    HyBarrier &w = hy_blk.warps[f.tid / 32];
    w.expected--;
    hy_release(w);
    swapcontext(&f.ctx, &hy_blk.scheduler);
}

// Run every block of the grid; each block's threads as fibers until all have returned.
inline void hy_run(const unsigned *grid, const unsigned *block, void (*body)()) {
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    const unsigned threads = block[0] * block[1] * block[2];
    const size_t stack_bytes = 256 * 1024;
    hy_blk.fibers.assign(threads, HyFiber{});
    hy_blk.stacks.resize(threads);
    for (auto &st : hy_blk.stacks) st.resize(stack_bytes);
    hy_blk.exchange.assign(((threads + 31) / 32) * 32, 0);
    hy_blk.body = body;
    for (unsigned bz = 0; bz < grid[2]; bz++)
        for (unsigned by = 0; by < grid[1]; by++)
            for (unsigned bx = 0; bx < grid[0]; bx++) {
                blockIdx = {bx, by, bz};
                hy_blk.block = HyBarrier{threads, 0, 0};
                hy_blk.warps.assign((threads + 31) / 32, HyBarrier{});
                for (unsigned w = 0; w < hy_blk.warps.size(); w++)
                    hy_blk.warps[w].expected = std::min(32u, threads - 32 * w);
                for (unsigned t = 0; t < threads; t++) {
                    HyFiber &f = hy_blk.fibers[t];
                    f.tid = t;
                    f.done = false;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = hy_blk.stacks[t].data();
                    f.ctx.uc_stack.ss_size = stack_bytes;
                    f.ctx.uc_link = nullptr;
                    makecontext(&f.ctx, hy_fiber_main, 0);
                }
                unsigned alive = threads;
                while (alive) {
                    const unsigned long events = hy_events;
                    alive = 0;
                    for (unsigned t = 0; t < threads; t++) {
                        HyFiber &f = hy_blk.fibers[t];
                        if (f.done) continue;
                        hy_blk.current = t;
                        threadIdx = {t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
                        swapcontext(&hy_blk.scheduler, &f.ctx);
                        alive += !f.done;
                    }
                    if (alive && events == hy_events) {
                        std::fprintf(stderr, "emulator: block (%u,%u,%u) deadlocked: %u threads wait "
                                     "at a barrier that others never reach\n", bx, by, bz, alive);
                        std::abort();
                    }
                }
            }
}

template <class... A>
constexpr size_t hy_arity(void (*)(A...)) { return sizeof...(A); }

template <class... A, size_t... I>
void hy_call(void (*f)(A...), void **p, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(p[I])...);
}

#define HY_EXPORT(name)                                                                  \
    extern "C" void emu_##name(const unsigned *grid, const unsigned *block, void **p) {  \
        static void **params;                                                         \
        params = p;                                                                   \
        hy_run(grid, block, [] { hy_call(&name, params, std::make_index_sequence<      \
                                              hy_arity(&name)>{}); });                \
    }
