/*
 * GEMM on GGUF's two formats of 32-weight blocks with one F16 scale d
 * (include/infergate/dtype.h):
 *   - Q8_0: 32 int8 weights, value d * q;
 *   - Q4_0: 16 bytes of nibbles, weight i the low nibble of byte i and
 *     weight i + 16 its high nibble, value d * (q - 8).
 *
 * upload_weight packs W(n, k) once into panels of 16 rows (output columns),
 * ig__qp_pack: block b of a panel is its 16 scales, then the rows' weight
 * bytes by quads, [quad][row][4 bytes]. A quad of Q8_0 is 4 weights of k,
 * each stored as w + 128; a quad of Q4_0 is bytes 4g..4g+3 of a row's
 * nibbles, so its low nibbles are weights 4g..4g+3 and its high nibbles
 * 16 + 4g..16 + 4g + 3. The file's bytes, moved (Q8_0's flipped), not
 * grown: 544 = 16 x 34 and 288 = 16 x 18. They are packed 64 panels at a
 * time from the mapping, whose pages then go back (cpu_backend.c). x is
 * quantized as a Q8_0 weight per block of 32 (a scale per block kept in
 * F32, q = round(x / d), and the block's sum) once per matmul, and each
 * block contributes d_w * d_x * sum q_w q_x, the integer sum exact.
 *
 * Why panels: on GGUF's row layout an output is one long dot product, and
 * every block's 16 lanes must be summed across the register (the previous
 * kernel's pairwise adds); that was fine at batch 1, where memory is the
 * limit, but a third of BF16's speed at batch 64. In panels the 16 lanes
 * of a register are 16 outputs: one vpdpbusd multiplies a quad of 16
 * columns by one row's quad of x broadcast, and a tile of 4 rows by 2
 * panels keeps 8 integer and 8 float accumulators in registers, each weight
 * load serving 4 rows; one row (decode) takes 4 panels a tile (docs/engine.md,
 * "Weights").
 *
 * The integer dot product of a block, per instruction set:
 *   - AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes: the
 *     weights go in unsigned (Q8_0's w + 128 as stored, Q4_0's nibbles
 *     0..15, one 64-byte load giving a quad from its low and one from its
 *     high nibbles) and x's quads as they are, each block's sum starting at
 *     -128 (Q8_0) or -8 (Q4_0) times sum q_x, which takes the offset off
 *     (ig__q8_quantize_rows_sums keeps the sums beside x);
 *   - AVX2, Q8_0: |x| times w with x's sign moved onto w (vpmaddubsw +
 *     vpmaddwd); weights of -128 (never written by a quantizer, which stays
 *     within +-127) would overflow the sign trick;
 *   - AVX2, Q4_0: vpmaddubsw (unsigned nibble times signed x) for the low
 *     and the high quads of every group, summed in 16 bits (16 products of
 *     at most 15 * 127 each: 30480 < 32767), then one vpmaddwd per block;
 *   - plain C, weight by weight.
 * Then on every path, for each block in order, d = d_w * d_x and
 * acc = fma((float)sum, d, acc): one order of float operations per output
 * on every instruction set and for any m and column range, so a row gets
 * the same bits alone or in a batch, on any CPU.
 */
#include "cpu_internal.h"

#include "infergate/dtype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QP_X86 1
#endif

#define QP_INLINE inline __attribute__((always_inline))

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

#ifdef QP_X86
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

IG__TARGET_BEGIN("avx2,fma")
/* The same on AVX2. The scalar loop took 0.7 ms for 64 rows of 2048 on Zen
 * 3, a tenth of the 2048 x 2048 GEMM it feeds, alone on one thread while
 * the others wait. */
static inline __m256 round_away_avx2(__m256 t)
{
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
    __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, r)); /* exact */
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(t, sign));
    return _mm256_add_ps(r, _mm256_and_ps(up, one));
}

static int32_t quantize_block_avx2(int8_t *q, float *d, const float *x)
{
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
    __m256 v[4], m = _mm256_setzero_ps();
    /* max returns its second operand when either is NaN: a NaN is passed
     * over, as the scalar loop's comparison passes it over. */
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float sc = amax / 127.0f, inv = sc != 0.0f ? 1.0f / sc : 0.0f;
    *d = sc;
    __m256 vi = _mm256_set1_ps(inv);
    __m256i qi[4];
    for (int i = 0; i < 4; i++)
        qi[i] = _mm256_cvtps_epi32(round_away_avx2(_mm256_mul_ps(v[i], vi)));
    /* int32 -> int8 by two saturating packs (exact: |q| <= 127), which
     * interleave the 128-bit lanes; the permute puts them back in order. */
    __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}
IG__TARGET_END
#endif

void ig__q8_quantize_rows_sums(int8_t *q, float *d, int32_t *s, const float *x, int m, int k)
{
    int nb = k / IG_Q8_0_BLOCK;
#ifdef QP_X86
    ig_cpu_isa_t isa = ig__cpu_isa();
#endif
    for (int r = 0; r < m; r++)
        for (int b = 0; b < nb; b++) {
            size_t at = (size_t)r * k + (size_t)b * IG_Q8_0_BLOCK, blk = (size_t)r * nb + b;
            int32_t sum;
#ifdef QP_X86
            if (isa == IG_CPU_ISA_AVX512)
                sum = quantize_block_avx512(q + at, d + blk, x + at);
            else if (isa == IG_CPU_ISA_AVX2)
                sum = quantize_block_avx2(q + at, d + blk, x + at);
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

/* ---- the panel layout ------------------------------------------------- */

/* Q8_0 and Q4_0 share the block of 32 weights; fmt below is 1 for Q4_0, 0
 * for Q8_0, a constant wherever a kernel is specialized on it. */
#define QP_BLOCK 32
_Static_assert(IG_Q8_0_BLOCK == QP_BLOCK && IG_Q4_0_BLOCK == QP_BLOCK, "blocks of 32");

/* A row's weight bytes per block: 32 or 16. */
static inline int qp_wbytes(int q4)
{
    return q4 ? IG_Q4_0_BYTES - 2 : IG_Q8_0_BYTES - 2;
}

static inline size_t qp_block_bytes(int q4)
{
    return (size_t)IG_QP_NR * (size_t)(q4 ? IG_Q4_0_BYTES : IG_Q8_0_BYTES);
}

/* The unsigned offset of a stored weight, taken off each block's integer
 * sum: Q8_0's + 128, Q4_0's nibble 8. */
static inline int qp_bias(int q4)
{
    return q4 ? 8 : 128;
}

/* Where block b of panel p lies; where in a block byte j of row l's
 * weights lies (after the scales, by quads: [quad][row][4]); the scale of
 * row l; and weight i of row l as an integer. */
static inline const uint8_t *qp_block(int q4, const uint8_t *w, int nb, int p, int b)
{
    return w + ((size_t)p * nb + b) * qp_block_bytes(q4);
}

static inline int qp_at(int l, int j)
{
    return 2 * IG_QP_NR + (j / 4) * 4 * IG_QP_NR + 4 * l + j % 4;
}

static inline float qp_scale(const uint8_t *blk, int l)
{
    uint16_t h;
    memcpy(&h, blk + 2 * l, 2);
    return ig_f16_to_f32(h);
}

static inline int qp_quant(int q4, const uint8_t *blk, int l, int i)
{
    if (!q4)
        return (int)(int8_t)(blk[qp_at(l, i)] ^ 0x80);
    uint8_t byte = blk[qp_at(l, i % 16)];
    return (i < 16 ? byte & 15 : byte >> 4) - 8;
}

size_t ig__qp_packed_bytes(ig_dtype_t dt, int n, int k)
{
    size_t panels = ((size_t)n + IG_QP_NR - 1) / IG_QP_NR;
    return panels * (size_t)(k / QP_BLOCK) * qp_block_bytes(dt == IG_DTYPE_Q4_0);
}

void ig__qp_pack(uint8_t *dst, const uint8_t *src, ig_dtype_t dt, int n, int k)
{
    int q4 = dt == IG_DTYPE_Q4_0, nb = k / QP_BLOCK, panels = (n + IG_QP_NR - 1) / IG_QP_NR;
    int wbytes = qp_wbytes(q4);
    /* Q8_0's weights flip to w + 128; a padding column has scale 0 and
     * weights 0 (Q8_0's 0x80, Q4_0's nibbles 8). */
    uint8_t flip = q4 ? 0 : 0x80, pad = q4 ? 0x88 : 0x80;
    size_t row = (size_t)nb * (size_t)(wbytes + 2);
    for (int p = 0; p < panels; p++)
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = (uint8_t *)qp_block(q4, dst, nb, p, b);
            for (int l = 0; l < IG_QP_NR; l++) {
                int r = p * IG_QP_NR + l;
                const uint8_t *from =
                    r < n ? src + (size_t)r * row + (size_t)b * (size_t)(wbytes + 2) : NULL;
                if (from != NULL)
                    memcpy(blk + 2 * l, from, 2);
                else
                    memset(blk + 2 * l, 0, 2);
                for (int j = 0; j < wbytes; j++)
                    blk[qp_at(l, j)] = from != NULL ? (uint8_t)(from[2 + j] ^ flip) : pad;
            }
        }
}

void ig__qp_unpack_row(float *dst, const uint8_t *packed, ig_dtype_t dt, int k, int row)
{
    int q4 = dt == IG_DTYPE_Q4_0, nb = k / QP_BLOCK, p = row / IG_QP_NR, l = row % IG_QP_NR;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = qp_block(q4, packed, nb, p, b);
        float d = qp_scale(blk, l);
        for (int i = 0; i < QP_BLOCK; i++)
            dst[b * QP_BLOCK + i] = d * (float)qp_quant(q4, blk, l, i);
    }
}

/* ---- plain C ---------------------------------------------------------- */

/* Not auto-vectorized: GCC 12 with -march=native on a VNNI CPU turns the
 * int8 x int8 sum below into vpdpbusd, which multiplies unsigned by signed
 * bytes, and gets negative activations wrong (test_kernels_q8 caught it).
 * clang has no such attribute: a loop pragma keeps its vectorizer off the
 * same loop. */
#ifdef __clang__
#define QP_NO_VECTORIZE
#else
#define QP_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#endif
QP_NO_VECTORIZE static void gemmqp_scalar(int q4, float *y, int ldy, const int8_t *xq,
                                          const float *xd, const uint8_t *w, int m, int k, int n0,
                                          int n1)
{
    int nb = k / QP_BLOCK;
    for (int c = n0; c < n1; c++)
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = qp_block(q4, w, nb, c / IG_QP_NR, b);
                int32_t s = 0;
#ifdef __clang__
#pragma clang loop vectorize(disable)
#endif
                for (int i = 0; i < QP_BLOCK; i++)
                    s += qp_quant(q4, blk, c % IG_QP_NR, i) * xa[b * QP_BLOCK + i];
                float d = qp_scale(blk, c % IG_QP_NR) * xd[(size_t)a * nb + b];
                acc = fmaf((float)s, d, acc);
            }
            y[(size_t)a * ldy + c] = acc;
        }
}

#ifdef QP_X86
static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- AVX2 --------------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c")
/* Q8_0: one quad of k (x at xq, row a's at xq + a * k) against a panel's
 * 16 columns (wq, 64 bytes), into the integer sums acc[a][half] of rows
 * [0, mr): |x| times w with x's sign moved onto w (pairs of products fit
 * int16: 2 * 127 * 128 < 32767 as no weight is -128). */
static QP_INLINE void quad_avx2(const int mr, __m256i acc[][2], const int8_t *xq, int k,
                                const uint8_t *wq)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)wq), bias);
    __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wq + 32)), bias);
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++) {
        __m256i xv = _mm256_set1_epi32(load_i32(xq + (size_t)a * k));
        __m256i ax = _mm256_sign_epi8(xv, xv);
        acc[a][0] = _mm256_add_epi32(
            acc[a][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xv)), ones));
        acc[a][1] = _mm256_add_epi32(
            acc[a][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xv)), ones));
    }
}

/* Q4_0: the integer sums acc[a][half] of one block (x at xb, row a's at
 * xb + a * k, its block sums at xs + a * nb) against a panel's 16 columns:
 * per group, the low and the high nibbles' quads summed in 16 bits, then
 * widened, less 8 * sum q_x. */
static QP_INLINE void block_q4_avx2(const int mr, __m256i acc[][2], const int8_t *xb, int k,
                                    const int32_t *xs, int nb, const uint8_t *blk)
{
    const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256i s16[2][2];
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++)
        s16[a][0] = s16[a][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const uint8_t *wg = blk + qp_at(0, 4 * g);
        __m256i r0 = _mm256_loadu_si256((const __m256i *)wg);
        __m256i r1 = _mm256_loadu_si256((const __m256i *)(wg + 32));
        __m256i l0 = _mm256_and_si256(r0, lo4), l1 = _mm256_and_si256(r1, lo4);
        __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), lo4);
        __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), lo4);
#pragma GCC unroll 2
        for (int a = 0; a < mr; a++) {
            const int8_t *xa = xb + (size_t)a * k;
            __m256i xl = _mm256_set1_epi32(load_i32(xa + 4 * g));
            __m256i xh = _mm256_set1_epi32(load_i32(xa + 16 + 4 * g));
            s16[a][0] = _mm256_add_epi16(s16[a][0], _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl),
                                                                     _mm256_maddubs_epi16(h0, xh)));
            s16[a][1] = _mm256_add_epi16(s16[a][1], _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl),
                                                                     _mm256_maddubs_epi16(h1, xh)));
        }
    }
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++) {
        __m256i off = _mm256_set1_epi32(-8 * xs[(size_t)a * nb]);
        acc[a][0] = _mm256_add_epi32(_mm256_madd_epi16(s16[a][0], ones), off);
        acc[a][1] = _mm256_add_epi32(_mm256_madd_epi16(s16[a][1], ones), off);
    }
}

/* A block's integer sums acc[a][half] into the float sums f of rows
 * [0, mr): f = fma((float)acc, d_w * d_x, f), d_w the panel's scales at
 * blk, d_x row a's at xd[a * nb]. */
static QP_INLINE void scale_avx2(const int mr, __m256 f[][2], __m256i acc[][2], const uint8_t *blk,
                                 const float *xd, int nb)
{
    __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++) {
        __m256 dx = _mm256_set1_ps(xd[(size_t)a * nb]);
        f[a][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[a][0]), _mm256_mul_ps(d0, dx), f[a][0]);
        f[a][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[a][1]), _mm256_mul_ps(d1, dx), f[a][1]);
    }
}

/* Rows [a, a + mr) (mr <= 2) by one panel (two halves of 8 columns). */
static QP_INLINE void tile_avx2(const int q4, const int mr, float *y, int ldy, const int8_t *xq,
                                const float *xd, const int32_t *xs, const uint8_t *pw, int nb,
                                int k, int ncols)
{
    __m256 f[2][2];
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++)
        f[a][0] = f[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * qp_block_bytes(q4);
        __m256i acc[2][2];
        if (q4) {
            block_q4_avx2(mr, acc, xq + b * QP_BLOCK, k, xs + b, nb, blk);
        } else {
#pragma GCC unroll 2
            for (int a = 0; a < mr; a++)
                acc[a][0] = acc[a][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
                quad_avx2(mr, acc, xq + b * QP_BLOCK + 4 * q, k, blk + qp_at(0, 4 * q));
        }
        scale_avx2(mr, f, acc, blk, xd + b, nb);
    }
#pragma GCC unroll 2
    for (int a = 0; a < mr; a++) {
        float out[IG_QP_NR];
        _mm256_storeu_ps(out, f[a][0]);
        _mm256_storeu_ps(out + 8, f[a][1]);
        memcpy(y + (size_t)a * ldy, out, (size_t)ncols * sizeof(float));
    }
}

/*
 * Q8_0, many rows: up to 4 rows by one panel over blocks [b0, b1), the
 * integer sums of a block in registers (8), the float sums in y itself,
 * updated once per block (the first block's from zero): the same
 * operations as the tile above, so the same bits. Each weight quad, loaded
 * and unbiased once, serves 4 rows instead of 2, and the caller walks the
 * blocks in chunks across every row tile, so a chunk of the panel stays in
 * L1 (a whole panel of k = 2048 is 34 KiB, more than a 32 KiB L1).
 */
#define Q8W_MR 4
#define Q8W_CHUNK 16   /* blocks: 8.5 KiB of a panel */
#define Q8W_MIN_ROWS 3 /* below this the tile above (the decode path) */

static QP_INLINE void tile4_avx2(const int mr, float *y, int ldy, const int8_t *xq, const float *xd,
                                 const uint8_t *pw, int nb, int k, int b0, int b1)
{
    for (int b = b0; b < b1; b++) {
        const uint8_t *blk = pw + (size_t)b * qp_block_bytes(0);
        __m256i acc[Q8W_MR][2];
        __m256 f[Q8W_MR][2];
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++)
            acc[a][0] = acc[a][1] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int q = 0; q < 8; q++)
            quad_avx2(mr, acc, xq + b * QP_BLOCK + 4 * q, k, blk + qp_at(0, 4 * q));
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++) {
            const float *ya = y + (size_t)a * ldy;
            f[a][0] = b == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(ya);
            f[a][1] = b == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(ya + 8);
        }
        scale_avx2(mr, f, acc, blk, xd + b, nb);
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++) {
            _mm256_storeu_ps(y + (size_t)a * ldy, f[a][0]);
            _mm256_storeu_ps(y + (size_t)a * ldy + 8, f[a][1]);
        }
    }
}

static void gemmq8w_avx2(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *pw,
                         int m, int k)
{
    int nb = k / QP_BLOCK;
    for (int b0 = 0; b0 < nb; b0 += Q8W_CHUNK) {
        int b1 = nb - b0 < Q8W_CHUNK ? nb : b0 + Q8W_CHUNK;
        for (int a = 0; a < m; a += Q8W_MR) {
            float *ya = y + (size_t)a * ldy;
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            switch (m - a < Q8W_MR ? m - a : Q8W_MR) {
            case 4:
                tile4_avx2(4, ya, ldy, xa, da, pw, nb, k, b0, b1);
                break;
            case 3:
                tile4_avx2(3, ya, ldy, xa, da, pw, nb, k, b0, b1);
                break;
            case 2:
                tile4_avx2(2, ya, ldy, xa, da, pw, nb, k, b0, b1);
                break;
            default:
                tile4_avx2(1, ya, ldy, xa, da, pw, nb, k, b0, b1);
            }
        }
    }
}

static QP_INLINE void panels_avx2(const int q4, float *y, int ldy, const int8_t *xq,
                                  const float *xd, const int32_t *xs, const uint8_t *w, int m,
                                  int k, int n0, int n1)
{
    int nb = k / QP_BLOCK;
    for (int c = n0; c < n1; c += IG_QP_NR) {
        const uint8_t *pw = qp_block(q4, w, nb, c / IG_QP_NR, 0);
        int ncols = n1 - c < IG_QP_NR ? n1 - c : IG_QP_NR;
        if (!q4 && m >= Q8W_MIN_ROWS && ncols == IG_QP_NR) {
            gemmq8w_avx2(y + c, ldy, xq, xd, pw, m, k);
            continue;
        }
        int a = 0;
        for (; a + 2 <= m; a += 2)
            tile_avx2(q4, 2, y + (size_t)a * ldy + c, ldy, xq + (size_t)a * k, xd + (size_t)a * nb,
                      xs + (size_t)a * nb, pw, nb, k, ncols);
        if (a < m)
            tile_avx2(q4, 1, y + (size_t)a * ldy + c, ldy, xq + (size_t)a * k, xd + (size_t)a * nb,
                      xs + (size_t)a * nb, pw, nb, k, ncols);
    }
}

static void gemmqp_avx2(int q4, float *y, int ldy, const int8_t *xq, const float *xd,
                        const int32_t *xs, const uint8_t *w, int m, int k, int n0, int n1)
{
    if (q4)
        panels_avx2(1, y, ldy, xq, xd, xs, w, m, k, n0, n1);
    else
        panels_avx2(0, y, ldy, xq, xd, xs, w, m, k, n0, n1);
}
IG__TARGET_END

/* ---- AVX-512 VNNI --------------------------------------------------------- */

IG__TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
/* No software prefetch: a tile's panels are sequential streams, which the
 * hardware prefetchers follow. Asking for 8 KiB ahead in the first row tile
 * (as the row layout's kernel did) took about a fifth off the bandwidth
 * at batch 1. */
/* Rows [a, a + mr) (mr <= 4) by np (1 to 4; 2 at most with mr > 1) panels,
 * 16 columns each: per 64-byte load (Q8_0: a quad of the 16 columns; Q4_0:
 * two, from the low and the high nibbles), one vpdpbusd per quad against
 * x's quad broadcast; each block's integer sum starts at -qp_bias * sum
 * q_x and is exact. Then one multiply (d_w d_x) and one multiply-add per
 * block, in block order, as the other paths do. */
static QP_INLINE void tile_avx512(const int q4, const int mr, const int np, float *y, int ldy,
                                  const int8_t *xq, const float *xd, const int32_t *xs,
                                  const uint8_t *pw, size_t pstride, int nb, int k, int ncols)
{
    const __m512i lo4 = _mm512_set1_epi8(15);
    __m512 f[4][4];
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int p = 0; p < np; p++)
            f[a][p] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * qp_block_bytes(q4);
        __m512i acc[4][4];
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++) {
            __m512i init = _mm512_set1_epi32(-qp_bias(q4) * xs[(size_t)a * nb + b]);
#pragma GCC unroll 4
            for (int p = 0; p < np; p++)
                acc[a][p] = init;
        }
#pragma GCC unroll 8
        for (int g = 0; g < qp_wbytes(q4) / 4; g++) {
            __m512i wl[4], wh[4];
#pragma GCC unroll 4
            for (int p = 0; p < np; p++) {
                __m512i r = _mm512_loadu_si512(blk + p * pstride + qp_at(0, 4 * g));
                wl[p] = q4 ? _mm512_and_si512(r, lo4) : r;
                wh[p] = q4 ? _mm512_and_si512(_mm512_srli_epi16(r, 4), lo4) : r;
            }
#pragma GCC unroll 4
            for (int a = 0; a < mr; a++) {
                const int8_t *xb = xq + (size_t)a * k + b * QP_BLOCK;
                __m512i xl = _mm512_set1_epi32(load_i32(xb + 4 * g));
                __m512i xh = q4 ? _mm512_set1_epi32(load_i32(xb + 16 + 4 * g)) : xl;
#pragma GCC unroll 4
                for (int p = 0; p < np; p++) {
                    acc[a][p] = _mm512_dpbusd_epi32(acc[a][p], wl[p], xl);
                    if (q4)
                        acc[a][p] = _mm512_dpbusd_epi32(acc[a][p], wh[p], xh);
                }
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
            int left = ncols - p * IG_QP_NR;
            __mmask16 mask = left >= IG_QP_NR ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            _mm512_mask_storeu_ps(y + (size_t)a * ldy + p * IG_QP_NR, mask, f[a][p]);
        }
}

/* The tile choice: up to 4 rows of x with 1 or 2 panels, or one row with
 * up to 4; calls TILE(MR, NP) for the rows from a (of m) and the np panels
 * left. */
#define QP_TILE_SWITCH(m, a, np, TILE)                                                             \
    switch (((m) - (a) < 4 ? (m) - (a) : 4) * 4 + (np)-1) {                                        \
    case 4 * 4 + 1:                                                                                \
        TILE(4, 2);                                                                                \
        break;                                                                                     \
    case 4 * 4:                                                                                    \
        TILE(4, 1);                                                                                \
        break;                                                                                     \
    case 4 * 3 + 1:                                                                                \
        TILE(3, 2);                                                                                \
        break;                                                                                     \
    case 4 * 3:                                                                                    \
        TILE(3, 1);                                                                                \
        break;                                                                                     \
    case 4 * 2 + 1:                                                                                \
        TILE(2, 2);                                                                                \
        break;                                                                                     \
    case 4 * 2:                                                                                    \
        TILE(2, 1);                                                                                \
        break;                                                                                     \
    case 4 + 3:                                                                                    \
        TILE(1, 4);                                                                                \
        break;                                                                                     \
    case 4 + 2:                                                                                    \
        TILE(1, 3);                                                                                \
        break;                                                                                     \
    case 4 + 1:                                                                                    \
        TILE(1, 2);                                                                                \
        break;                                                                                     \
    default:                                                                                       \
        TILE(1, 1);                                                                                \
    }

#define QP_TILE(MR, NP)                                                                            \
    tile_avx512(q4, MR, NP, yt, ldy, xq + (size_t)a * k, xd + (size_t)a * nb, xs + (size_t)a * nb, \
                pw, pstride, nb, k, ncols)

static QP_INLINE void panels_avx512(const int q4, float *y, int ldy, const int8_t *xq,
                                    const float *xd, const int32_t *xs, const uint8_t *w, int m,
                                    int k, int n0, int n1)
{
    int nb = k / QP_BLOCK;
    size_t pstride = (size_t)nb * qp_block_bytes(q4);
    /* One row (decode): 4 panels a tile, 4 streams from memory (a small
     * gain over 2 panels, within the noise). More rows: 2 panels, so that
     * 4 rows' accumulators fit the registers. */
    int step = m == 1 ? 4 : 2;
    for (int c = n0; c < n1; c += step * IG_QP_NR) {
        const uint8_t *pw = qp_block(q4, w, nb, c / IG_QP_NR, 0);
        int ncols = n1 - c < step * IG_QP_NR ? n1 - c : step * IG_QP_NR;
        int np = (ncols + IG_QP_NR - 1) / IG_QP_NR;
        for (int a = 0; a < m; a += 4) {
            float *yt = y + (size_t)a * ldy + c;
            QP_TILE_SWITCH(m, a, np, QP_TILE)
        }
    }
}
#undef QP_TILE

static void gemmqp_avx512(int q4, float *y, int ldy, const int8_t *xq, const float *xd,
                          const int32_t *xs, const uint8_t *w, int m, int k, int n0, int n1)
{
    if (q4)
        panels_avx512(1, y, ldy, xq, xd, xs, w, m, k, n0, n1);
    else
        panels_avx512(0, y, ldy, xq, xd, xs, w, m, k, n0, n1);
}
IG__TARGET_END
#endif

void ig__gemm_qp(ig_dtype_t dt, float *y, int ldy, const int8_t *xq, const float *xd,
                 const int32_t *xs, const uint8_t *w, int m, int k, int n0, int n1)
{
    int q4 = dt == IG_DTYPE_Q4_0;
    if (n1 <= n0 || m <= 0)
        return;
    switch (ig__cpu_isa()) {
#ifdef QP_X86
    case IG_CPU_ISA_AVX512:
        gemmqp_avx512(q4, y, ldy, xq, xd, xs, w, m, k, n0, n1);
        return;
    case IG_CPU_ISA_AVX2:
        gemmqp_avx2(q4, y, ldy, xq, xd, xs, w, m, k, n0, n1);
        return;
#endif
    default:
        gemmqp_scalar(q4, y, ldy, xq, xd, w, m, k, n0, n1);
    }
}
