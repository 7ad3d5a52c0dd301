/*
 * GEMM on Q8_0 weights (GGUF's layout, include/infergate/dtype.h) computed
 * on that layout as it lies in memory: no packing, no copy. W(n, k) is n rows
 * of k / 32 blocks; x is quantized the same way per block of 32 (a scale per
 * block kept in F32, q = round(x / d)) once per matmul, and each block
 * contributes d_w * d_x * sum q_w q_x, the integer sum exact.
 *
 * The integer dot product of a block: AVX-512 VNNI's vpdpbusd on 256-bit
 * vectors (unsigned by signed bytes, so |x| times w with x's sign moved onto
 * w), or AVX2's vpmaddubsw + vpmaddwd (pairs of products fit int16: 2 * 127 *
 * 127 < 32767), or plain C. Per output, eight blocks at a time are reduced
 * to their eight exact integer sums and lane j accumulates block j's
 * d_w * d_x * sum (gemmq8_avx2), then one fixed reduction: a row gets the same bits alone or in a
 * batch, on any split of the columns. Weights of -128 (never written by a quantizer, which stays
 * within +-127) would overflow the sign trick.
 */
#include "cpu_internal.h"

#include "infergate/dtype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q8_X86 1
#endif

void ig__q8_quantize_rows(int8_t *q, float *d, const float *x, int m, int k)
{
    int nb = k / IG_Q8_0_BLOCK;
    for (int r = 0; r < m; r++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)r * k + (size_t)b * IG_Q8_0_BLOCK;
            int8_t *qb = q + (size_t)r * k + (size_t)b * IG_Q8_0_BLOCK;
            float amax = 0.0f;
            for (int i = 0; i < IG_Q8_0_BLOCK; i++)
                amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
            float sc = amax / 127.0f, inv = sc != 0.0f ? 1.0f / sc : 0.0f;
            d[(size_t)r * nb + b] = sc;
            for (int i = 0; i < IG_Q8_0_BLOCK; i++)
                qb[i] = (int8_t)roundf(xb[i] * inv);
        }
}

static inline float w_scale(const uint8_t *blk)
{
    uint16_t h;
    memcpy(&h, blk, 2);
    return ig_f16_to_f32(h);
}

/* ---- plain C ---------------------------------------------------------- */

/* Not auto-vectorized: GCC 12 with -march=native on a VNNI CPU turns the
 * int8 x int8 sum below into vpdpbusd, which multiplies unsigned by signed
 * bytes, and gets negative activations wrong (test_kernels_q8 caught it).
 * clang has no such attribute: a loop pragma keeps its vectorizer off the
 * same loop. */
#ifdef __clang__
#define Q8_NO_VECTORIZE
#else
#define Q8_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#endif
Q8_NO_VECTORIZE static void gemmq8_scalar(float *y, int ldy, const int8_t *xq, const float *xd,
                                          const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / IG_Q8_0_BLOCK;
    size_t row = (size_t)nb * IG_Q8_0_BYTES;
    for (int c = n0; c < n1; c++) {
        const uint8_t *wr = w + (size_t)c * row;
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = wr + (size_t)b * IG_Q8_0_BYTES;
                int32_t s = 0;
#ifdef __clang__
#pragma clang loop vectorize(disable)
#endif
                for (int i = 0; i < IG_Q8_0_BLOCK; i++)
                    s += (int32_t)(int8_t)blk[2 + i] * xa[b * IG_Q8_0_BLOCK + i];
                acc = fmaf(w_scale(blk) * xd[(size_t)a * nb + b], (float)s, acc);
            }
            y[(size_t)a * ldy + c] = acc;
        }
    }
}

#ifdef Q8_X86
#ifdef __clang__ /* clang has no GCC target pragmas */
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
static inline __m256i idot_avx2(__m256i wq, __m256i xq)
{
    __m256i ax = _mm256_sign_epi8(xq, xq), sw = _mm256_sign_epi8(wq, xq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), _mm256_set1_epi16(1));
}

#define Q8_SUFFIX avx2
#define Q8_IDOT idot_avx2
#include "gemmq8_body.h"
#undef Q8_SUFFIX
#undef Q8_IDOT
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#ifdef __clang__ /* clang has no GCC target pragmas */
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))),        \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif
static inline __m256i idot_vnni(__m256i wq, __m256i xq)
{
    __m256i ax = _mm256_sign_epi8(xq, xq), sw = _mm256_sign_epi8(wq, xq);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sw);
}

#define Q8_SUFFIX avx512
#define Q8_IDOT idot_vnni
#include "gemmq8_body.h"
#undef Q8_SUFFIX
#undef Q8_IDOT
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

void ig__gemm_q8(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w, int m,
                 int k, int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return;
    switch (ig__cpu_isa()) {
#ifdef Q8_X86
    case IG_CPU_ISA_AVX512:
        gemmq8_avx512(y, ldy, xq, xd, w, m, k, n0, n1);
        return;
    case IG_CPU_ISA_AVX2:
        gemmq8_avx2(y, ldy, xq, xd, w, m, k, n0, n1);
        return;
#endif
    default:
        gemmq8_scalar(y, ldy, xq, xd, w, m, k, n0, n1);
    }
}
