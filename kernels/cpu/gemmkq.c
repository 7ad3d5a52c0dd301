/*
 * GEMM on Q4_K and Q6_K weights (GGUF's K-quants, include/infergate/dtype.h).
 *
 * At upload both are rewritten without loss into panels of 16 rows (output
 * columns) that keep the formats' own integers: per super-block of 256 of
 * k, the 16 rows' F16 d (and Q4_K's dmin), their 6-bit or 8-bit scales, and
 * the quants as nibbles (Q6_K: plus their 2-bit high parts). A weight is
 * s * q - o with q unsigned and, for its half-block of 16,
 *   - Q4_K: q the nibble (0..15), s = d * sc[j] and o = dmin * m[j] of its
 *     sub-block of 32 (both halves the same);
 *   - Q6_K: q the 6-bit value (0..63), s = d * sc[i / 16] and o = 32 s.
 * s and o are computed in F32 where they are used, and are exact there (an
 * F16 times an integer of at most 8 bits), so the values are ggml's: what
 * dequantize_row_q4_K / _q6_K compute, up to where they round
 * (ig__kqp_unpack_row gives the same values; s q - o is exact for both, so
 * only a zero's sign can differ from ggml's product).
 *
 * A panel super-block (KQP_SB_BYTES: 2368 for Q4_K, 0.58 bytes a weight
 * against the file's 0.56; 3392 for Q6_K, 0.83 against 0.82):
 *   - header (64): d[row] as F16, then dmin[row] (Q4_K; zeros for Q6_K);
 *   - scales (256): Q4_K sc[j][row] then m[j][row] (j the sub-block of 32),
 *     unsigned bytes; Q6_K sc[i][row] (i the half-block of 16), signed;
 *   - nibbles (8 x 256): for block j of 32, quad g (0..3), [row][4] bytes,
 *     the low nibble weight 4g + t of the block, the high one 16 + 4g + t;
 *   - Q6_K's high parts (8 x 128): for block j, pair p (0..1), [row][4]
 *     bytes, 2 bits each of quad 2p's low and high weights (bits 0-1, 2-3)
 *     and quad 2p + 1's (4-5, 6-7).
 * One 64-byte load of nibbles is thus one quad of each half of a block for
 * all 16 rows, and a mask and a shift give both.
 *
 * x is quantized per block of 32 as for Q8_0 (ig__q8_quantize_rows_sums);
 * each half h of a block adds d_x * (s_h * sum q q_x - o_h * sum q_x), the
 * integer sums exact:
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
#define KQ_HDR 64                /* offset of the scales */
#define KQ_NIB (KQ_HDR + 256)    /* offset of the nibbles */
#define KQ_HI (KQ_NIB + 8 * 256) /* offset of Q6_K's high parts */
#define KQ_SB6 (KQ_HI + 8 * 128) /* a Q6_K panel super-block; Q4_K's is KQ_HI */

/* ---- the panel layout ------------------------------------------------- */

static inline size_t kqp_sb_bytes(int six)
{
    return six ? KQ_SB6 : KQ_HI;
}

/* Super-block sb of panel p (nsb super-blocks a row). */
static inline const uint8_t *kqp_sb(const uint8_t *w, int six, int nsb, int p, int sb)
{
    return w + ((size_t)p * nsb + sb) * kqp_sb_bytes(six);
}

/* Where weight i (0..31) of block j of row l is in its super-block: the
 * byte of its nibble, and of its 2 high bits (Q6_K) with their shift. */
static inline int kqp_nib_at(int j, int l, int i)
{
    return KQ_NIB + 256 * j + 64 * (i % 16 / 4) + 4 * l + i % 4;
}

static inline int kqp_hi_at(int j, int l, int i)
{
    return KQ_HI + 128 * j + 64 * (i % 16 / 8) + 4 * l + i % 4;
}

static inline int kqp_hi_shift(int i)
{
    return 4 * (i % 16 / 4 % 2) + 2 * (i / 16);
}

static inline int kqp_q(const uint8_t *sbp, int six, int j, int l, int i)
{
    int b = sbp[kqp_nib_at(j, l, i)], q = i < 16 ? b & 15 : b >> 4;
    if (six)
        q |= (sbp[kqp_hi_at(j, l, i)] >> kqp_hi_shift(i) & 3) << 4;
    return q;
}

/* Row l's d (which 0) or dmin (1). */
static inline float kqp_d(const uint8_t *sbp, int which, int l)
{
    uint16_t h;
    memcpy(&h, sbp + 32 * which + 2 * l, 2);
    return ig_f16_to_f32(h);
}

/* s and o of half h of block j of row l. */
static inline void kqp_so(const uint8_t *sbp, int six, int j, int h, int l, float *s, float *o)
{
    if (six) {
        *s = kqp_d(sbp, 0, l) * (float)(int8_t)sbp[KQ_HDR + 16 * (2 * j + h) + l];
        *o = 32.0f * *s; /* exact: a power of two */
    } else {
        *s = kqp_d(sbp, 0, l) * (float)sbp[KQ_HDR + 16 * j + l];
        *o = kqp_d(sbp, 1, l) * (float)sbp[KQ_HDR + 128 + 16 * j + l];
    }
}

size_t ig__kqp_packed_bytes(ig_dtype_t dtype, int n, int k)
{
    size_t panels = ((size_t)n + KQ_NR - 1) / KQ_NR;
    return panels * (size_t)(k / IG_QK_K) * kqp_sb_bytes(dtype == IG_DTYPE_Q6_K);
}

/* One GGUF super-block as q (256 values), its F16 d and dmin (0 for Q6_K),
 * and its 16 scale bytes in the panel's order (Q4_K: sc[0..7], m[0..7]). */
static void q4_k_split(uint8_t *q, uint16_t *hd, uint8_t *sc16, const uint8_t *blk)
{
    memcpy(hd, blk, 4);
    const uint8_t *sc = blk + 4, *qs = blk + 16;
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc16[j] = sc[j] & 63;
            sc16[8 + j] = sc[j + 4] & 63;
        } else {
            sc16[j] = (uint8_t)((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
            sc16[8 + j] = (uint8_t)((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
        }
        const uint8_t *qj = qs + 32 * (j / 2);
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)(j % 2 ? qj[l] >> 4 : qj[l] & 15);
    }
}

static void q6_k_split(uint8_t *q, uint16_t *hd, uint8_t *sc16, const uint8_t *blk)
{
    memcpy(hd, blk + 208, 2);
    hd[1] = 0;
    memcpy(sc16, blk + 192, 16);
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int half = 0; half < 2; half++, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            uint8_t *qq = q + 128 * half;
            qq[l] = (uint8_t)((ql[l] & 15) | ((qh[l] >> 0 & 3) << 4));
            qq[l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2 & 3) << 4));
            qq[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4));
            qq[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4));
        }
}

int ig__kqp_pack(uint8_t *dst, const uint8_t *src, ig_dtype_t dtype, int n, int k)
{
    if (dtype != IG_DTYPE_Q4_K && dtype != IG_DTYPE_Q6_K)
        return -1;
    int six = dtype == IG_DTYPE_Q6_K, nsb = k / IG_QK_K, panels = (n + KQ_NR - 1) / KQ_NR;
    size_t row = ig_dtype_bytes(dtype, (size_t)k), sbb = ig_dtype_bytes(dtype, IG_QK_K);
    uint8_t q[IG_QK_K], sc[16];
    uint16_t hd[2];
    /* Every field is OR-ed into zeros; a padding row stays zero (d 0: weights 0). */
    memset(dst, 0, ig__kqp_packed_bytes(dtype, n, k));
    for (int p = 0; p < panels; p++)
        for (int l = 0; l < KQ_NR && p * KQ_NR + l < n; l++)
            for (int sb = 0; sb < nsb; sb++) {
                const uint8_t *from = src + (size_t)(p * KQ_NR + l) * row + (size_t)sb * sbb;
                uint8_t *to = (uint8_t *)kqp_sb(dst, six, nsb, p, sb);
                if (six)
                    q6_k_split(q, hd, sc, from);
                else
                    q4_k_split(q, hd, sc, from);
                memcpy(to + 2 * l, &hd[0], 2);
                memcpy(to + 32 + 2 * l, &hd[1], 2);
                for (int t = 0; t < 16; t++)
                    to[KQ_HDR + 16 * t + l] = sc[t];
                for (int j = 0; j < 8; j++)
                    for (int i = 0; i < 32; i++) {
                        int v = q[32 * j + i];
                        to[kqp_nib_at(j, l, i)] |= (uint8_t)((v & 15) << (i < 16 ? 0 : 4));
                        if (six)
                            to[kqp_hi_at(j, l, i)] |= (uint8_t)((v >> 4) << kqp_hi_shift(i));
                    }
            }
    return 0;
}

void ig__kqp_unpack_row(float *dst, const uint8_t *packed, ig_dtype_t dtype, int k, int row)
{
    int six = dtype == IG_DTYPE_Q6_K, nsb = k / IG_QK_K, p = row / KQ_NR, l = row % KQ_NR;
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *sbp = kqp_sb(packed, six, nsb, p, sb);
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 2; h++) {
                float s, o;
                kqp_so(sbp, six, j, h, l, &s, &o);
                for (int t = 0; t < 16; t++)
                    dst[IG_QK_K * sb + 32 * j + 16 * h + t] =
                        s * (float)kqp_q(sbp, six, j, l, 16 * h + t) - o;
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
    /* One operation a statement (ISO C: no contraction into fmas). */
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
                                          const int32_t *hs, const uint8_t *w, int six, int m,
                                          int k, int n0, int n1)
{
    int nb = k / 32, nsb = k / IG_QK_K;
    for (int c = n0; c < n1; c++)
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            const int32_t *ha = hs + (size_t)a * 2 * nb;
            float acc = 0.0f;
            int l = c % KQ_NR;
            for (int sb = 0; sb < nsb; sb++) {
                const uint8_t *sbp = kqp_sb(w, six, nsb, c / KQ_NR, sb);
                for (int j = 0; j < 8; j++) {
                    int b = 8 * sb + j;
                    int32_t s[2] = {0, 0};
#ifdef __clang__
#pragma clang loop vectorize(disable)
#endif
                    for (int i = 0; i < 32; i++)
                        s[i / 16] += kqp_q(sbp, six, j, l, i) * xa[32 * b + i];
                    float s0, s1, o0, o1;
                    kqp_so(sbp, six, j, 0, l, &s0, &o0);
                    kqp_so(sbp, six, j, 1, l, &s1, &o1);
                    acc = kq_block_f(acc, s[0], s[1], s0, s1, o0, o1, ha[2 * b], ha[2 * b + 1],
                                     xd[(size_t)a * nb + b]);
                }
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
/* s and o of both halves of block j for the 8 rows of the panel from c8. */
static inline void kq_so_avx2(const uint8_t *sbp, const int six, int j, int c8, __m256 *s0,
                              __m256 *s1, __m256 *o0, __m256 *o1)
{
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sbp + 2 * c8)));
    if (six) {
        const uint8_t *sc = sbp + KQ_HDR + 32 * j + c8;
        *s0 = _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc))));
        *s1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                   _mm_loadl_epi64((const __m128i *)(sc + 16)))));
        *o0 = _mm256_mul_ps(_mm256_set1_ps(32.0f), *s0);
        *o1 = _mm256_mul_ps(_mm256_set1_ps(32.0f), *s1);
    } else {
        __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sbp + 32 + 2 * c8)));
        const uint8_t *sc = sbp + KQ_HDR + 16 * j + c8;
        *s0 = *s1 = _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc))));
        *o0 = *o1 = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                            _mm_loadl_epi64((const __m128i *)(sc + 128)))));
    }
}

/* The float side for 8 columns (one half of a panel): lanes of i0, i1. */
static inline __m256 kq_f_avx2(__m256 acc, __m256i i0, __m256i i1, __m256 s0, __m256 s1, __m256 o0,
                               __m256 o1, int32_t x0, int32_t x1, float dx)
{
    __m256 vdx = _mm256_set1_ps(dx);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(s0, vdx), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(s1, vdx), acc);
    __m256 off = _mm256_add_ps(_mm256_mul_ps(o0, _mm256_set1_ps((float)x0)),
                               _mm256_mul_ps(o1, _mm256_set1_ps((float)x1)));
    return _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), off), vdx, acc);
}

/* Quad g of both halves of block j, 8 rows (32 bytes) from byte c of the
 * row quads: *lo the low half's q, *hi the high half's. */
static inline void kq_quads_avx2(const uint8_t *sbp, const int six, int j, int g, int c,
                                 __m256i *lo, __m256i *hi)
{
    const __m256i m0f = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256i v = _mm256_loadu_si256((const __m256i *)(sbp + KQ_NIB + 256 * j + 64 * g + c));
    *lo = _mm256_and_si256(v, m0f);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
    if (six) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(sbp + KQ_HI + 128 * j + 64 * (g / 2) + c));
        if (g % 2 == 0) {
            *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
        } else {
            *lo = _mm256_or_si256(*lo, _mm256_and_si256(h, m30));
            *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        }
    }
}

/* Rows [a, a + mr) (mr <= 2) by one panel. */
static inline __attribute__((always_inline)) void
tile_avx2(const int mr, const int six, float *y, int ldy, const int8_t *xq, const float *xd,
          const int32_t *hs, const uint8_t *pw, int nsb, int k, int ncols)
{
    const __m256i ones = _mm256_set1_epi16(1);
    int nb = 8 * nsb;
    __m256 f[2][2];
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++)
        f[a][0] = f[a][1] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *sbp = pw + (size_t)sb * kqp_sb_bytes(six);
        for (int j = 0; j < 8; j++) {
            int b = 8 * sb + j;
            __m256i acc[2][2][2]; /* [row][half of k][half of the panel] */
#pragma GCC unroll 2
            for (int a = 0; a < mr; a++)
                acc[a][0][0] = acc[a][0][1] = acc[a][1][0] = acc[a][1][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256i lo[2], hi[2];
                kq_quads_avx2(sbp, six, j, g, 0, &lo[0], &hi[0]);
                kq_quads_avx2(sbp, six, j, g, 32, &lo[1], &hi[1]);
#pragma GCC unroll 2
                for (int a = 0; a < mr; a++) {
                    const int8_t *xb = xq + (size_t)a * k + 32 * b + 4 * g;
                    __m256i xl = _mm256_set1_epi32(load_i32(xb));
                    __m256i xh = _mm256_set1_epi32(load_i32(xb + 16));
#pragma GCC unroll 2
                    for (int c = 0; c < 2; c++) {
                        acc[a][0][c] = _mm256_add_epi32(
                            acc[a][0][c], _mm256_madd_epi16(_mm256_maddubs_epi16(lo[c], xl), ones));
                        acc[a][1][c] = _mm256_add_epi32(
                            acc[a][1][c], _mm256_madd_epi16(_mm256_maddubs_epi16(hi[c], xh), ones));
                    }
                }
            }
            __m256 s0[2], s1[2], o0[2], o1[2];
            kq_so_avx2(sbp, six, j, 0, &s0[0], &s1[0], &o0[0], &o1[0]);
            kq_so_avx2(sbp, six, j, 8, &s0[1], &s1[1], &o0[1], &o1[1]);
#pragma GCC unroll 2
            for (int a = 0; a < mr; a++) {
                const int32_t *h = hs + (size_t)a * 2 * nb + 2 * b;
                float dx = xd[(size_t)a * nb + b];
#pragma GCC unroll 2
                for (int c = 0; c < 2; c++)
                    f[a][c] = kq_f_avx2(f[a][c], acc[a][0][c], acc[a][1][c], s0[c], s1[c], o0[c],
                                        o1[c], h[0], h[1], dx);
            }
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
                        const uint8_t *w, int six, int m, int k, int n0, int n1)
{
    int nb = k / 32, nsb = k / IG_QK_K;
    for (int c = n0; c < n1; c += KQ_NR) {
        const uint8_t *pw = kqp_sb(w, six, nsb, c / KQ_NR, 0);
        int ncols = n1 - c < KQ_NR ? n1 - c : KQ_NR;
        int a = 0;
        for (; a + 2 <= m; a += 2) {
            float *yt = y + (size_t)a * ldy + c;
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            const int32_t *ha = hs + (size_t)a * 2 * nb;
            if (six)
                tile_avx2(2, 1, yt, ldy, xa, da, ha, pw, nsb, k, ncols);
            else
                tile_avx2(2, 0, yt, ldy, xa, da, ha, pw, nsb, k, ncols);
        }
        if (a < m) {
            float *yt = y + (size_t)a * ldy + c;
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            const int32_t *ha = hs + (size_t)a * 2 * nb;
            if (six)
                tile_avx2(1, 1, yt, ldy, xa, da, ha, pw, nsb, k, ncols);
            else
                tile_avx2(1, 0, yt, ldy, xa, da, ha, pw, nsb, k, ncols);
        }
    }
}
IG__TARGET_END

/* ---- AVX-512 VNNI --------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
/* Quad g of both halves of block j for the 16 rows of a panel. */
static inline void kq_quads_avx512(const uint8_t *sbp, const int six, int j, int g, __m512i *lo,
                                   __m512i *hi)
{
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    __m512i v = _mm512_loadu_si512(sbp + KQ_NIB + 256 * j + 64 * g);
    *lo = _mm512_and_si512(v, m0f);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
    if (six) {
        __m512i h = _mm512_loadu_si512(sbp + KQ_HI + 128 * j + 64 * (g / 2));
        if (g % 2 == 0) {
            *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
            *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
        } else {
            *lo = _mm512_or_si512(*lo, _mm512_and_si512(h, m30));
            *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
        }
    }
}

/* s and o of both halves of block j for the 16 rows of a panel. */
static inline void kq_so_avx512(const uint8_t *sbp, const int six, int j, __m512 *s0, __m512 *s1,
                                __m512 *o0, __m512 *o1)
{
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sbp));
    if (six) {
        const uint8_t *sc = sbp + KQ_HDR + 32 * j;
        *s0 = _mm512_mul_ps(
            d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc))));
        *s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                   _mm_loadu_si128((const __m128i *)(sc + 16)))));
        *o0 = _mm512_mul_ps(_mm512_set1_ps(32.0f), *s0);
        *o1 = _mm512_mul_ps(_mm512_set1_ps(32.0f), *s1);
    } else {
        __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sbp + 32)));
        const uint8_t *sc = sbp + KQ_HDR + 16 * j;
        *s0 = *s1 = _mm512_mul_ps(
            d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc))));
        *o0 = *o1 = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                            _mm_loadu_si128((const __m128i *)(sc + 128)))));
    }
}

/* Rows [a, a + mr) (mr <= 4) by np (1 or 2) panels. */
static inline __attribute__((always_inline)) void
tile_avx512(const int mr, const int np, const int six, float *y, int ldy, const int8_t *xq,
            const float *xd, const int32_t *hs, const uint8_t *pw, size_t pstride, int nsb, int k,
            int ncols)
{
    int nb = 8 * nsb;
    __m512 f[4][2];
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
        for (int p = 0; p < np; p++)
            f[a][p] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *sbp = pw + (size_t)sb * kqp_sb_bytes(six);
        for (int j = 0; j < 8; j++) {
            int b = 8 * sb + j;
            __m512i acc[4][2][2]; /* [row][panel][half of k] */
#pragma GCC unroll 4
            for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
                for (int p = 0; p < np; p++)
                    acc[a][p][0] = acc[a][p][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i lo[2], hi[2];
#pragma GCC unroll 2
                for (int p = 0; p < np; p++)
                    kq_quads_avx512(sbp + p * pstride, six, j, g, &lo[p], &hi[p]);
#pragma GCC unroll 4
                for (int a = 0; a < mr; a++) {
                    const int8_t *xb = xq + (size_t)a * k + 32 * b + 4 * g;
                    __m512i xl = _mm512_set1_epi32(load_i32(xb));
                    __m512i xh = _mm512_set1_epi32(load_i32(xb + 16));
#pragma GCC unroll 2
                    for (int p = 0; p < np; p++) {
                        acc[a][p][0] = _mm512_dpbusd_epi32(acc[a][p][0], lo[p], xl);
                        acc[a][p][1] = _mm512_dpbusd_epi32(acc[a][p][1], hi[p], xh);
                    }
                }
            }
            __m512 s0[2], s1[2], o0[2], o1[2];
#pragma GCC unroll 2
            for (int p = 0; p < np; p++)
                kq_so_avx512(sbp + p * pstride, six, j, &s0[p], &s1[p], &o0[p], &o1[p]);
#pragma GCC unroll 4
            for (int a = 0; a < mr; a++) {
                const int32_t *h = hs + (size_t)a * 2 * nb + 2 * b;
                __m512 vdx = _mm512_set1_ps(xd[(size_t)a * nb + b]);
                __m512 x0 = _mm512_set1_ps((float)h[0]), x1 = _mm512_set1_ps((float)h[1]);
#pragma GCC unroll 2
                for (int p = 0; p < np; p++) {
                    __m512 g = f[a][p];
                    g = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[a][p][0]), _mm512_mul_ps(s0[p], vdx),
                                        g);
                    g = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[a][p][1]), _mm512_mul_ps(s1[p], vdx),
                                        g);
                    __m512 off = _mm512_add_ps(_mm512_mul_ps(o0[p], x0), _mm512_mul_ps(o1[p], x1));
                    f[a][p] = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), off), vdx, g);
                }
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
    do {                                                                                           \
        if (six)                                                                                   \
            tile_avx512(MR, NP, 1, yt, ldy, xa, da, ha, pw, pstride, nsb, k, ncols);               \
        else                                                                                       \
            tile_avx512(MR, NP, 0, yt, ldy, xa, da, ha, pw, pstride, nsb, k, ncols);               \
    } while (0)

static void gemmkq_avx512(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *hs,
                          const uint8_t *w, int six, int m, int k, int n0, int n1)
{
    int nb = k / 32, nsb = k / IG_QK_K;
    size_t pstride = (size_t)nsb * kqp_sb_bytes(six);
    for (int c = n0; c < n1; c += 2 * KQ_NR) {
        const uint8_t *pw = kqp_sb(w, six, nsb, c / KQ_NR, 0);
        int ncols = n1 - c < 2 * KQ_NR ? n1 - c : 2 * KQ_NR;
        int np = (ncols + KQ_NR - 1) / KQ_NR;
        for (int a = 0; a < m; a += 4) {
            float *yt = y + (size_t)a * ldy + c;
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            const int32_t *ha = hs + (size_t)a * 2 * nb;
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

int ig__gemm_kq(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w,
                ig_dtype_t dtype, int m, int k, int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return 0;
    int six = dtype == IG_DTYPE_Q6_K;
    int32_t *hs = half_sums(xq, m, k);
    if (hs == NULL)
        return -1;
    switch (ig__cpu_isa()) {
#ifdef KQ_X86
    case IG_CPU_ISA_AVX512:
        gemmkq_avx512(y, ldy, xq, xd, hs, w, six, m, k, n0, n1);
        break;
    case IG_CPU_ISA_AVX2:
        gemmkq_avx2(y, ldy, xq, xd, hs, w, six, m, k, n0, n1);
        break;
#endif
    default:
        gemmkq_scalar(y, ldy, xq, xd, hs, w, six, m, k, n0, n1);
    }
    free(hs);
    return 0;
}
