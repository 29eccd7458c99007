/* Vector primitives for the CPU kernels of hybrid.
 *
 * Each primitive has an AVX2+FMA (and F16C) body, chosen at compile time when the build targets a
 * CPU that has them (-march=native, the default source build), 16-lane AVX-512 bodies for the
 * elementwise ones (hy_dot, hy_exp_inplace, hy_silu_mul) when it also has AVX-512, and a plain C
 * fallback that any
 * compiler vectorises as far as it can (HYBRID_PORTABLE=1 builds).  Everything here is
 * `static inline`, free of global state and safe to call from OpenMP threads.
 *
 *   hy_dot            sum_i a[i] * b[i]                        float32 accumulation, 16 lanes
 *   hy_max            max_i x[i]
 *   hy_exp_inplace    x[i] = exp(x[i])                         Cephes-style polynomial, ~1 ulp
 *   hy_exp_shift_sum  x[i] = exp(x[i] - m), returns the sum
 *   hy_silu_mul       out[i] = silu(g[i]) * u[i]
 *   hy_f16_to_f32     IEEE binary16 -> float32 rows
 *   hy_axpy_rows(4)   acc[d] = alpha*acc[d] + sum_j p[j] * v[j, d]   (portable attention path)
 * The AVX2 attention micro-kernels live in attention_avx2.h.
 */
#ifndef HYBRID_SIMD_H
#define HYBRID_SIMD_H

#include <unistd.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HY_AVX2 1
#endif
#if defined(HY_AVX2) && defined(__F16C__)
#define HY_F16C 1
#endif
/* AVX-512 paths (attention_avx512.h and the 16-lane bodies below) need F, VL, BW and DQ */
#if defined(HY_F16C) && defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) \
    && defined(__AVX512DQ__)
#define HY_AVX512 1
#endif

static inline int hy_simd_level(void) {
#if defined(HY_AVX512)
    return 3; /* AVX-512 F/VL/BW/DQ + FMA + F16C */
#elif defined(HY_F16C)
    return 2; /* AVX2 + FMA + F16C */
#elif defined(HY_AVX2)
    return 1; /* AVX2 + FMA */
#else
    return 0; /* portable C */
#endif
}

/* The core's L1D in bytes (sysconf, read once; 32 KiB where the system does not say).  Kernels
 * whose software prefetches would overflow it prefetch into L2 instead. */
static long hy_l1d_bytes_ = 0;  /* (set on first use; every thread computes the same value) */
static inline long hy_l1d_bytes(void) {
    if (hy_l1d_bytes_ <= 0) {
        long b = 0;
#ifdef _SC_LEVEL1_DCACHE_SIZE
        b = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
        hy_l1d_bytes_ = b > 0 ? b : 32 * 1024;
    }
    return hy_l1d_bytes_;
}

#if defined(__x86_64__) || defined(__i386__)
/* r = EAX, EBX, ECX, EDX of CPUID leaf `leaf`, subleaf 0 */
static inline void hy_cpuid(unsigned int leaf, unsigned int r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(0));
}
#endif

/* 1 on an Intel core (CPUID vendor GenuineIntel) */
static inline int hy_cpu_is_intel(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned int r[4];
    hy_cpuid(0, r);
    return r[1] == 0x756e6547u && r[3] == 0x49656e69u && r[2] == 0x6c65746eu; /* "Genu" "ineI" "ntel" */
#else
    return 0;
#endif
}

/* Whether the running core has AVX-512F (CPUID leaf 7, EBX bit 16; the OS's saving of the
 * 512-bit state is not checked: this only picks a prefetch distance, never an instruction) */
static inline int hy_cpu_has_avx512f(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned int r[4];
    hy_cpuid(0, r);
    if (r[0] < 7) return 0;
    hy_cpuid(7, r);
    return (r[1] >> 16) & 1u;
#else
    return 0;
#endif
}

/* n bytes (at least one) on a 64-byte boundary, released with free(); NULL when out of memory.
 * Kernel scratch that vector loads read over and over (attention's scaled queries and
 * accumulators, the 8-bit activations of the quantized kernels) must not straddle cache lines:
 * malloc's 16-byte alignment would split every 64-byte load of the scaled queries in two. */
static inline void *hy_alloc64(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 1) == 0 ? p : NULL;
}

/* ---------------------------------------------------------------- float16 */

static inline float hy_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    float out;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in float32 */
        out = (float)mant * 5.9604644775390625e-08f;
        return sign ? -out : out;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* dst[i] = (float)src[i] for i < n */
/* float32 -> IEEE binary16, round to nearest even (numpy's astype(float16) and F16C agree) */
static inline uint16_t hy_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u)  /* inf or nan (nan keeps a quiet payload bit) */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (absx < 0x38800000u) {  /* below 2^-14: subnormal half (or zero) */
        if (absx < 0x33000000u) return (uint16_t)sign;            /* below half the smallest */
        const uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;  /* value / 2^-24 = m * 2^(e - 126); shift 14..24 */
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        uint32_t q = m >> shift;
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even */
    uint32_t h = ((absx >> 13) - (112u << 10));
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* float32 -> float16 rows */
static inline void hy_f32_to_f16(const float *src, uint16_t *dst, long n) {
    long i = 0;
#ifdef HY_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = hy_float_to_half(src[i]);
}

static inline void hy_f16_to_f32(const uint16_t *src, float *dst, long n) {
    long i = 0;
#ifdef HY_F16C
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 8)));
        _mm256_storeu_ps(dst + i, a);
        _mm256_storeu_ps(dst + i + 8, b);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = hy_half_to_float(src[i]);
}

/* ---------------------------------------------------------------- q8_0 rows (the KV cache)
 * ggml's Q8_0 block: a float16 factor d = max|x| / 127 and 32 int8 values q = round(x / d)
 * (half away from zero; an all-zero block stores 0), as gguf.quants quantizes it; a value is
 * d * q.  A row of n values (n % 32 == 0) is n / 32 blocks of 34 bytes. */
static inline void hy_q8_row(const float *x, uint8_t *dst, long n) {
    for (long b = 0; b < n / 32; b++, x += 32, dst += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f;
        const uint16_t dh = hy_float_to_half(d);
        memcpy(dst, &dh, 2);
        for (int i = 0; i < 32; i++)
            dst[2 + i] = (uint8_t)(int8_t)(d > 0.0f ? (int)roundf(x[i] / d) : 0);
    }
}

/* c rows of n values in q8_0 (rows packed, n / 32 * 34 bytes each) -> float32 [c, n] (rows read
 * back from a cache block for checks; the kernels widen blocks with kv_q8.h) */
static inline void hy_q8_rows_to_f32(const uint8_t *src, float *dst, int c, long n) {
    for (long b = 0; b < (long)c * (n / 32); b++, src += 34, dst += 32) {
        uint16_t dh;
        memcpy(&dh, src, 2);
        const float d = hy_half_to_float(dh);
        for (int i = 0; i < 32; i++) dst[i] = d * (float)(int8_t)src[2 + i];
    }
}

/* ---------------------------------------------------------------- reductions */

#ifdef HY_AVX2
/* v, opaque to the compiler: a loop's chain of integer adds through it stays a chain (GCC
 * otherwise regroups the adds into a tree whose partial sums can leave the 16 registers) */
static inline __attribute__((always_inline)) __m256i hy_chain256(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}

static inline float hy_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* [hsum(a), hsum(b), hsum(c), hsum(d)] */
static inline __m128 hy_hsum4x256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
#endif

/* sum_i a[i] * b[i] */
static inline float hy_dot(const float *a, const float *b, long n) {
    long i = 0;
    float s = 0.0f;
#if defined(HY_AVX512)
    __m512 z0 = _mm512_setzero_ps(), z1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        z0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), z0);
        z1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), z1);
    }
    for (; i + 16 <= n; i += 16)
        z0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), z0);
    z0 = _mm512_add_ps(z0, z1);
    __m256 s0 = _mm256_add_ps(_mm512_castps512_ps256(z0), _mm512_extractf32x8_ps(z0, 1));
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s = hy_hsum256(s0);
#elif defined(HY_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s = hy_hsum256(_mm256_add_ps(s0, s1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* sum_i x[i] read as a stream, software-prefetched 12 KiB ahead like the weight kernels (the
 * bandwidth probe of the benchmarks: what a prefetching reader gets from memory) */
static inline float hy_stream_sum(const float *x, long n) {
    long i = 0;
    float s = 0.0f;
#ifdef HY_AVX2
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(x + i) + 12288, _MM_HINT_T0);
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
    }
    s = hy_hsum256(_mm256_add_ps(s0, s1));
#endif
    for (; i < n; i++) s += x[i];
    return s;
}

/* sum_i a[i] * b[i] with a streamed from memory (a float32 weight row: prefetched 12 KiB ahead,
 * four accumulators); b is small and cached */
static inline float hy_dot_stream(const float *a, const float *b, long n) {
    long i = 0;
    float s = 0.0f;
#if defined(HY_AVX512)
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 64 <= n; i += 64) {
        _mm_prefetch((const char *)(a + i) + 12288, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + 12288 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + 12288 + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + 12288 + 192, _MM_HINT_T0);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    const __m512 z = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
    s = hy_hsum256(_mm256_add_ps(_mm512_castps512_ps256(z), _mm512_extractf32x8_ps(z, 1)));
#elif defined(HY_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)(a + i) + 12288, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + 12288 + 64, _MM_HINT_T0);
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s = hy_hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---------------------------------------------------------------- exp */

#ifdef HY_AVX2
/* exp(x) for 8 lanes; inputs below -87.3 give 0, above 88.7 give +huge (never inf). */
static inline __m256 hy_exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f);
    const __m256 c2 = _mm256_set1_ps(-2.12194440e-4f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, c1, x);
    x = _mm256_fnmadd_ps(n, c2, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}
#endif

#ifdef HY_AVX512
/* exp(x) for 16 lanes, the polynomial of hy_exp256 (below -87.3 gives 0).  Always inlined: left
 * to itself the compiler emits it out of line in the attention module, a call per softmax
 * vector. */
static inline __attribute__((always_inline)) __m512 hy_exp512(__m512 x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3762626647949f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

#endif

/* x[i] = exp(x[i]) for i < n */
static inline void hy_exp_inplace(float *x, long n) {
    long i = 0;
#ifdef HY_AVX512
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, hy_exp512(_mm512_loadu_ps(x + i)));
#endif
#ifdef HY_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, hy_exp256(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = expf(x[i]);
}

/* out[i] = g[i] / (1 + exp(-g[i])) * u[i] */
static inline void hy_silu_mul(const float *g, const float *u, float *out, long n) {
    long i = 0;
#ifdef HY_AVX512
    for (; i + 16 <= n; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f),
                                         hy_exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gv, den), _mm512_loadu_ps(u + i)));
    }
#endif
#ifdef HY_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 den = _mm256_add_ps(one, hy_exp256(_mm256_xor_ps(gv, sign)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* max_i x[i] (n >= 1) */
static inline float hy_max(const float *x, long n) {
    long i = 0;
    float m = x[0];
#ifdef HY_AVX2
    if (n >= 8) {
        __m256 mv = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        m = _mm_cvtss_f32(h);
    }
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = exp(x[i] - m); returns sum_i x[i] */
static inline float hy_exp_shift_sum(float *x, long n, float m) {
    long i = 0;
    float s = 0.0f;
#ifdef HY_AVX2
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sv = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 e = hy_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    s = hy_hsum256(sv);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

/* ---------------------------------------------------------------- weighted row sums */

/* acc[d] = alpha * acc[d] + sum_{j<c} p[j] * v[j*n + d]  for d < n */
static inline void hy_axpy_rows(float *acc, float alpha, const float *p, const float *v, int c, long n) {
    long d = 0;
#ifdef HY_AVX2
    const __m256 va = _mm256_set1_ps(alpha);
    for (; d + 16 <= n; d += 16) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), va);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), va);
        for (int j = 0; j < c; j++) {
            __m256 pj = _mm256_broadcast_ss(p + j);
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * n + d), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * n + d + 8), a1);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
    }
    for (; d + 8 <= n; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), va);
        for (int j = 0; j < c; j++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + j * n + d), a0);
        _mm256_storeu_ps(acc + d, a0);
    }
#endif
    for (; d < n; d++) {
        float a = acc[d] * alpha;
        for (int j = 0; j < c; j++) a += p[j] * v[j * n + d];
        acc[d] = a;
    }
}

/* The same for four queries at once: acc is [4, n], alpha [4], p [4, ldp]; one V load serves four. */
static inline void hy_axpy_rows4(float *acc, const float *alpha, const float *p, int ldp,
                                 const float *v, int c, long n) {
    long d = 0;
#ifdef HY_AVX2
    const __m256 al0 = _mm256_set1_ps(alpha[0]), al1 = _mm256_set1_ps(alpha[1]);
    const __m256 al2 = _mm256_set1_ps(alpha[2]), al3 = _mm256_set1_ps(alpha[3]);
    const float *p0 = p, *p1 = p + ldp, *p2 = p + 2 * ldp, *p3 = p + 3 * ldp;
    for (; d + 8 <= n; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), al0);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + n + d), al1);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + 2 * n + d), al2);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + 3 * n + d), al3);
        for (int j = 0; j < c; j++) {
            __m256 vv = _mm256_loadu_ps(v + j * n + d);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), vv, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), vv, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + j), vv, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + j), vv, a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + n + d, a1);
        _mm256_storeu_ps(acc + 2 * n + d, a2);
        _mm256_storeu_ps(acc + 3 * n + d, a3);
    }
#endif
    for (int g = 0; g < 4; g++)
        for (long dd = d; dd < n; dd++) {
            float a = acc[g * n + dd] * alpha[g];
            for (int j = 0; j < c; j++) a += p[g * ldp + j] * v[j * n + dd];
            acc[g * n + dd] = a;
        }
}

#endif /* HYBRID_SIMD_H */
