/* Activation quantization: a float32 row to 8-bit values with a scale per group of 32 or 256
 * and a scaled sum per block of 32, as every integer dot product reads it.
 * Part of quant.h, which includes the parts in order. */
#ifndef HYBRID_QUANT_ACTIVATIONS_H
#define HYBRID_QUANT_ACTIVATIONS_H

/* ================================================================== activations */

/* Quantize x[0..n) to 8-bit values with one scale per group of `group` values (32, or 256 for
 * the formats with 256-value super-blocks, whose kernels then keep their sub-block scales in
 * integer arithmetic, as llama.cpp's Q8_K): qa[n], and per 32-value block b da[b] (its group's
 * scale, the same for every block of a group) and, when sa is not NULL, sa[b] = da[b] * (sum of
 * qa over b); when s16 is not NULL, s16[n/16] = da * (sum of qa over each 16 values) for Q6_K
 * and the low-bit formats.  n % group == 0. */
/* block b's scale and scaled sums (of its two halves of 16 values, and of all 32) */
static inline void hy_q_act_sums(long b, float d, int sum0, int sum1, float *da, float *sa,
                                 float *s16) {
    da[b] = d;
    if (sa != NULL) sa[b] = d * (float)(sum0 + sum1);
    if (s16 != NULL) {
        s16[2 * b] = d * (float)sum0;
        s16[2 * b + 1] = d * (float)sum1;
    }
}

#ifdef HY_AVX2
static inline int hy_hsum256_epi32(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 1);
}
#endif

/* the largest |x| over x[0..m) (m % 32 == 0) that is not NaN (0 for none) */
static inline float hy_q_act_amax(const float *x, long m) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    /* vmaxps(|x|, m) keeps m where x is NaN, as fmaxf does */
    __m512 mx = _mm512_setzero_ps();
    for (long i = 0; i < m; i += 16) mx = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), mx);
    return _mm512_reduce_max_ps(mx);
#elif defined(HY_AVX2)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    for (long i = 0; i < m; i += 8) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), absmask), mx);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    return _mm_cvtss_f32(m4);
#else
    float amax = 0.0f;
    for (long i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[i]));
    return amax;
#endif
}

/* block b (32 values at xb) at the scale d = amax / 127 (inverse id) */
static inline void hy_q_act_block(const float *xb, long b, float d, float id, int8_t *qa,
                                  float *da, float *sa, float *s16) {
    /* The vector paths take the same steps as the scalar loop and give the same bytes:
     * rounding to nearest even under the default mode is nearbyintf; a NaN or out-of-range
     * product converts to INT_MIN, as the scalar cast does here, and is clamped alike.  (The
     * scalar loop calls libm's fmaxf for every value, which costs as much as a small matrix's
     * whole mat-vec.) */
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i v0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvttps_epi32(
        _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(xb), idv), rnd))));
    const __m512i v1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvttps_epi32(
        _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), idv), rnd))));
    _mm_storeu_si128((__m128i *)(qa + 32 * b), _mm512_cvtepi32_epi8(v0));
    _mm_storeu_si128((__m128i *)(qa + 32 * b + 16), _mm512_cvtepi32_epi8(v1));
    hy_q_act_sums(b, d, _mm512_reduce_add_epi32(v0), _mm512_reduce_add_epi32(v1), da, sa, s16);
#elif defined(HY_AVX2)
    const __m256 idv = _mm256_set1_ps(id);
    __m256i v[4];
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_min_epi32(_mm256_set1_epi32(127), _mm256_max_epi32(_mm256_set1_epi32(-127),
            _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), idv),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))));
    /* packs interleave the 128-bit lanes: dwords 0,4,1,5,... put the 32 bytes in order */
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(qa + 32 * b), bytes);
    hy_q_act_sums(b, d, hy_hsum256_epi32(_mm256_add_epi32(v[0], v[1])),
                  hy_hsum256_epi32(_mm256_add_epi32(v[2], v[3])), da, sa, s16);
#else
    int sum0 = 0, sum1 = 0;
    for (int j = 0; j < 32; j++) {
        int v = (int)nearbyintf(xb[j] * id);
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        qa[32 * b + j] = (int8_t)v;
        if (j < 16) sum0 += v; else sum1 += v;
    }
    hy_q_act_sums(b, d, sum0, sum1, da, sa, s16);
#endif
}

static inline void hy_q_act(const float *x, long n, long group, int8_t *qa, float *da, float *sa,
                            float *s16) {
    for (long g = 0; g < n; g += group) {
        const float amax = hy_q_act_amax(x + g, group);
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 127.0f / amax : 0.0f;
        for (long b = g / 32; b < (g + group) / 32; b++)
            hy_q_act_block(x + 32 * b, b, d, id, qa, da, sa, s16);
    }
}

#endif
