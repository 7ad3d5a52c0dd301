/*
 * GEMM on Q8_0 weights (GGUF's layout, include/infergate/dtype.h) computed
 * on that layout as it lies in memory: no packing, no copy. W(n, k) is n rows
 * of k / 32 blocks; x is quantized the same way per block of 32 (a scale per
 * block kept in F32, q = round(x / d)) once per matmul, and each block
 * contributes d_w * d_x * sum q_w q_x, the integer sum exact.
 *
 * The integer dot product of a block:
 *   - AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, so the
 *     weights go in as w + 128 (w ^ 0x80) and 128 * sum q_x, kept per block
 *     beside x (ig__q8_quantize_rows_sums), comes off the sum. Two blocks per
 *     512-bit register, 16 blocks per step reduced to their 16 exact sums by
 *     four rounds of pairwise adds (vpermt2d), one multiply-add per lane
 *     (lane j: block j of every 16), blocks past the last 16 one by one
 *     into a scalar;
 *   - AVX2: |x| times w with x's sign moved onto w (vpmaddubsw + vpmaddwd;
 *     pairs of products fit int16: 2 * 127 * 127 < 32767), eight blocks per
 *     step reduced by vphaddd, lane j accumulating block j of every 8;
 *   - plain C, block after block.
 * Each instruction set has one fixed order of float operations per output,
 * whatever m and the column range: a row gets the same bits alone or in a
 * batch, on any split of the columns (the instruction sets differ from each
 * other). Weights of -128 (never written by a quantizer, which stays within
 * +-127) would overflow the AVX2 sign trick.
 *
 * At batch 1 the kernel waits on memory: on the 1b preset's shapes one
 * thread of the AVX2-style loop ran 46 GB/s from L2 and this AVX-512 one 58,
 * against 28-39 GB/s that one thread streams from DRAM.
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

/* One block of 32: amax, d = amax / 127, q = roundf(x / d) (half away from
 * zero), and sum q. The AVX-512 version computes the same values: max is
 * exact in any order, and roundf is rebuilt from truncation. */
static int32_t quantize_block_scalar(int8_t *q, float *d, const float *x)
{
    float amax = 0.0f;
    for (int i = 0; i < IG_Q8_0_BLOCK; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float sc = amax / 127.0f, inv = sc != 0.0f ? 1.0f / sc : 0.0f;
    int32_t sum = 0;
    *d = sc;
    for (int i = 0; i < IG_Q8_0_BLOCK; i++) {
        q[i] = (int8_t)roundf(x[i] * inv);
        sum += q[i];
    }
    return sum;
}

#ifdef Q8_X86
IG__TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")
static inline __m512 round_away_avx512(__m512 t)
{
    __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(t, r)); /* exact */
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f),
                              _mm512_and_ps(t, _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN))));
    return _mm512_mask_add_ps(r, up, r, one);
}

static int32_t quantize_block_avx512(int8_t *q, float *d, const float *x)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float sc = amax / 127.0f, inv = sc != 0.0f ? 1.0f / sc : 0.0f;
    *d = sc;
    __m512 vi = _mm512_set1_ps(inv);
    __m512i qa = _mm512_cvtps_epi32(round_away_avx512(_mm512_mul_ps(a, vi)));
    __m512i qb = _mm512_cvtps_epi32(round_away_avx512(_mm512_mul_ps(b, vi)));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}
IG__TARGET_END
#endif

void ig__q8_quantize_rows_sums(int8_t *q, float *d, int32_t *s, const float *x, int m, int k)
{
    int nb = k / IG_Q8_0_BLOCK;
#ifdef Q8_X86
    int vec = ig__cpu_isa() == IG_CPU_ISA_AVX512;
#endif
    for (int r = 0; r < m; r++)
        for (int b = 0; b < nb; b++) {
            size_t at = (size_t)r * k + (size_t)b * IG_Q8_0_BLOCK, blk = (size_t)r * nb + b;
            int32_t sum;
#ifdef Q8_X86
            if (vec)
                sum = quantize_block_avx512(q + at, d + blk, x + at);
            else
#endif
                sum = quantize_block_scalar(q + at, d + blk, x + at);
            if (s != NULL)
                s[blk] = sum;
        }
}

void ig__q8_quantize_rows(int8_t *q, float *d, const float *x, int m, int k)
{
    ig__q8_quantize_rows_sums(q, d, NULL, x, m, k);
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
IG__TARGET_BEGIN("avx2,fma,f16c")
static inline __m256i idot_avx2(__m256i wq, __m256i xq)
{
    __m256i ax = _mm256_sign_epi8(xq, xq), sw = _mm256_sign_epi8(wq, xq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), _mm256_set1_epi16(1));
}

static inline float hsum8_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight blocks per step: their eight integer dot products are summed
 * into one vector of eight block sums (exact: integers), their scales
 * gathered, and one multiply-add per lane joins block j's sum to lane j's
 * running total; the ragged end goes block by block into a second vector. */
static void gemmq8_avx2(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w,
                        int m, int k, int n0, int n1)
{
    int nb = k / IG_Q8_0_BLOCK;
    size_t row = (size_t)nb * IG_Q8_0_BYTES;
    const __m256i idx = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    for (int c = n0; c < n1; c++) {
        const uint8_t *wr = w + (size_t)c * row;
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            __m256 acc = _mm256_setzero_ps(), tail = _mm256_setzero_ps();
            int b = 0;
            for (; b + 8 <= nb; b += 8) {
                const uint8_t *bl = wr + (size_t)b * IG_Q8_0_BYTES;
                __m256i v[8];
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    v[u] =
                        idot_avx2(_mm256_loadu_si256((const __m256i *)(bl + u * IG_Q8_0_BYTES + 2)),
                                  _mm256_loadu_si256((const __m256i *)(xa + (b + u) * 32)));
                __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
                __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
                __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
                __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                                                _mm256_permute2x128_si256(u0, u1, 0x31));
                __m256i g = _mm256_and_si256(
                    _mm256_i32gather_epi32((const int *)(const void *)bl, idx, 1), lo16);
                __m128i h =
                    _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
                __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(da + b));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);
            }
            for (; b < nb; b++) {
                const uint8_t *bl = wr + (size_t)b * IG_Q8_0_BYTES;
                __m256i s0 = idot_avx2(_mm256_loadu_si256((const __m256i *)(bl + 2)),
                                       _mm256_loadu_si256((const __m256i *)(xa + b * 32)));
                float d = _cvtsh_ss((unsigned short)(bl[0] | bl[1] << 8)) * da[b];
                tail = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d), tail);
            }
            y[(size_t)a * ldy + c] = hsum8_avx2(_mm256_add_ps(acc, tail));
        }
    }
}

IG__TARGET_END

IG__TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
/* Bytes ahead (measured on a Xeon VM: 1 KiB 7.5, 4 KiB 9.5, 8 KiB 9.9 GB/s
 * for one thread streaming 272 MiB, 8.4 without). */
#define Q8_PREFETCH 8192
/* The dot products of blocks b and b + 1 (whose quants lie 34 bytes
 * apart) with x's 64 bytes: 16 lanes, 8 per block, of w + 128 times x. */
static inline __m512i idot2_vnni(const uint8_t *blk, const int8_t *x)
{
    __m512i wv =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                           _mm256_loadu_si256((const __m256i *)(blk + IG_Q8_0_BYTES + 2)), 1);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                               _mm512_xor_si512(wv, _mm512_set1_epi8((char)0x80)),
                               _mm512_loadu_si512(x));
}

/* Lanes of a and b added in adjacent pairs: [a0+a1, a2+a3, ..., b14+b15]. */
static inline __m512i pairsum(__m512i a, __m512i b)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, ev, b),
                            _mm512_permutex2var_epi32(a, od, b));
}

static void gemmq8_avx512(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                          const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / IG_Q8_0_BLOCK;
    size_t row = (size_t)nb * IG_Q8_0_BYTES;
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(IG_Q8_0_BYTES));
    for (int c = n0; c < n1; c++) {
        const uint8_t *wr = w + (size_t)c * row;
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            const int32_t *sa = xs + (size_t)a * nb;
            __m512 acc = _mm512_setzero_ps();
            float tail = 0.0f;
            int b = 0;
            for (; b + 16 <= nb; b += 16) {
                const uint8_t *bl = wr + (size_t)b * IG_Q8_0_BYTES;
                const int8_t *xb = xa + (size_t)b * IG_Q8_0_BLOCK;
                /* The first row streams W from memory: ask for it
                 * Q8_PREFETCH ahead (the later rows find it in L1). */
                if (a == 0)
                    for (int l = 0; l < 16 * IG_Q8_0_BYTES; l += 64)
                        _mm_prefetch((const char *)(bl + Q8_PREFETCH + l), _MM_HINT_T0);
                __m512i p[8];
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    p[u] = idot2_vnni(bl + 2 * u * IG_Q8_0_BYTES, xb + 64 * u);
                /* 128 lanes -> 64 -> 32 -> 16 block sums, in block order. */
                __m512i q0 = pairsum(p[0], p[1]), q1 = pairsum(p[2], p[3]);
                __m512i q2 = pairsum(p[4], p[5]), q3 = pairsum(p[6], p[7]);
                __m512i r0 = pairsum(q0, q1), r1 = pairsum(q2, q3);
                __m512i sums = pairsum(r0, r1);
                sums = _mm512_sub_epi32(sums, _mm512_slli_epi32(_mm512_loadu_si512(sa + b), 7));
                __m256i h = _mm512_cvtepi32_epi16(
                    _mm512_i32gather_epi32(idx, (const void *)bl, 1)); /* the 16 F16 scales */
                __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_loadu_ps(da + b));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), d, acc);
            }
            for (; b < nb; b++) {
                const uint8_t *bl = wr + (size_t)b * IG_Q8_0_BYTES;
                __m256i v = _mm256_dpbusd_epi32(
                    _mm256_setzero_si256(),
                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bl + 2)),
                                     _mm256_set1_epi8((char)0x80)),
                    _mm256_loadu_si256((const __m256i *)(xa + (size_t)b * IG_Q8_0_BLOCK)));
                __m128i t =
                    _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
                int32_t s = _mm_cvtsi128_si32(t) - 128 * sa[b];
                float d = _cvtsh_ss((unsigned short)(bl[0] | bl[1] << 8)) * da[b];
                tail = fmaf(d, (float)s, tail);
            }
            y[(size_t)a * ldy + c] = _mm512_reduce_add_ps(acc) + tail;
        }
    }
}
IG__TARGET_END
#endif

void ig__gemm_q8(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                 const uint8_t *w, int m, int k, int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return;
    switch (ig__cpu_isa()) {
#ifdef Q8_X86
    case IG_CPU_ISA_AVX512:
        gemmq8_avx512(y, ldy, xq, xd, xs, w, m, k, n0, n1);
        return;
    case IG_CPU_ISA_AVX2:
        gemmq8_avx2(y, ldy, xq, xd, w, m, k, n0, n1);
        return;
#endif
    default:
        gemmq8_scalar(y, ldy, xq, xd, w, m, k, n0, n1);
    }
}
