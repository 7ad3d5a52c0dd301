/*
 * GEMM on Q4_0 weights (GGUF's blocks of 32 weights in 18 bytes: an F16
 * scale d and 16 bytes of nibbles, weight i the low nibble of byte i and
 * weight i + 16 its high nibble, value d * (q - 8); include/infergate/dtype.h).
 *
 * The scheme is gemmq8.c's: upload_weight packs W(n, k) once into panels of
 * 16 rows (output columns), x is quantized per block of 32 as for Q8_0
 * (ig__q8_quantize_rows_sums: int8 q, an F32 scale and the block's sum),
 * and each block contributes d_w * d_x * sum (q_w - 8) q_x, the integer sum
 * exact. Block b of a panel is its 16 scales, then 4 groups of 64 bytes:
 * group g holds bytes 4g..4g+3 of each row's nibbles, [row][4 bytes], so
 * its low nibbles are the 16 rows' quad g of k (weights 4g..4g+3) and its
 * high nibbles their quad g + 4 (weights 16 + 4g..16 + 4g + 3). The file's
 * bytes, moved, not changed: 288 = 16 x 18.
 *
 * The integer dot product of a block, per instruction set:
 *   - AVX-512 VNNI: the nibbles are unsigned 0..15, which vpdpbusd takes
 *     as they are against x's signed quads broadcast; the block's sum
 *     starts at -8 * sum q_x, which takes the 8 off;
 *   - AVX2: vpmaddubsw (unsigned nibble times signed x) for the low and
 *     the high quads of every group, summed in 16 bits (16 products of at
 *     most 15 * 127 each: 30480 < 32767), then one vpmaddwd per block;
 *   - plain C, weight by weight.
 * Then on every path, for each block in order, d = d_w * d_x and
 * acc = fma((float)sum, d, acc): one order of float operations per output,
 * so a row gets the same bits alone or in a batch, on any CPU.
 */
#include "cpu_internal.h"

#include "infergate/dtype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q4_X86 1
#endif

/* ---- the panel layout ------------------------------------------------- */

/* Where block b of panel p lies; where in a block byte j (0..15) of row
 * l's nibbles lies: group j / 4, [row][4]. */
static inline const uint8_t *q4p_block(const uint8_t *w, int nb, int p, int b)
{
    return w + ((size_t)p * nb + b) * IG_Q4P_BLOCK_BYTES;
}

static inline int q4p_at(int l, int j)
{
    return 2 * IG_Q4P_NR + (j / 4) * 4 * IG_Q4P_NR + 4 * l + j % 4;
}

static inline float q4p_scale(const uint8_t *blk, int l)
{
    uint16_t h;
    memcpy(&h, blk + 2 * l, 2);
    return ig_f16_to_f32(h);
}

/* Weight i (0..31) of row l, as q - 8. */
static inline int q4p_quant(const uint8_t *blk, int l, int i)
{
    uint8_t byte = blk[q4p_at(l, i % 16)];
    return (i < 16 ? byte & 15 : byte >> 4) - 8;
}

size_t ig__q4p_packed_bytes(int n, int k)
{
    size_t panels = ((size_t)n + IG_Q4P_NR - 1) / IG_Q4P_NR;
    return panels * (size_t)(k / IG_Q4_0_BLOCK) * IG_Q4P_BLOCK_BYTES;
}

void ig__q4p_pack(uint8_t *dst, const uint8_t *src, int n, int k)
{
    int nb = k / IG_Q4_0_BLOCK, panels = (n + IG_Q4P_NR - 1) / IG_Q4P_NR;
    size_t row = (size_t)nb * IG_Q4_0_BYTES;
    for (int p = 0; p < panels; p++)
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = (uint8_t *)q4p_block(dst, nb, p, b);
            for (int l = 0; l < IG_Q4P_NR; l++) {
                int r = p * IG_Q4P_NR + l;
                const uint8_t *from =
                    r < n ? src + (size_t)r * row + (size_t)b * IG_Q4_0_BYTES : NULL;
                if (from != NULL)
                    memcpy(blk + 2 * l, from, 2);
                else
                    memset(blk + 2 * l, 0, 2); /* a padding column: scale 0 */
                for (int j = 0; j < IG_Q4_0_BLOCK / 2; j++)
                    blk[q4p_at(l, j)] = from != NULL ? from[2 + j] : 0x88;
            }
        }
}

void ig__q4p_unpack_row(float *dst, const uint8_t *packed, int k, int row)
{
    int nb = k / IG_Q4_0_BLOCK, p = row / IG_Q4P_NR, l = row % IG_Q4P_NR;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = q4p_block(packed, nb, p, b);
        float d = q4p_scale(blk, l);
        for (int i = 0; i < IG_Q4_0_BLOCK; i++)
            dst[b * IG_Q4_0_BLOCK + i] = d * (float)q4p_quant(blk, l, i);
    }
}

/* ---- plain C ---------------------------------------------------------- */

/* Kept from the vectorizer for gemmq8.c's reason: GCC may turn the integer
 * sum into vpdpbusd with the operands' signs wrong. */
#ifdef __clang__
#define Q4_NO_VECTORIZE
#else
#define Q4_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#endif
Q4_NO_VECTORIZE static void gemmq4_scalar(float *y, int ldy, const int8_t *xq, const float *xd,
                                          const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / IG_Q4_0_BLOCK;
    for (int c = n0; c < n1; c++)
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = q4p_block(w, nb, c / IG_Q4P_NR, b);
                int32_t s = 0;
#ifdef __clang__
#pragma clang loop vectorize(disable)
#endif
                for (int i = 0; i < IG_Q4_0_BLOCK; i++)
                    s += q4p_quant(blk, c % IG_Q4P_NR, i) * xa[b * IG_Q4_0_BLOCK + i];
                float d = q4p_scale(blk, c % IG_Q4P_NR) * xd[(size_t)a * nb + b];
                acc = fmaf((float)s, d, acc);
            }
            y[(size_t)a * ldy + c] = acc;
        }
}

#ifdef Q4_X86
static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- AVX2 --------------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c")
/* Rows [a, a + mr) (mr <= 2) by one panel (two halves of 8 columns). */
static inline __attribute__((always_inline)) void tile_avx2(const int mr, float *y, int ldy,
                                                            const int8_t *xq, const float *xd,
                                                            const int32_t *xs, const uint8_t *pw,
                                                            int nb, int k, int ncols)
{
    const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 f[2][2];
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++)
        f[a][0] = f[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * IG_Q4P_BLOCK_BYTES;
        __m256i s16[2][2];
#pragma GCC unroll 2
        for (int a = 0; a < mr; a++)
            s16[a][0] = s16[a][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const uint8_t *wg = blk + q4p_at(0, 4 * g);
            __m256i r0 = _mm256_loadu_si256((const __m256i *)wg);
            __m256i r1 = _mm256_loadu_si256((const __m256i *)(wg + 32));
            __m256i l0 = _mm256_and_si256(r0, lo4), l1 = _mm256_and_si256(r1, lo4);
            __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), lo4);
            __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), lo4);
#pragma GCC unroll 2
            for (int a = 0; a < mr; a++) {
                const int8_t *xb = xq + (size_t)a * k + b * 32;
                __m256i xl = _mm256_set1_epi32(load_i32(xb + 4 * g));
                __m256i xh = _mm256_set1_epi32(load_i32(xb + 16 + 4 * g));
                s16[a][0] =
                    _mm256_add_epi16(s16[a][0], _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl),
                                                                 _mm256_maddubs_epi16(h0, xh)));
                s16[a][1] =
                    _mm256_add_epi16(s16[a][1], _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl),
                                                                 _mm256_maddubs_epi16(h1, xh)));
            }
        }
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
#pragma GCC unroll 2
        for (int a = 0; a < mr; a++) {
            __m256i off = _mm256_set1_epi32(-8 * xs[(size_t)a * nb + b]);
            __m256i i0 = _mm256_add_epi32(_mm256_madd_epi16(s16[a][0], ones), off);
            __m256i i1 = _mm256_add_epi32(_mm256_madd_epi16(s16[a][1], ones), off);
            __m256 dx = _mm256_set1_ps(xd[(size_t)a * nb + b]);
            f[a][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(d0, dx), f[a][0]);
            f[a][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(d1, dx), f[a][1]);
        }
    }
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++) {
        float out[IG_Q4P_NR];
        _mm256_storeu_ps(out, f[a][0]);
        _mm256_storeu_ps(out + 8, f[a][1]);
        memcpy(y + (size_t)a * ldy, out, (size_t)ncols * sizeof(float));
    }
}

static void gemmq4_avx2(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                        const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / IG_Q4_0_BLOCK;
    for (int c = n0; c < n1; c += IG_Q4P_NR) {
        const uint8_t *pw = q4p_block(w, nb, c / IG_Q4P_NR, 0);
        int ncols = n1 - c < IG_Q4P_NR ? n1 - c : IG_Q4P_NR;
        int a = 0;
        for (; a + 2 <= m; a += 2)
            tile_avx2(2, y + (size_t)a * ldy + c, ldy, xq + (size_t)a * k, xd + (size_t)a * nb,
                      xs + (size_t)a * nb, pw, nb, k, ncols);
        if (a < m)
            tile_avx2(1, y + (size_t)a * ldy + c, ldy, xq + (size_t)a * k, xd + (size_t)a * nb,
                      xs + (size_t)a * nb, pw, nb, k, ncols);
    }
}
IG__TARGET_END

/* ---- AVX-512 VNNI --------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
/* Rows [a, a + mr) (mr <= 4) by np (1 to 4; 2 at most with mr > 1) panels:
 * per group, one load of 64 bytes gives two quads of the 16 columns (low
 * and high nibbles), each a vpdpbusd against x's quad broadcast. */
static inline __attribute__((always_inline)) void
tile_avx512(const int mr, const int np, float *y, int ldy, const int8_t *xq, const float *xd,
            const int32_t *xs, const uint8_t *pw, size_t pstride, int nb, int k, int ncols)
{
    const __m512i lo4 = _mm512_set1_epi8(15);
    __m512 f[4][4];
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int p = 0; p < np; p++)
            f[a][p] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * IG_Q4P_BLOCK_BYTES;
        __m512i acc[4][4];
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++) {
            __m512i init = _mm512_set1_epi32(-8 * xs[(size_t)a * nb + b]);
#pragma GCC unroll 4
            for (int p = 0; p < np; p++)
                acc[a][p] = init;
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i wl[4], wh[4];
#pragma GCC unroll 4
            for (int p = 0; p < np; p++) {
                __m512i r = _mm512_loadu_si512(blk + p * pstride + q4p_at(0, 4 * g));
                wl[p] = _mm512_and_si512(r, lo4);
                wh[p] = _mm512_and_si512(_mm512_srli_epi16(r, 4), lo4);
            }
#pragma GCC unroll 4
            for (int a = 0; a < mr; a++) {
                const int8_t *xb = xq + (size_t)a * k + b * 32;
                __m512i xl = _mm512_set1_epi32(load_i32(xb + 4 * g));
                __m512i xh = _mm512_set1_epi32(load_i32(xb + 16 + 4 * g));
#pragma GCC unroll 4
                for (int p = 0; p < np; p++)
                    acc[a][p] =
                        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[a][p], wl[p], xl), wh[p], xh);
            }
        }
        __m512 dw[4];
#pragma GCC unroll 4
        for (int p = 0; p < np; p++)
            dw[p] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + p * pstride)));
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++) {
            __m512 dx = _mm512_set1_ps(xd[(size_t)a * nb + b]);
#pragma GCC unroll 4
            for (int p = 0; p < np; p++)
                f[a][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[a][p]), _mm512_mul_ps(dw[p], dx),
                                          f[a][p]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int p = 0; p < np; p++) {
            int left = ncols - p * IG_Q4P_NR;
            __mmask16 mask = left >= IG_Q4P_NR ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            _mm512_mask_storeu_ps(y + (size_t)a * ldy + p * IG_Q4P_NR, mask, f[a][p]);
        }
}

#define Q4_TILE(MR, NP)                                                                            \
    tile_avx512(MR, NP, yt, ldy, xq + (size_t)a * k, xd + (size_t)a * nb, xs + (size_t)a * nb, pw, \
                pstride, nb, k, ncols)

static void gemmq4_avx512(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                          const uint8_t *w, int m, int k, int n0, int n1)
{
    int nb = k / IG_Q4_0_BLOCK;
    size_t pstride = (size_t)nb * IG_Q4P_BLOCK_BYTES;
    /* As in gemmq8.c: one row takes 4 panels a tile (4 streams from
     * memory), more rows 2, so that 4 rows' accumulators fit the registers. */
    int step = m == 1 ? 4 : 2;
    for (int c = n0; c < n1; c += step * IG_Q4P_NR) {
        const uint8_t *pw = q4p_block(w, nb, c / IG_Q4P_NR, 0);
        int ncols = n1 - c < step * IG_Q4P_NR ? n1 - c : step * IG_Q4P_NR;
        int np = (ncols + IG_Q4P_NR - 1) / IG_Q4P_NR;
        for (int a = 0; a < m; a += 4) {
            float *yt = y + (size_t)a * ldy + c;
            IG_QTILE_SWITCH(m, a, np, Q4_TILE)
        }
    }
}
#undef Q4_TILE
IG__TARGET_END
#endif

void ig__gemm_q4(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                 const uint8_t *w, int m, int k, int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return;
    switch (ig__cpu_isa()) {
#ifdef Q4_X86
    case IG_CPU_ISA_AVX512:
        gemmq4_avx512(y, ldy, xq, xd, xs, w, m, k, n0, n1);
        return;
    case IG_CPU_ISA_AVX2:
        gemmq4_avx2(y, ldy, xq, xd, xs, w, m, k, n0, n1);
        return;
#endif
    default:
        gemmq4_scalar(y, ldy, xq, xd, w, m, k, n0, n1);
    }
}
