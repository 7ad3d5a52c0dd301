/*
 * GEMM on 16-bit weights (BF16 or F16) kept in their stored precision:
 * y = x W^T with x in F32 and W widened to F32 in registers, one vector at a
 * time, right before its multiply-adds. The widening is exact (every BF16 and
 * F16 value is an F32 value), so the products are those of the F32 path on
 * the same weights and the error bounds of fp_bound.h hold unchanged; the
 * weights cross memory at half the bytes, which is what batch-1 decode waits
 * on.
 *
 * Layout: W(n, k) in panels of IG_GEMM16_NR output columns stored k-major
 * (panel[kk * NR + c] = W[p * NR + c][kk]), the last one padded with zeros,
 * the same on every instruction set. The instruction set is chosen at run
 * time (isa.c): AVX-512 (two vectors of 16 per panel row, 8 rows of x per
 * tile), AVX2 with F16C (four of 8, 2 rows), or plain C.
 */
#include "cpu_internal.h"

#include "infergate/dtype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define G16_X86 1
#endif

#define G16_SUB 32 /* products summed from zero before joining y (see gemm.c) */
#define G16_KC 256 /* k-block: an 16 KiB slice of a panel stays in L1 */

size_t ig__gemm16_packed_elems(int n, int k)
{
    return (size_t)((n + IG_GEMM16_NR - 1) / IG_GEMM16_NR) * IG_GEMM16_NR * (size_t)k;
}

void ig__gemm16_pack(uint16_t *dst, const uint16_t *w, int n, int k)
{
    for (int p = 0; p * IG_GEMM16_NR < n; p++) {
        uint16_t *panel = dst + (size_t)p * IG_GEMM16_NR * k;
        int rows = n - p * IG_GEMM16_NR < IG_GEMM16_NR ? n - p * IG_GEMM16_NR : IG_GEMM16_NR;
        if (rows < IG_GEMM16_NR)
            memset(panel, 0, (size_t)IG_GEMM16_NR * k * sizeof(uint16_t));
        for (int c = 0; c < rows; c++) {
            const uint16_t *src = w + (size_t)(p * IG_GEMM16_NR + c) * k;
            for (int kk = 0; kk < k; kk++)
                panel[(size_t)kk * IG_GEMM16_NR + c] = src[kk];
        }
    }
}

void ig__gemm16_unpack_row(float *dst, const uint16_t *packed, int bf16, int k, int row)
{
    const uint16_t *p =
        packed + (size_t)(row / IG_GEMM16_NR) * IG_GEMM16_NR * k + row % IG_GEMM16_NR;
    for (int kk = 0; kk < k; kk++) {
        uint16_t h = p[(size_t)kk * IG_GEMM16_NR];
        dst[kk] = bf16 ? ig_bf16_to_f32(h) : ig_f16_to_f32(h);
    }
}

/* ---- plain C ---------------------------------------------------------- */

static void gemm16_scalar(float *y, int ldy, const float *x, const uint16_t *packed, int bf16,
                          int m, int k, int n, int n0, int n1)
{
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * k;
        for (int col = n0; col < n1 && col < n; col++) {
            const uint16_t *p =
                packed + (size_t)(col / IG_GEMM16_NR) * IG_GEMM16_NR * k + col % IG_GEMM16_NR;
            float sum = 0.0f;
            for (int s0 = 0; s0 < k; s0 += G16_SUB) {
                int se = s0 + G16_SUB < k ? s0 + G16_SUB : k;
                float acc = 0.0f;
                for (int kk = s0; kk < se; kk++) {
                    uint16_t h = p[(size_t)kk * IG_GEMM16_NR];
                    acc = fmaf(xr[kk], bf16 ? ig_bf16_to_f32(h) : ig_f16_to_f32(h), acc);
                }
                sum = s0 == 0 ? acc : sum + acc;
            }
            y[(size_t)r * ldy + col] = sum;
        }
    }
}

#ifdef G16_X86
/* ---- AVX2 + FMA + F16C ------------------------------------------------ */
IG__TARGET_BEGIN("avx2,fma,f16c")
#define T16_SUFFIX avx2
#define T16_V __m256
#define T16_VL 8
#define T16_NV 4
#define T16_MR 2
#define T16_ZERO() _mm256_setzero_ps()
#define T16_SET1(v) _mm256_set1_ps(v)
#define T16_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define T16_ADD(a, b) _mm256_add_ps((a), (b))
#define T16_LOADF(p) _mm256_loadu_ps(p)
#define T16_STOREF(p, v) _mm256_storeu_ps((p), (v))
#define T16_BF16(p)                                                                                \
    _mm256_castsi256_ps(                                                                           \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define T16_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#include "gemm16_tile.h"
IG__TARGET_END

/* ---- AVX-512 ---------------------------------------------------------- */
IG__TARGET_BEGIN("avx512f,avx512bw,avx512vl,fma,f16c")
#define T16_SUFFIX avx512
#define T16_V __m512
#define T16_VL 16
#define T16_NV 2
#define T16_MR 8
#define T16_ZERO() _mm512_setzero_ps()
#define T16_SET1(v) _mm512_set1_ps(v)
#define T16_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define T16_ADD(a, b) _mm512_add_ps((a), (b))
#define T16_LOADF(p) _mm512_loadu_ps(p)
#define T16_STOREF(p, v) _mm512_storeu_ps((p), (v))
#define T16_BF16(p)                                                                                \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define T16_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#include "gemm16_tile.h"
IG__TARGET_END
#endif

void ig__gemm16(float *y, int ldy, const float *x, const uint16_t *packed, int bf16, int m, int k,
                int n, int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return;
    switch (ig__cpu_isa()) {
#ifdef G16_X86
    case IG_CPU_ISA_AVX512:
        gemm16_avx512(y, ldy, x, packed, bf16, m, k, n, n0, n1);
        return;
    case IG_CPU_ISA_AVX2:
        gemm16_avx2(y, ldy, x, packed, bf16, m, k, n, n0, n1);
        return;
#endif
    default:
        gemm16_scalar(y, ldy, x, packed, bf16, m, k, n, n0, n1);
    }
}
