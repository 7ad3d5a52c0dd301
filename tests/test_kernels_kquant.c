/*
 * Q4_K and Q6_K weights on the CPU backend (kernels/cpu/gemmkq.c): a weight
 * is s * q - o with s, o exact F32 per 16 weights, x is quantized per block
 * of 32 as for Q8_0, and each half-block adds dx (s sum q qx - o sum qx).
 *   - on every instruction set this CPU runs, the GEMM is within the float
 *     bound of a double reference on the dequantized weights (dtype.c:
 *     ggml's values, test_gguf_quants_ggufpy) and activations. Per block 3
 *     roundings of the running sum (3 fmas) and at most 3 of each term
 *     (s * dx, o * sum, their sum), relative to the magnitude the terms
 *     have before they cancel: sum (|s q| + |o|) |x| (s q and o can be far
 *     larger than the weight s q - o). So 3 nb + 3 units of that;
 *   - against the exact product (x not quantized), that plus
 *     sum |w| |x - x_q|;
 *   - every output has exactly the bits of the documented sequence
 *     (gemmkq.c: per block, two fmas of the halves' integer sums, then one
 *     of their offsets), computed here from GGUF's bytes on their own: the
 *     panel layout loses nothing and every path follows the one order;
 *   - the same bits alone, batched, split over threads, on every
 *     instruction set; embed gives ggml's values (a zero's sign aside);
 *   - rows that are not whole super-blocks of 256 and vectors are refused.
 * Super-blocks are random bytes with finite F16 scales: every byte pattern
 * is a valid block of these formats.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "../kernels/cpu/cpu_internal.h"

#include "infergate/dtype.h"
#include "infergate/error.h"
#include "infergate/kernels.h"

#include "quant_check.h"
#include "xorshift.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;

/* n rows of k (a multiple of 256) in dt, random. */
static unsigned char *rand_blocks(ig_dtype_t dt, int n, int k)
{
    size_t bytes = ig_dtype_bytes(dt, (size_t)n * k), sb = ig_dtype_bytes(dt, IG_QK_K);
    unsigned char *b = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        b[i] = (unsigned char)(ig_xs_next(&rng) >> 56);
    for (size_t s = 0; s < bytes / sb; s++) {
        uint16_t d = ig_f32_to_f16(ig_xs_float(&rng) * 0.01f),
                 m = ig_f32_to_f16(ig_xs_float(&rng) * 0.01f);
        if (dt == IG_DTYPE_Q4_K) {
            memcpy(b + s * sb, &d, 2);
            memcpy(b + s * sb + 2, &m, 2);
        } else {
            memcpy(b + s * sb + 208, &d, 2);
        }
    }
    return b;
}

/* q, s and o of every weight of n rows of k in dt (a weight is s q - o,
 * s and o per half-block of 16), from GGUF's bytes: Q4_K q the nibble,
 * s = d sc and o = dmin m of its sub-block of 32; Q6_K q the 6-bit value,
 * s = d sc of its 16, o = 32 s. */
static void kq_fields(uint8_t *q, float *s, float *o, const unsigned char *w, ig_dtype_t dt, int n,
                      int k)
{
    size_t sb = ig_dtype_bytes(dt, IG_QK_K);
    for (size_t b = 0; b < (size_t)n * k / IG_QK_K; b++) {
        const unsigned char *blk = w + b * sb;
        size_t at = b * IG_QK_K;
        uint16_t h;
        if (dt == IG_DTYPE_Q4_K) {
            memcpy(&h, blk, 2);
            float d = ig_f16_to_f32(h);
            memcpy(&h, blk + 2, 2);
            float dmin = ig_f16_to_f32(h);
            const unsigned char *sc = blk + 4, *qs = blk + 16;
            for (int j = 0; j < 8; j++) {
                int a = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
                int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                for (int l = 0; l < 32; l++) {
                    int v = qs[32 * (j / 2) + l];
                    q[at + 32 * j + l] = (uint8_t)(j % 2 ? v >> 4 : v & 15);
                    s[at + 32 * j + l] = d * (float)a;
                    o[at + 32 * j + l] = dmin * (float)m;
                }
            }
        } else {
            memcpy(&h, blk + 208, 2);
            float d = ig_f16_to_f32(h);
            const unsigned char *ql = blk, *qh = blk + 128;
            const signed char *sc = (const signed char *)(blk + 192);
            for (int i = 0; i < IG_QK_K; i++) {
                /* ggml: 128 weights a half, four runs of 32 (l, l + 32, l + 64, l + 96). */
                int half = i / 128, r = i % 128, run = r / 32, l = r % 32;
                int lo = ql[64 * half + l + 32 * (run % 2)];
                lo = run < 2 ? lo & 15 : lo >> 4;
                int hi = qh[32 * half + l] >> (2 * run) & 3;
                q[at + i] = (uint8_t)(lo | hi << 4);
                s[at + i] = d * (float)sc[i / 16];
                o[at + i] = 32.0f * s[at + i];
            }
        }
    }
}

/* Each weight's term magnitude |s q| + |o| (Q6_K's q taken at its
 * largest, 63), from kq_fields: the scale of its rounding in a dot. */
static void term_mags(float *t, const unsigned char *w, ig_dtype_t dt, int n, int k)
{
    size_t nw = (size_t)n * k;
    uint8_t *q = malloc(nw);
    float *s = malloc(nw * sizeof(float)), *o = malloc(nw * sizeof(float));
    assert_non_null(q);
    assert_non_null(s);
    assert_non_null(o);
    kq_fields(q, s, o, w, dt, n, k);
    for (size_t i = 0; i < nw; i++)
        t[i] = fabsf(s[i] * (dt == IG_DTYPE_Q4_K ? q[i] : 63)) + fabsf(o[i]);
    free(q);
    free(s);
    free(o);
}

/* What gemmkq.c documents for one output: per block of 32, in order,
 * acc = fma(i0, s0 dx, acc), fma(i1, s1 dx, acc), fma(-(o0 x0 + o1 x1), dx,
 * acc), with i_h the half's exact sum of q q_x and x_h its sum of q_x. */
static float kq_sequence(const uint8_t *q, const float *s, const float *o, const int8_t *xq,
                         const float *xd, int k)
{
    float acc = 0.0f;
    for (int b = 0; b < k / 32; b++) {
        int32_t i[2] = {0, 0}, xs[2] = {0, 0};
        for (int t = 0; t < 32; t++) {
            i[t / 16] += q[32 * b + t] * xq[32 * b + t];
            xs[t / 16] += xq[32 * b + t];
        }
        float dx = xd[b];
        float d0 = s[32 * b] * dx, d1 = s[32 * b + 16] * dx;
        acc = fmaf((float)i[0], d0, acc);
        acc = fmaf((float)i[1], d1, acc);
        float p0 = o[32 * b] * (float)xs[0];
        float p1 = o[32 * b + 16] * (float)xs[1];
        float off = p0 + p1;
        acc = fmaf(-off, dx, acc);
    }
    return acc;
}

static void check(ig_backend_t *be, ig_dtype_t dt, int m, int n, int k, const char *label)
{
    int nb = k / 32;
    unsigned char *wq = rand_blocks(dt, n, k);
    float *w = malloc((size_t)n * k * sizeof(float)), *x = ig_xs_buf(&rng, (size_t)m * k, 1.0f);
    float *tm = malloc((size_t)n * k * sizeof(float)), *xdq = malloc((size_t)m * k * 4);
    int8_t *xq = malloc((size_t)m * k);
    float *xs = malloc((size_t)m * nb * sizeof(float));
    ig_dtype_to_f32(w, wq, dt, (size_t)n * k);
    term_mags(tm, wq, dt, n, k);
    ig_tq_quantize_x(x, m, k, xq, xs, xdq);
    size_t ny = (size_t)m * n;
    double *ref = malloc(ny * 8), *mag = malloc(ny * 8), *exact = malloc(ny * 8),
           *qerr = malloc(ny * 8);
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++) {
            double sum = 0, a = 0, e = 0, qe = 0;
            for (int i = 0; i < k; i++) {
                double xv = x[(size_t)r * k + i], xd = xdq[(size_t)r * k + i];
                double wv = w[(size_t)c * k + i];
                sum += xd * wv;
                a += fabs(xd) * tm[(size_t)c * k + i];
                e += xv * wv;
                qe += fabs(wv) * fabs(xv - xd);
            }
            ref[(size_t)r * n + c] = sum, mag[(size_t)r * n + c] = a;
            exact[(size_t)r * n + c] = e, qerr[(size_t)r * n + c] = qe;
        }
    ig_tensor_t t = {dt, wq, 2, {n, k}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &t, &W), 0);
    float *y = malloc(ny * sizeof(float));
    memset(y, 0xff, ny * sizeof(float));
    assert_int_equal(be->matmul(be, y, x, &W, NULL, m), 0);
    char what[128];
    snprintf(what, sizeof(what), "%s %s m=%d n=%d k=%d", label, ig_dtype_name(dt), m, n, k);
    ig_assert_within_bound(y, ref, mag, ny, 3 * nb + 3, ig_f32_floor(4 * k), what);
    uint8_t *fq = malloc((size_t)n * k);
    float *fs = malloc((size_t)n * k * sizeof(float)), *fo = malloc((size_t)n * k * sizeof(float));
    kq_fields(fq, fs, fo, wq, dt, n, k);
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++) {
            size_t wi = (size_t)c * k;
            float want =
                kq_sequence(fq + wi, fs + wi, fo + wi, xq + (size_t)r * k, xs + (size_t)r * nb, k);
            float got = y[(size_t)r * n + c];
            if (memcmp(&got, &want, sizeof(float)) != 0)
                fail_msg("%s: y[%d][%d] %a, the documented sequence gives %a", what, r, c, got,
                         want);
        }
    free(fq), free(fs), free(fo);
    for (size_t i = 0; i < ny; i++) {
        double bd = qerr[i] + ig_bound_of(mag[i], 3 * nb + 3, ig_f32_floor(4 * k));
        if (!(fabs(y[i] - exact[i]) <= bd))
            fail_msg("%s: element %zu: %.9g vs exact %.9g beyond the quantization bound %.3g", what,
                     i, y[i], exact[i], bd);
    }
    float *row = malloc((size_t)k * sizeof(float));
    int id = n - 1;
    assert_int_equal(be->embed(be, row, &W, &id, 1), 0);
    for (int i = 0; i < k; i++) /* equal values (a zero's sign may differ: s q - o vs s (q - 32)) */
        if (!(row[i] == w[(size_t)id * k + i]))
            fail_msg("%s: embed %d: %.9g, ggml's %.9g", what, i, row[i], w[(size_t)id * k + i]);
    be->free_weight(be, &W);
    free(wq), free(w), free(x), free(tm), free(xdq), free(xq), free(xs);
    free(ref), free(mag), free(exact), free(qerr), free(y), free(row);
}

static void check_q4_k(ig_backend_t *be, int m, int n, int k, const char *isa)
{
    check(be, IG_DTYPE_Q4_K, m, n, k, isa);
}

static void check_q6_k(ig_backend_t *be, int m, int n, int k, const char *isa)
{
    check(be, IG_DTYPE_Q6_K, m, n, k, isa);
}

static void test_within_bounds_every_isa(void **state)
{
    static const int shapes[][3] = {{1, 3, 256},   {5, 40, 512}, {17, 33, 768},
                                    {1, 100, 256}, {4, 64, 256}, {64, 20, 512}};
    ig_tq_every_isa(shapes, (int)(sizeof(shapes) / sizeof(shapes[0])), check_q4_k);
    ig_tq_every_isa(shapes, (int)(sizeof(shapes) / sizeof(shapes[0])), check_q6_k);
}

static void test_batch_invariant(void **state)
{
    int m = 19, n = 77, k = 768;
    float *x = ig_xs_buf(&rng, (size_t)m * k, 1.0f);
    for (int f = 0; f < 2; f++) {
        ig_dtype_t dt = f ? IG_DTYPE_Q6_K : IG_DTYPE_Q4_K;
        unsigned char *wq = rand_blocks(dt, n, k);
        ig_tensor_t t = {dt, wq, 2, {n, k}};
        ig_tq_batch_invariant(&t, x, m);
        free(wq);
    }
    free(x);
}

static void test_rejects_bad_shapes(void **state)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
    unsigned char buf[512] = {0};
    ig_tensor_t odd = {IG_DTYPE_Q4_K, buf, 2, {1, 288}}, vec = {IG_DTYPE_Q6_K, buf, 1, {256}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &odd, &W), IG_EINVAL);
    assert_int_equal(be->upload_weight(be, &vec, &W), IG_EINVAL);
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q4_K, 512), 288);
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q6_K, 256), 210);
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q6_K, 32), 0);
    assert_int_equal(ig_dtype_block(IG_DTYPE_Q4_K), 256);
    be->destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_within_bounds_every_isa),
        cmocka_unit_test(test_batch_invariant),
        cmocka_unit_test(test_rejects_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
