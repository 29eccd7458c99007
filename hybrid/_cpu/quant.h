/* Weight formats of GGUF files, read in place: row decoding, dot products, mat-vec and GEMM.
 *
 * This header includes its parts in order: quant_formats.h (build configuration, format codes,
 * decoding), quant_activations.h, the dot products by ISA (quant_dot_portable.h,
 * quant_dot_avx2.h, quant_dot_avx512.h) and quant_dot.h (each format's choice among them),
 * the multi-row kernels (quant_matvec8.h for AVX2, quant_matvec16.h for AVX-512, and
 * quant_stream.h, AVX-512's streaming decode kernel), the per-format traits table
 * (quant_traits.h), quant_matvec.h (the dispatcher) and quant_gemm.h (the prefill int8 GEMM).
 *
 * A weight matrix [out, in] is stored row by row; a row is in/block_size blocks of the format's
 * GGUF layout (ggml's block structs, little-endian, packed):
 *
 *   format  values/block  bytes  block layout                          value
 *   F16      1             2     IEEE binary16                         h
 *   BF16     1             2     upper half of a float32               b << 16
 *   Q8_0     32            34    d:f16 qs[32]:i8                       d*q
 *   Q4_0     32            18    d:f16 qs[16] (lo nibble: 0..15,       d*(n-8)
 *                                  hi nibble: 16..31)
 *   Q4_1     32            20    d:f16 m:f16 qs[16]                    d*n + m
 *   Q5_0     32            22    d:f16 qh:u32 qs[16] (bit j of qh is   d*(n-16)
 *                                  bit 4 of value j)
 *   Q5_1     32            24    d:f16 m:f16 qh:u32 qs[16]             d*n + m
 *   Q4_K     256           144   d:f16 dmin:f16 scales[12] qs[128]     (d*sc_j)*n - (dmin*m_j)
 *                                  8 sub-blocks of 32, 6-bit sc_j/m_j;
 *                                  qs[32g..]: lo nibble sub-block 2g, hi nibble 2g+1
 *   Q5_K     256           176   as Q4_K plus qh[32] before qs:        (d*sc_j)*n - (dmin*m_j)
 *                                  bit j of qh[l] is bit 4 of value l of sub-block j
 *   Q6_K     256           210   ql[128] qh[64] scales[16]:i8 d:f16    (d*sc_i)*(n-32)
 *                                  16 sub-blocks of 16
 *   Q2_K     256           84    scales[16] qs[64] d:f16 dmin:f16      (d*sc_i)*n - (dmin*m_i)
 *                                  16 sub-blocks of 16, 4-bit sc_i/m_i;
 *                                  block k=4h+j: bits 2j of qs[32h..]
 *   Q3_K     256           110   hmask[32] qs[64] scales[12] d:f16     (d*sc_i)*(n-4)
 *                                  n = 2 bits as Q2_K | bit k of hmask
 *                                  << 2; 16 6-bit sc_i less 32
 *   IQ4_NL   32            18    d:f16 qs[16] (nibbles as Q4_0)        d*grid[n]
 *   IQ4_XS   256           136   d:f16 scales_h:u16 scales_l[4]        (d*(sc_j-32))*grid[n]
 *                                  qs[128]: 8 sub-blocks as IQ4_NL's
 *                                  (grid: 16 signed values, hy_iq4_values)
 *
 * Decoding (hy_q_decode_row) reproduces gguf.quants bit for bit: the same float32 operations in
 * the same order and no fused multiply-add (this file is compiled with -ffp-contract=off).
 *
 * Dot products (hy_q_dot) multiply a weight row by an activation row quantized once per step to
 * 8-bit values (hy_q_act) with one scale per group of the format's block size: 32 values for the
 * 32-value formats, 256 for the super-block formats (as llama.cpp's Q8_0 and Q8_K):
 * qa[i] = round(x[i]/d), d = max|x| / 127 over the group, stored per 32-value block b as
 * da[b], with sa[b] = da[b] * sum(qa of block b).  Inside a block the products are exact
 * integers (_mm256_maddubs_epi16 + _mm256_madd_epi16 on AVX2), scaled once per block in
 * float32; Q4_K, Q5_K and Q6_K keep their sub-block scales in the integer sums too and scale
 * once per super-block.  Formats with an offset (Q4_1, Q5_1, Q4_K, Q5_K: "+ m") add m * sa[b]
 * per block, and per 16 values through the activations' half-block sums (Q2_K's mins, the
 * centres of Q3_K and Q6_K); the signed formats (Q8_0, IQ4_NL, IQ4_XS) multiply |w| times
 * sign-adjusted qa.  F16 and BF16 rows multiply the float32 activations directly (widen and
 * FMA): nothing to gain from integers there.
 */
#ifndef HYBRID_QUANT_H
#define HYBRID_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#include "quant_formats.h"
#include "quant_activations.h"
#include "quant_dot_portable.h"
#include "quant_dot_avx2.h"
#include "quant_dot_avx512.h"
#include "quant_dot.h"
#include "quant_matvec8.h"
#include "quant_matvec16.h"
#include "quant_stream.h"
#include "quant_traits.h"
#include "quant_matvec.h"
#include "quant_gemm.h"

#endif
