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
 * tile), AVX2 with F16C (four of 8, 2 rows; from 3 rows, half a panel by 6
 * rows, gemm16w_avx2), or plain C.
 *
 * BF16 weights on a CPU with AVX512_BF16 take the other path at the end of
 * this file (the default there; IG_CPU_BF16_DOT=0 keeps this one): x rounded
 * to BF16 and vdpbf16ps on weights repacked in k-pairs, with a wider error
 * bound (docs/engine.md, "Weights").
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
/* How far ahead, in 16-bit elements (8 KiB), a one- or two-row tile of the
 * widening path prefetches the weights it streams, where it does
 * (ig__cpu_stream_prefetch): 1 KiB ahead did not keep ahead of the stream. */
#define G16_PREFETCH 4096

#ifdef G16_X86
/*
 * A tile of many rows uses each weight many times, so the first tile of a
 * k-slice would wait on DRAM for the whole slice (16 KiB). Each tile asks
 * for its share (tile t of `tiles`) of the slice two ahead, into L2: slices
 * follow each other in memory, a panel's last one by the next panel's
 * first. The widening path (gemm16_tile.h) waits on its FMAs, not on the
 * slice, gains nothing from this and goes without (docs/engine.md,
 * "Weights").
 */
static inline void g16_prefetch_share(const void *slice, size_t slice_bytes, int t, int tiles)
{
    const char *ahead = (const char *)slice + 2 * slice_bytes;
    size_t lines = slice_bytes / 64, l1 = (size_t)(t + 1) * lines / (size_t)tiles;
    for (size_t l = (size_t)t * lines / (size_t)tiles; l < l1; l++)
        _mm_prefetch(ahead + l * 64, _MM_HINT_T1);
}
#endif

size_t ig__gemm16_packed_elems(int n, int k)
{
    return ig__panels_elems(n, k, IG_GEMM16_NR);
}

void ig__gemm16_pack(uint16_t *dst, const uint16_t *w, int n, int k)
{
    ig__panels_pack(dst, w, n, k, IG_GEMM16_NR, sizeof(uint16_t));
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

/*
 * AVX2 for many rows: the tile above (2 rows by a whole panel) spends one
 * widening per two multiply-adds, and the widening (a zero-extend and a
 * shift per 8 weights) competes with the FMAs for the same pipes: the tile
 * reaches about two thirds of the core's FMA rate. This one is G16W_MR rows by half a panel (16
 * columns, 12 accumulators), so each widened weight serves 6 rows. BF16 is
 * widened in one instruction per 8 weights by interleaving zeros below it
 * (vpunpck{l,h}wd), which leaves columns 0-3 and 8-11 in one vector and
 * 4-7 and 12-15 in the other, put back in order where the tile meets y.
 * Every output lane does the operations of the tile above (SUB products
 * from zero, then added to y), so the bits are the same for any m.
 */
#define G16W_MR 6
#define G16W_MIN_ROWS 3 /* below this the tile above (the decode path) */

static inline __attribute__((always_inline)) void wtile16_avx2(float *c, int ldc, const float *x,
                                                               int ldx, const uint16_t *wp, int kc,
                                                               int mr, int load, int bf16)
{
    const __m256i zero = _mm256_setzero_si256();
    for (int s0 = 0; s0 < kc; s0 += G16_SUB) {
        int se = s0 + G16_SUB < kc ? s0 + G16_SUB : kc;
        __m256 acc[G16W_MR][2];
#pragma GCC unroll 6
        for (int a = 0; a < mr; a++)
            acc[a][0] = acc[a][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int kk = s0; kk < se; kk++) {
            const uint16_t *w = wp + (size_t)kk * IG_GEMM16_NR;
            __m256 w0, w1;
            if (bf16) {
                __m256i v = _mm256_loadu_si256((const __m256i *)w);
                w0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
                w1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
            } else {
                w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
                w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 8)));
            }
#pragma GCC unroll 6
            for (int a = 0; a < mr; a++) {
                __m256 xa = _mm256_broadcast_ss(x + (size_t)a * ldx + kk);
                acc[a][0] = _mm256_fmadd_ps(xa, w0, acc[a][0]);
                acc[a][1] = _mm256_fmadd_ps(xa, w1, acc[a][1]);
            }
        }
        int add = load || s0 > 0;
#pragma GCC unroll 6
        for (int a = 0; a < mr; a++) {
            __m256 lo = acc[a][0], hi = acc[a][1];
            if (bf16) {
                lo = _mm256_permute2f128_ps(acc[a][0], acc[a][1], 0x20);
                hi = _mm256_permute2f128_ps(acc[a][0], acc[a][1], 0x31);
            }
            float *cp = c + (size_t)a * ldc;
            _mm256_storeu_ps(cp, add ? _mm256_add_ps(_mm256_loadu_ps(cp), lo) : lo);
            _mm256_storeu_ps(cp + 8, add ? _mm256_add_ps(_mm256_loadu_ps(cp + 8), hi) : hi);
        }
    }
}

static void wtile16_rows_avx2(float *c, int ldc, const float *x, int ldx, const uint16_t *wp,
                              int kc, int mr, int load, int bf16)
{
    switch (mr * 2 + (bf16 != 0)) {
#define G16W_CASE(r)                                                                               \
    case 2 * r:                                                                                    \
        wtile16_avx2(c, ldc, x, ldx, wp, kc, r, load, 0);                                          \
        return;                                                                                    \
    case 2 * r + 1:                                                                                \
        wtile16_avx2(c, ldc, x, ldx, wp, kc, r, load, 1);                                          \
        return;
        G16W_CASE(1)
        G16W_CASE(2)
        G16W_CASE(3)
        G16W_CASE(4)
        G16W_CASE(5)
        G16W_CASE(6)
#undef G16W_CASE
    default:
        return;
    }
}

static void gemm16w_avx2(float *y, int ldy, const float *x, const uint16_t *packed, int bf16, int m,
                         int k, int n, int n0, int n1)
{
    enum { HALF = IG_GEMM16_NR / 2 };
    for (int p = n0 / IG_GEMM16_NR; p * IG_GEMM16_NR < n1; p++) {
        const uint16_t *panel = packed + (size_t)p * IG_GEMM16_NR * k;
        for (int k0 = 0; k0 < k; k0 += G16_KC) {
            int kc = k - k0 < G16_KC ? k - k0 : G16_KC;
            for (int h = 0; h < 2; h++) {
                int col = p * IG_GEMM16_NR + h * HALF;
                int ncols = n - col < HALF ? n - col : HALF;
                if (ncols <= 0)
                    break;
                const uint16_t *wp = panel + (size_t)k0 * IG_GEMM16_NR + h * HALF;
                for (int i = 0; i < m; i += G16W_MR) {
                    int mr = m - i < G16W_MR ? m - i : G16W_MR;
                    float *yt = y + (size_t)i * ldy + col;
                    const float *xt = x + (size_t)i * k + k0;
                    if (ncols == HALF) {
                        wtile16_rows_avx2(yt, ldy, xt, k, wp, kc, mr, k0 > 0, bf16);
                        continue;
                    }
                    /* Padding columns go to a scratch tile, as above. */
                    float tmp[G16W_MR * HALF];
                    memset(tmp, 0, sizeof(tmp));
                    if (k0 > 0)
                        for (int a = 0; a < mr; a++)
                            memcpy(tmp + a * HALF, yt + (size_t)a * ldy, ncols * sizeof(float));
                    wtile16_rows_avx2(tmp, HALF, xt, k, wp, kc, mr, k0 > 0, bf16);
                    for (int a = 0; a < mr; a++)
                        memcpy(yt + (size_t)a * ldy, tmp + a * HALF, ncols * sizeof(float));
                }
            }
        }
    }
}
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
        if (m >= G16W_MIN_ROWS)
            gemm16w_avx2(y, ldy, x, packed, bf16, m, k, n, n0, n1);
        else
            gemm16_avx2(y, ldy, x, packed, bf16, m, k, n, n0, n1);
        return;
#endif
    default:
        gemm16_scalar(y, ldy, x, packed, bf16, m, k, n, n0, n1);
    }
}

/* ---- BF16 weights on BF16 activations (vdpbf16ps) ---------------------- */
/*
 * The other BF16 path: x rounded to BF16 once per call (ig__bf16_round_rows)
 * and W repacked at upload into k-pairs, so that one vdpbf16ps multiplies
 * 16 output columns by two k at once. Layout: panels of IG_GEMM16_NR
 * columns, k padded to even; in a panel, pair j of column c is at
 * panel[j * 2 * NR + 2 * c + (0, 1)], W[c][2j] first. Each output lane sums
 * P16_SUB products from zero (16 instructions of two products each, the
 * even pairs into one accumulator and the odd ones into another, added at
 * the end), then adds that partial to y, as the widening path does, so a row gets the same
 * bits whatever m and whatever columns a thread takes. The instruction
 * treats BF16 subnormals as zero, flushes subnormal results and rounds to
 * nearest even (it ignores MXCSR); each of its two products is exact in F32
 * and added to the accumulator with one rounding, the odd element's first.
 * The plain C form below does the same operations, for CPUs without the
 * instruction and for the tests (docs/engine.md, "Weights", gives the
 * error bound). */

#define P16_SUB 32 /* k per partial: 16 pairs */

int ig__gemm16p_kpad(int k)
{
    return k + (k & 1);
}

size_t ig__gemm16p_packed_elems(int n, int k)
{
    return ig__panels_elems(n, ig__gemm16p_kpad(k), IG_GEMM16_NR);
}

void ig__gemm16p_pack(uint16_t *dst, const uint16_t *w, int n, int k)
{
    int kp = ig__gemm16p_kpad(k);
    for (int p = 0; p * IG_GEMM16_NR < n; p++) {
        uint16_t *panel = dst + (size_t)p * IG_GEMM16_NR * kp;
        int rows = n - p * IG_GEMM16_NR < IG_GEMM16_NR ? n - p * IG_GEMM16_NR : IG_GEMM16_NR;
        if (rows < IG_GEMM16_NR || kp != k)
            memset(panel, 0, (size_t)IG_GEMM16_NR * kp * sizeof(uint16_t));
        for (int c = 0; c < rows; c++) {
            const uint16_t *src = w + (size_t)(p * IG_GEMM16_NR + c) * k;
            for (int kk = 0; kk < k; kk++)
                panel[(size_t)(kk >> 1) * 2 * IG_GEMM16_NR + 2 * c + (kk & 1)] = src[kk];
        }
    }
}

void ig__gemm16p_unpack_row(float *dst, const uint16_t *packed, int k, int row)
{
    int kp = ig__gemm16p_kpad(k);
    const uint16_t *p =
        packed + (size_t)(row / IG_GEMM16_NR) * IG_GEMM16_NR * kp + 2 * (row % IG_GEMM16_NR);
    for (int kk = 0; kk < k; kk++)
        dst[kk] = ig_bf16_to_f32(p[(size_t)(kk >> 1) * 2 * IG_GEMM16_NR + (kk & 1)]);
}

#ifdef G16_X86
IG__TARGET_BEGIN("avx512f,avx512bw,avx512vl")
/* ig_f32_to_bf16 on 16 floats: the same integer rounding, the same NaN. */
static int round16_avx512(uint16_t *o, const float *x, int k)
{
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x400000);
    int kk = 0;
    for (; kk + 16 <= k; kk += 16) {
        __m512i v = _mm512_loadu_si512((const void *)(x + kk));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs), inf);
        __m512i r = _mm512_add_epi32(
            v, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(v, 16), one)));
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(v, quiet));
        _mm256_storeu_si256((__m256i *)(o + kk), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    return kk;
}
IG__TARGET_END
#endif

void ig__bf16_round_rows(uint16_t *xb, const float *x, int m, int k)
{
    int kp = ig__gemm16p_kpad(k);
    for (int r = 0; r < m; r++) {
        uint16_t *o = xb + (size_t)r * kp;
        const float *xr = x + (size_t)r * k;
        int kk = 0;
#ifdef G16_X86
        if (ig__cpu_isa() == IG_CPU_ISA_AVX512)
            kk = round16_avx512(o, xr, k);
#endif
        for (; kk < k; kk++)
            o[kk] = ig_f32_to_bf16(xr[kk]);
        if (kp != k)
            o[k] = 0;
    }
}

/* A BF16 value as vdpbf16ps reads it: subnormals are zero. */
static inline float p16_in(uint16_t h)
{
    return (h & 0x7f80u) == 0 ? ((h & 0x8000u) ? -0.0f : 0.0f) : ig_bf16_to_f32(h);
}

/* acc + a * b with one rounding (the product is exact: 8 x 8 bits), the
 * result flushed to zero when subnormal. */
static inline float p16_step(float acc, float a, float b)
{
    float s = (float)((double)acc + (double)a * (double)b);
    if (s != 0.0f && fabsf(s) < 0x1p-126f)
        s = signbit(s) ? -0.0f : 0.0f;
    return s;
}

static void gemm16p_scalar(float *y, int ldy, const uint16_t *xb, const uint16_t *packed, int m,
                           int k, int n, int n0, int n1)
{
    int kp = ig__gemm16p_kpad(k);
    for (int r = 0; r < m; r++) {
        const uint16_t *xr = xb + (size_t)r * kp;
        for (int col = n0; col < n1 && col < n; col++) {
            const uint16_t *p = packed + (size_t)(col / IG_GEMM16_NR) * IG_GEMM16_NR * kp +
                                2 * (col % IG_GEMM16_NR);
            float sum = 0.0f;
            for (int s0 = 0; s0 < kp; s0 += P16_SUB) {
                int se = s0 + P16_SUB < kp ? s0 + P16_SUB : kp;
                float acc[2] = {0.0f, 0.0f};
                for (int kk = s0; kk < se; kk += 2) {
                    const uint16_t *wp = p + (size_t)(kk >> 1) * 2 * IG_GEMM16_NR;
                    float *a = &acc[((kk - s0) >> 1) & 1];
                    *a = p16_step(*a, p16_in(xr[kk + 1]), p16_in(wp[1]));
                    *a = p16_step(*a, p16_in(xr[kk]), p16_in(wp[0]));
                }
                float part = acc[0] + acc[1];
                sum = s0 == 0 ? part : sum + part;
            }
            y[(size_t)r * ldy + col] = sum;
        }
    }
}

#ifdef G16_X86
IG__TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512bf16,fma")
/* A tile is mr rows of x by one panel (32 columns, two vectors), with two
 * accumulators per output vector (even and odd pairs) and the running y
 * in registers: 16 accumulators and 8 sums at mr = 4, 27 of the 32
 * registers with the weights and x. 4 chains of vdpbf16ps at one row are
 * more than one row's weights arrive from memory for. Keeping y in
 * registers (rather than loading and storing it around every partial, as a
 * 6-row tile must) is what made 4 rows the faster tile for batched decode
 * (docs/engine.md, "CPU backend"). A decode row takes one panel per tile:
 * two panels would read two weight streams at once, which the memory
 * system serves more slowly than one. Few-row tiles do not prefetch: the
 * hardware prefetcher follows a single stream better on its own. */
#define P16_MR 4

static inline __attribute__((always_inline)) void tile16p(float *c, int ldc, const uint16_t *x,
                                                          int ldx, const uint16_t *panel, int kc,
                                                          int mr, int load)
{
    /* y stays in registers over the slice: the same additions in the same
     * order as through memory, without a load and a store per partial. */
    __m512 yr[P16_MR][2];
#pragma GCC unroll 8
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++)
            yr[a][v] = load ? _mm512_loadu_ps(c + (size_t)a * ldc + v * 16) : _mm512_setzero_ps();
    for (int s0 = 0; s0 < kc; s0 += P16_SUB) {
        int se = s0 + P16_SUB < kc ? s0 + P16_SUB : kc;
        __m512 acc[P16_MR][2][2];
#pragma GCC unroll 8
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++)
                acc[a][v][0] = acc[a][v][1] = _mm512_setzero_ps();
        int kk = s0;
#define P16_PAIR(sp)                                                                               \
    do {                                                                                           \
        const uint16_t *wp = panel + (size_t)(kk >> 1) * 2 * IG_GEMM16_NR;                         \
        __m512i w[2] = {_mm512_loadu_si512((const void *)wp),                                      \
                        _mm512_loadu_si512((const void *)(wp + IG_GEMM16_NR))};                    \
        _Pragma("GCC unroll 8") for (int a = 0; a < mr; a++)                                       \
        {                                                                                          \
            int32_t xp;                                                                            \
            memcpy(&xp, x + (size_t)a * ldx + kk, 4);                                              \
            __m512i xa = _mm512_set1_epi32(xp);                                                    \
            _Pragma("GCC unroll 2") for (int v = 0; v < 2; v++) acc[a][v][sp] =                    \
                _mm512_dpbf16_ps(acc[a][v][sp], (__m512bh)xa, (__m512bh)w[v]);                     \
        }                                                                                          \
    } while (0)
#pragma GCC unroll 4
        for (; kk + 4 <= se; kk += 4) {
            P16_PAIR(0);
            kk += 2;
            P16_PAIR(1);
            kk -= 2;
        }
        if (kk < se)
            P16_PAIR(0);
#undef P16_PAIR
        int add = load || s0 > 0;
#pragma GCC unroll 8
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) {
                __m512 part = _mm512_add_ps(acc[a][v][0], acc[a][v][1]);
                yr[a][v] = add ? _mm512_add_ps(yr[a][v], part) : part;
            }
    }
#pragma GCC unroll 8
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++)
            _mm512_storeu_ps(c + (size_t)a * ldc + v * 16, yr[a][v]);
}

static void tile16p_rows(float *c, int ldc, const uint16_t *x, int ldx, const uint16_t *panel,
                         int kc, int mr, int load)
{
    switch (mr) {
#define P16_CASE(r)                                                                                \
    case r:                                                                                        \
        tile16p(c, ldc, x, ldx, panel, kc, r, load);                                               \
        return;
        P16_CASE(1)
        P16_CASE(2)
        P16_CASE(3)
        P16_CASE(4)
#undef P16_CASE
    default:
        return;
    }
}

static void gemm16p_avx512bf16(float *y, int ldy, const uint16_t *xb, const uint16_t *packed, int m,
                               int k, int n, int n0, int n1)
{
    int kp = ig__gemm16p_kpad(k);
    int tiles = (m + P16_MR - 1) / P16_MR;
    for (int p = n0 / IG_GEMM16_NR; p * IG_GEMM16_NR < n1; p++) {
        int col = p * IG_GEMM16_NR;
        int ncols = n - col < IG_GEMM16_NR ? n - col : IG_GEMM16_NR;
        const uint16_t *panel = packed + (size_t)p * IG_GEMM16_NR * kp;
        for (int k0 = 0; k0 < kp; k0 += G16_KC) {
            int kc = kp - k0 < G16_KC ? kp - k0 : G16_KC;
            const uint16_t *slice = panel + (size_t)k0 * IG_GEMM16_NR;
            for (int i = 0; i < m; i += P16_MR) {
                int mr = m - i < P16_MR ? m - i : P16_MR;
                float *yt = y + (size_t)i * ldy + col;
                const uint16_t *xt = xb + (size_t)i * kp + k0;
                if (m >= P16_MR) /* fewer rows stream on the CPU's own prefetcher */
                    g16_prefetch_share(slice, (size_t)kc * IG_GEMM16_NR * 2, i / P16_MR, tiles);
                if (ncols == IG_GEMM16_NR) {
                    tile16p_rows(yt, ldy, xt, kp, slice, kc, mr, k0 > 0);
                } else {
                    float tmp[P16_MR * IG_GEMM16_NR];
                    memset(tmp, 0, sizeof(tmp));
                    if (k0 > 0)
                        for (int a = 0; a < mr; a++)
                            memcpy(tmp + a * IG_GEMM16_NR, yt + (size_t)a * ldy,
                                   ncols * sizeof(float));
                    tile16p_rows(tmp, IG_GEMM16_NR, xt, kp, slice, kc, mr, k0 > 0);
                    for (int a = 0; a < mr; a++)
                        memcpy(yt + (size_t)a * ldy, tmp + a * IG_GEMM16_NR, ncols * sizeof(float));
                }
            }
        }
    }
}
IG__TARGET_END
#endif

void ig__gemm16p(float *y, int ldy, const uint16_t *xb, const uint16_t *packed, int m, int k, int n,
                 int n0, int n1)
{
    if (n1 <= n0 || m <= 0)
        return;
#ifdef G16_X86
    if (ig__cpu_isa() == IG_CPU_ISA_AVX512 && ig__cpu_has_bf16_dot()) {
        gemm16p_avx512bf16(y, ldy, xb, packed, m, k, n, n0, n1);
        return;
    }
#endif
    gemm16p_scalar(y, ldy, xb, packed, m, k, n, n0, n1);
}
