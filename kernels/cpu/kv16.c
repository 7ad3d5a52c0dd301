/*
 * The 16-bit KV cache's conversions (docs/engine.md, "KV cache in 16
 * bits"): kv_append rounds each K and V row from F32 to F16 or BF16, round
 * to nearest, ties to even; attention widens the rows back to F32 (exact)
 * before its F32 arithmetic. The instruction set is chosen at run time
 * (isa.c): AVX-512, AVX2 with F16C, or plain C (dtype.c's scalar
 * conversions). Every path gives the same bits as the C one, NaN and
 * subnormals included (test_kernels_kv16).
 */
#include "cpu_internal.h"

#include "infergate/dtype.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV16_X86 1
#endif

/* ---- plain C ---------------------------------------------------------- */

static void store_scalar(uint16_t *dst, const float *src, size_t n, int bf16)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16 ? ig_f32_to_bf16(src[i]) : ig_f32_to_f16(src[i]);
}

static void load_scalar(float *dst, const uint16_t *src, size_t n, int bf16)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16 ? ig_bf16_to_f32(src[i]) : ig_f16_to_f32(src[i]);
}

#ifdef KV16_X86
/* ---- AVX2 + F16C -------------------------------------------------------- */
IG__TARGET_BEGIN("avx2,fma,f16c")

/* BF16 of 8 floats, as ig_f32_to_bf16: add 0x7fff plus the kept lowest bit
 * and truncate; a NaN keeps its top bits and is made quiet instead. */
static inline __m128i bf16_round8(__m256i x)
{
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* 32 -> 16 bits: packus works per 128-bit lane, so gather the two
     * lanes' low halves after it. */
    r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(r);
}

static void store_avx2(uint16_t *dst, const float *src, size_t n, int bf16)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = bf16 ? bf16_round8(_mm256_castps_si256(x))
                         : _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    store_scalar(dst + i, src + i, n - i, bf16);
}

static void load_avx2(float *dst, const uint16_t *src, size_t n, int bf16)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        __m256 x = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                        : _mm256_cvtph_ps(h);
        _mm256_storeu_ps(dst + i, x);
    }
    load_scalar(dst + i, src + i, n - i, bf16);
}

IG__TARGET_END

/* ---- AVX-512 ------------------------------------------------------------ */
IG__TARGET_BEGIN("avx512f,avx512bw,avx512vl,fma,f16c")

static inline __m256i bf16_round16(__m512i x)
{
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    __m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

static void store_avx512(uint16_t *dst, const float *src, size_t n, int bf16)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        __m256i h = bf16 ? bf16_round16(_mm512_castps_si512(x))
                         : _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        __m256i h = bf16 ? bf16_round16(_mm512_castps_si512(x))
                         : _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static void load_avx512(float *dst, const uint16_t *src, size_t n, int bf16)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        __m512 x = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                        : _mm512_cvtph_ps(h);
        _mm512_storeu_ps(dst + i, x);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
        __m512 x = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                        : _mm512_cvtph_ps(h);
        _mm512_mask_storeu_ps(dst + i, m, x);
    }
}

IG__TARGET_END
#endif

void ig__kv16_store(uint16_t *dst, const float *src, size_t n, int bf16)
{
    switch (ig__cpu_isa()) {
#ifdef KV16_X86
    case IG_CPU_ISA_AVX512:
        store_avx512(dst, src, n, bf16);
        return;
    case IG_CPU_ISA_AVX2:
        store_avx2(dst, src, n, bf16);
        return;
#endif
    default:
        store_scalar(dst, src, n, bf16);
    }
}

void ig__kv16_load(float *dst, const uint16_t *src, size_t n, int bf16)
{
    switch (ig__cpu_isa()) {
#ifdef KV16_X86
    case IG_CPU_ISA_AVX512:
        load_avx512(dst, src, n, bf16);
        return;
    case IG_CPU_ISA_AVX2:
        load_avx2(dst, src, n, bf16);
        return;
#endif
    default:
        load_scalar(dst, src, n, bf16);
    }
}
