/*
 * GEMM on Q4_K and Q6_K weights (GGUF's K-quants, include/infergate/dtype.h).
 *
 * Both are rewritten at upload, without loss, into one panel layout of
 * unsigned integer weights with F32 scales and offsets per 16 weights: a
 * weight is s * q - o, with
 *   - Q4_K: q the nibble (0..15), s = d * sc[j] and o = dmin * m[j] of its
 *     sub-block of 32 (both halves the same);
 *   - Q6_K: q the 6-bit value (0..63), s = d * sc[i / 16] and o = 32 s.
 * s and o are exact in F32 (an F16 times an integer of at most 8 bits), so
 * the values are ggml's: what dequantize_row_q4_K / _q6_K compute, up to
 * where they round (ig__kqp_unpack_row gives the same values; s q - o is
 * exact for both, so only a zero's sign can differ from ggml's product).
 *
 * Panels of 16 rows (output columns) as in gemmq8.c; block b of a panel
 * covers k in [32 b, 32 b + 32): s[half][row] and o[half][row] as F32 (256
 * bytes), then the weights by quads of k, [quad][row][4 bytes] (512). 768
 * bytes per 512 weights: 1.5 bytes a weight, against 0.56 (Q4_K) and 0.82
 * (Q6_K) in the file, and 4 for F32. x is quantized per block of 32 as for
 * Q8_0 (ig__q8_quantize_rows_sums); each half h of a block adds
 * d_x * (s_h * sum q q_x - o_h * sum q_x), the integer sums exact:
 *   - AVX-512 VNNI: vpdpbusd on the unsigned weights and x's signed quads;
 *   - AVX2: vpmaddubsw + vpmaddwd (pairs at most 2 * 63 * 127 < 32767);
 *   - plain C.
 * The float side is the same on every path, per block in order:
 *   acc = fma((float)i0, s0 * dx, acc); acc = fma((float)i1, s1 * dx, acc);
 *   acc = fma(-(o0 * (float)x0 + o1 * (float)x1), dx, acc)
 * (x0, x1 the halves' sums of q_x; the products and sums in F32), so an
 * output has the same bits on every instruction set, alone or batched.
 */
#include "cpu_internal.h"

#include "infergate/dtype.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KQ_X86 1
#endif

#define KQ_NR IG_KQP_NR

/* ---- the panel layout ------------------------------------------------- */

static inline const uint8_t *kqp_block(const uint8_t *w, int nb, int p, int b)
{
    return w + ((size_t)p * nb + b) * IG_KQP_BLOCK_BYTES;
}

/* Scale / offset of half h of row l; weight i of row l. */
static inline float kqp_f(const uint8_t *blk, int which, int h, int l)
{
    float v;
    memcpy(&v, blk + 4 * ((which * 2 + h) * KQ_NR + l), 4);
    return v;
}

static inline int kqp_at(int l, int i)
{
    return 16 * KQ_NR + (i / 4) * 4 * KQ_NR + 4 * l + i % 4;
}

size_t ig__kqp_packed_bytes(int n, int k)
{
    size_t panels = ((size_t)n + KQ_NR - 1) / KQ_NR;
    return panels * (size_t)(k / 32) * IG_KQP_BLOCK_BYTES;
}

/* One super-block of 256 as q (256 bytes), s and o (16 halves each). */
static void q4_k_split(uint8_t *q, float *s, float *o, const uint8_t *blk)
{
    uint16_t h;
    memcpy(&h, blk, 2);
    float d = ig_f16_to_f32(h);
    memcpy(&h, blk + 2, 2);
    float dmin = ig_f16_to_f32(h);
    const uint8_t *sc = blk + 4, *qs = blk + 16;
    for (int j = 0; j < 8; j++) {
        int a, m;
        if (j < 4) {
            a = sc[j] & 63;
            m = sc[j + 4] & 63;
        } else {
            a = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
            m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        s[2 * j] = s[2 * j + 1] = d * (float)a;
        o[2 * j] = o[2 * j + 1] = dmin * (float)m;
        const uint8_t *qj = qs + 32 * (j / 2);
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)(j % 2 ? qj[l] >> 4 : qj[l] & 15);
    }
}

static void q6_k_split(uint8_t *q, float *s, float *o, const uint8_t *blk)
{
    uint16_t h;
    memcpy(&h, blk + 208, 2);
    float d = ig_f16_to_f32(h);
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            uint8_t *qq = q + 128 * half;
            qq[l] = (uint8_t)((ql[l] & 15) | ((qh[l] >> 0 & 3) << 4));
            qq[l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2 & 3) << 4));
            qq[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4));
            qq[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4));
        }
    for (int i = 0; i < 16; i++) {
        s[i] = d * (float)sc[i];
        o[i] = 32.0f * s[i]; /* exact: a power of two */
    }
}

int ig__kqp_pack(uint8_t *dst, const uint8_t *src, ig_dtype_t dtype, int n, int k)
{
    if (dtype != IG_DTYPE_Q4_K && dtype != IG_DTYPE_Q6_K)
        return -1;
    int nb = k / 32, panels = (n + KQ_NR - 1) / KQ_NR;
    size_t row = ig_dtype_bytes(dtype, (size_t)k), sbb = ig_dtype_bytes(dtype, IG_QK_K);
    uint8_t q[IG_QK_K];
    float s[16], o[16];
    for (int p = 0; p < panels; p++)
        for (int l = 0; l < KQ_NR; l++) {
            int r = p * KQ_NR + l;
            for (int sb = 0; sb < k / IG_QK_K; sb++) {
                if (r < n) {
                    const uint8_t *from = src + (size_t)r * row + (size_t)sb * sbb;
                    if (dtype == IG_DTYPE_Q4_K)
                        q4_k_split(q, s, o, from);
                    else
                        q6_k_split(q, s, o, from);
                } else { /* a padding column: weights 0 */
                    memset(q, 0, sizeof(q));
                    memset(s, 0, sizeof(s));
                    memset(o, 0, sizeof(o));
                }
                for (int j = 0; j < 8; j++) {
                    uint8_t *blk = (uint8_t *)kqp_block(dst, nb, p, sb * 8 + j);
                    for (int h = 0; h < 2; h++) {
                        memcpy(blk + 4 * (h * KQ_NR + l), &s[2 * j + h], 4);
                        memcpy(blk + 4 * ((2 + h) * KQ_NR + l), &o[2 * j + h], 4);
                    }
                    for (int i = 0; i < 32; i++)
                        blk[kqp_at(l, i)] = q[32 * j + i];
                }
            }
        }
    return 0;
}

void ig__kqp_unpack_row(float *dst, const uint8_t *packed, int k, int row)
{
    int nb = k / 32, p = row / KQ_NR, l = row % KQ_NR;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = kqp_block(packed, nb, p, b);
        for (int i = 0; i < 32; i++) {
            float s = kqp_f(blk, 0, i / 16, l), o = kqp_f(blk, 1, i / 16, l);
            dst[32 * b + i] = s * (float)blk[kqp_at(l, i)] - o;
        }
    }
}

/* x's half-block sums of q (m, k / 16), from the block's bytes. */
static int32_t *half_sums(const int8_t *xq, int m, int k)
{
    int32_t *hs = malloc((size_t)m * (k / 16) * sizeof(int32_t));
    if (hs == NULL)
        return NULL;
    for (size_t i = 0; i < (size_t)m * (k / 16); i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += xq[16 * i + j];
        hs[i] = s;
    }
    return hs;
}

/* The float side of one block for one output, the same on every path. */
static inline float kq_block_f(float acc, int32_t i0, int32_t i1, float s0, float s1, float o0,
                               float o1, int32_t x0, int32_t x1, float dx)
{
    /* One operation a statement: no compiler fuses across them. */
    float d0 = s0 * dx, d1 = s1 * dx;
    acc = fmaf((float)i0, d0, acc);
    acc = fmaf((float)i1, d1, acc);
    float p0 = o0 * (float)x0;
    float p1 = o1 * (float)x1;
    float off = p0 + p1;
    return fmaf(-off, dx, acc);
}

/* ---- plain C ---------------------------------------------------------- */

#ifdef __clang__
#define KQ_NO_VECTORIZE
#else
#define KQ_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#endif
KQ_NO_VECTORIZE static void gemmkq_scalar(float *y, int ldy, const int8_t *xq, const float *xd,
                                          const int32_t *hs, const uint8_t *w, int m, int k, int n0,
                                          int n1)
{
    int nb = k / 32;
    for (int c = n0; c < n1; c++)
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            float acc = 0.0f;
            int l = c % KQ_NR;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = kqp_block(w, nb, c / KQ_NR, b);
                int32_t s[2] = {0, 0};
#ifdef __clang__
#pragma clang loop vectorize(disable)
#endif
                for (int i = 0; i < 32; i++)
                    s[i / 16] += (int32_t)blk[kqp_at(l, i)] * xa[32 * b + i];
                acc = kq_block_f(acc, s[0], s[1], kqp_f(blk, 0, 0, l), kqp_f(blk, 0, 1, l),
                                 kqp_f(blk, 1, 0, l), kqp_f(blk, 1, 1, l),
                                 hs[(size_t)a * 2 * nb + 2 * b], hs[(size_t)a * 2 * nb + 2 * b + 1],
                                 xd[(size_t)a * nb + b]);
            }
            y[(size_t)a * ldy + c] = acc;
        }
}

#ifdef KQ_X86
static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- AVX2 --------------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c")
/* The float side for 8 columns (one half of a panel): lanes of i0, i1. */
static inline __m256 kq_f_avx2(__m256 acc, __m256i i0, __m256i i1, const uint8_t *blk, int c8,
                               int32_t x0, int32_t x1, float dx)
{
    __m256 vdx = _mm256_set1_ps(dx);
    __m256 s0 = _mm256_loadu_ps((const float *)(blk) + c8);
    __m256 s1 = _mm256_loadu_ps((const float *)(blk) + KQ_NR + c8);
    __m256 o0 = _mm256_loadu_ps((const float *)(blk) + 2 * KQ_NR + c8);
    __m256 o1 = _mm256_loadu_ps((const float *)(blk) + 3 * KQ_NR + c8);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(s0, vdx), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(s1, vdx), acc);
    __m256 off = _mm256_add_ps(_mm256_mul_ps(o0, _mm256_set1_ps((float)x0)),
                               _mm256_mul_ps(o1, _mm256_set1_ps((float)x1)));
    return _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), off), vdx, acc);
}

/* Rows [a, a + mr) (mr <= 2) by one panel. */
static inline __attribute__((always_inline)) void tile_avx2(const int mr, float *y, int ldy,
                                                            const int8_t *xq, const float *xd,
                                                            const int32_t *hs, const uint8_t *pw,
                                                            int nb, int k, int ncols)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[2][2];
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++)
        f[a][0] = f[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * IG_KQP_BLOCK_BYTES;
        __m256i acc[2][2][2]; /* [row][half of k][half of the panel] */
#pragma GCC unroll 2
        for (int a = 0; a < mr; a++)
            acc[a][0][0] = acc[a][0][1] = acc[a][1][0] = acc[a][1][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            const uint8_t *wq = blk + kqp_at(0, 4 * q);
            __m256i w0 = _mm256_loadu_si256((const __m256i *)wq);
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(wq + 32));
#pragma GCC unroll 2
            for (int a = 0; a < mr; a++) {
                __m256i xv = _mm256_set1_epi32(load_i32(xq + (size_t)a * k + 32 * b + 4 * q));
                acc[a][q / 4][0] = _mm256_add_epi32(
                    acc[a][q / 4][0], _mm256_madd_epi16(_mm256_maddubs_epi16(w0, xv), ones));
                acc[a][q / 4][1] = _mm256_add_epi32(
                    acc[a][q / 4][1], _mm256_madd_epi16(_mm256_maddubs_epi16(w1, xv), ones));
            }
        }
#pragma GCC unroll 2
        for (int a = 0; a < mr; a++) {
            const int32_t *h = hs + (size_t)a * 2 * nb + 2 * b;
            float dx = xd[(size_t)a * nb + b];
            f[a][0] = kq_f_avx2(f[a][0], acc[a][0][0], acc[a][1][0], blk, 0, h[0], h[1], dx);
            f[a][1] = kq_f_avx2(f[a][1], acc[a][0][1], acc[a][1][1], blk, 8, h[0], h[1], dx);
        }
    }
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++) {
        float out[KQ_NR];
        _mm256_storeu_ps(out, f[a][0]);
        _mm256_storeu_ps(out + 8, f[a][1]);
        memcpy(y + (size_t)a * ldy, out, (size_t)ncols * sizeof(float));
    }
}

static void gemmkq_avx2(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *hs,
                        const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / 32;
    for (int c = n0; c < n1; c += KQ_NR) {
        const uint8_t *pw = kqp_block(w, nb, c / KQ_NR, 0);
        int ncols = n1 - c < KQ_NR ? n1 - c : KQ_NR;
        int a = 0;
        for (; a + 2 <= m; a += 2)
            tile_avx2(2, y + (size_t)a * ldy + c, ldy, xq + (size_t)a * k, xd + (size_t)a * nb,
                      hs + (size_t)a * 2 * nb, pw, nb, k, ncols);
        if (a < m)
            tile_avx2(1, y + (size_t)a * ldy + c, ldy, xq + (size_t)a * k, xd + (size_t)a * nb,
                      hs + (size_t)a * 2 * nb, pw, nb, k, ncols);
    }
}
IG__TARGET_END

/* ---- AVX-512 VNNI --------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
/* Rows [a, a + mr) (mr <= 4) by np (1 or 2) panels. */
static inline __attribute__((always_inline)) void
tile_avx512(const int mr, const int np, float *y, int ldy, const int8_t *xq, const float *xd,
            const int32_t *hs, const uint8_t *pw, size_t pstride, int nb, int k, int ncols)
{
    __m512 f[4][2];
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
        for (int p = 0; p < np; p++)
            f[a][p] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * IG_KQP_BLOCK_BYTES;
        __m512i acc[4][2][2]; /* [row][panel][half of k] */
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
            for (int p = 0; p < np; p++)
                acc[a][p][0] = acc[a][p][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            __m512i wv[2];
#pragma GCC unroll 2
            for (int p = 0; p < np; p++)
                wv[p] = _mm512_loadu_si512(blk + p * pstride + kqp_at(0, 4 * q));
#pragma GCC unroll 4
            for (int a = 0; a < mr; a++) {
                __m512i xv = _mm512_set1_epi32(load_i32(xq + (size_t)a * k + 32 * b + 4 * q));
#pragma GCC unroll 2
                for (int p = 0; p < np; p++)
                    acc[a][p][q / 4] = _mm512_dpbusd_epi32(acc[a][p][q / 4], wv[p], xv);
            }
        }
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++) {
            const int32_t *h = hs + (size_t)a * 2 * nb + 2 * b;
            __m512 vdx = _mm512_set1_ps(xd[(size_t)a * nb + b]);
            __m512 x0 = _mm512_set1_ps((float)h[0]), x1 = _mm512_set1_ps((float)h[1]);
#pragma GCC unroll 2
            for (int p = 0; p < np; p++) {
                const float *fb = (const float *)(blk + p * pstride);
                __m512 s0 = _mm512_loadu_ps(fb), s1 = _mm512_loadu_ps(fb + KQ_NR);
                __m512 o0 = _mm512_loadu_ps(fb + 2 * KQ_NR), o1 = _mm512_loadu_ps(fb + 3 * KQ_NR);
                __m512 g = f[a][p];
                g = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[a][p][0]), _mm512_mul_ps(s0, vdx), g);
                g = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[a][p][1]), _mm512_mul_ps(s1, vdx), g);
                __m512 off = _mm512_add_ps(_mm512_mul_ps(o0, x0), _mm512_mul_ps(o1, x1));
                f[a][p] = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), off), vdx, g);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
        for (int p = 0; p < np; p++) {
            int left = ncols - p * KQ_NR;
            __mmask16 mask = left >= KQ_NR ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            _mm512_mask_storeu_ps(y + (size_t)a * ldy + p * KQ_NR, mask, f[a][p]);
        }
}

#define KQ_TILE(MR, NP)                                                                            \
    tile_avx512(MR, NP, yt, ldy, xq + (size_t)a * k, xd + (size_t)a * nb, hs + (size_t)a * 2 * nb, \
                pw, pstride, nb, k, ncols)

static void gemmkq_avx512(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *hs,
                          const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / 32;
    size_t pstride = (size_t)nb * IG_KQP_BLOCK_BYTES;
    for (int c = n0; c < n1; c += 2 * KQ_NR) {
        const uint8_t *pw = kqp_block(w, nb, c / KQ_NR, 0);
        int ncols = n1 - c < 2 * KQ_NR ? n1 - c : 2 * KQ_NR;
        int np = (ncols + KQ_NR - 1) / KQ_NR;
        for (int a = 0; a < m; a += 4) {
            float *yt = y + (size_t)a * ldy + c;
            switch ((m - a < 4 ? m - a : 4) * 2 + np - 1) {
            case 4 * 2 + 1:
                KQ_TILE(4, 2);
                break;
            case 4 * 2:
                KQ_TILE(4, 1);
                break;
            case 3 * 2 + 1:
                KQ_TILE(3, 2);
                break;
            case 3 * 2:
                KQ_TILE(3, 1);
                break;
            case 2 * 2 + 1:
                KQ_TILE(2, 2);
                break;
            case 2 * 2:
                KQ_TILE(2, 1);
                break;
            case 2 + 1:
                KQ_TILE(1, 2);
                break;
            default:
                KQ_TILE(1, 1);
            }
        }
    }
}
#undef KQ_TILE
IG__TARGET_END
#endif

int ig__gemm_kq(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w, int m,
                int k, int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return 0;
    int32_t *hs = half_sums(xq, m, k);
    if (hs == NULL)
        return -1;
    switch (ig__cpu_isa()) {
#ifdef KQ_X86
    case IG_CPU_ISA_AVX512:
        gemmkq_avx512(y, ldy, xq, xd, hs, w, m, k, n0, n1);
        break;
    case IG_CPU_ISA_AVX2:
        gemmkq_avx2(y, ldy, xq, xd, hs, w, m, k, n0, n1);
        break;
#endif
    default:
        gemmkq_scalar(y, ldy, xq, xd, hs, w, m, k, n0, n1);
    }
    free(hs);
    return 0;
}
