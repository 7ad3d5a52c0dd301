/*
 * Each CPU kernel against a naive scalar reference on random inputs: GEMM
 * through the own SIMD loop and through OpenBLAS (pool-split and
 * OpenBLAS-threaded), with and without bias, odd shapes included; RMSNorm,
 * RoPE, SwiGLU, add, embed, gather, weight conversion, KV append and paged
 * attention (GQA, decode and prefill rows mixed).
 *
 * Every comparison is against an error bound derived from the computation
 * (tests/support/fp_bound.h), not a tolerance tuned on one machine: a k-term dot
 * product may be off by 2 k u sum|x w|, whatever order a BLAS or SIMD path
 * sums in; test_bound_catches_wrong_results shows that a result with one
 * term dropped or one element shifted fails the same check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "../kernels/cpu/cpu_internal.h"
#include "../kernels/cpu/simd.h"
#include "infergate/error.h"
#include "infergate/kernels.h"

#include "xorshift.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;

static float *rand_buf(size_t n)
{
    return ig_xs_buf(&rng, n, 1.0f);
}

static ig_weight_t make_weight(float *data, int64_t rows, int64_t cols)
{
    ig_weight_t w = {IG_DTYPE_F32, data, rows, cols};
    return w;
}

/* |ref[i]| of n values: the magnitude of a result of a few roundings. */
static double *abs_of(const double *ref, size_t n)
{
    double *mag = malloc(n * sizeof(double));
    assert_non_null(mag);
    for (size_t i = 0; i < n; i++)
        mag[i] = fabs(ref[i]);
    return mag;
}

/* ig__vexp is within 2 ulp of expf and glibc's expf within 1 ulp of e^x
 * (simd.h): 3 ulp, and one ulp is at most 2u of the value, so 6 roundings. */
#define EXP_UNITS 6.0

/* ---- GEMM ----------------------------------------------------------------- */

/* A GEMM output of k terms (+ a bias): gamma_{k+1} sum |x w| (fp_bound.h). */
static void assert_gemm_within_bound(const float *y, const double *ref, const double *mag, int m,
                                     int n, int k, int with_bias, const char *what)
{
    double terms = k + (with_bias ? 1 : 0);
    ig_assert_within_bound(y, ref, mag, (size_t)m * n, terms, ig_f32_floor(terms), what);
}

static const int shapes[][3] = {
    /* m, n, k; n around the panel
     * width (48 with AVX-512), k around the k-block (128) */
    {1, 1, 1},     {1, 7, 5},      {3, 5, 17},   {4, 4, 16},     {5, 33, 31},
    {1, 288, 288}, {64, 100, 288}, {7, 768, 64}, {17, 288, 768}, {2, 1000, 48},
    {70, 40, 33},  {9, 49, 129},   {8, 96, 128}, {13, 47, 257},  {65, 145, 130},
};

/* W(n, k) through upload_weight, as the engine holds it (packed). */
static ig_weight_t upload_f32(ig_backend_t *be, const float *w, int n, int k)
{
    ig_tensor_t t = {IG_DTYPE_F32, (void *)w, 2, {n, k}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &t, &W), 0);
    return W;
}

static void check_gemm_mode(ig_backend_t *be, ig_cpu_gemm_t mode, const char *label)
{
    char what[128];
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *x = rand_buf((size_t)m * k), *w = rand_buf((size_t)n * k), *b = rand_buf(n);
        float *y = malloc((size_t)m * n * sizeof(float));
        double *ref = malloc((size_t)m * n * sizeof(double));
        double *mag = malloc((size_t)m * n * sizeof(double));
        /* a weight made by hand (row-major) and one uploaded (packed) */
        ig_weight_t Ws[2] = {make_weight(w, n, k), upload_f32(be, w, n, k)};
        ig_weight_t B = make_weight(b, n, 1);
        for (int up = 0; up < 2; up++) {
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                ig_ref_gemm(ref, mag, x, w, with_bias ? b : NULL, m, n, k);
                memset(y, 0xff, (size_t)m * n * sizeof(float)); /* NaN: every cell written */
                assert_int_equal(be->matmul(be, y, x, &Ws[up], with_bias ? &B : NULL, m), 0);
                snprintf(what, sizeof(what), "%s m=%d n=%d k=%d bias=%d uploaded=%d", label, m, n,
                         k, with_bias, up);
                assert_gemm_within_bound(y, ref, mag, m, n, k, with_bias, what);
            }
        }
        be->free_weight(be, &Ws[1]);
        free(x), free(w), free(b), free(y), free(ref), free(mag);
    }
}

static void test_gemm_paths(void **state)
{
    int threads[] = {1, 3};
    for (size_t t = 0; t < 2; t++) {
        ig_backend_t *be;
        assert_int_equal(ig_backend_cpu_create(&be, threads[t]), 0);
        assert_int_equal(ig__cpu_gemm(be), IG_CPU_GEMM_AUTO); /* the default */
        check_gemm_mode(be, IG_CPU_GEMM_AUTO, "auto");
        assert_int_equal(ig__cpu_set_gemm(be, IG_CPU_GEMM_OWN), 0);
        check_gemm_mode(be, IG_CPU_GEMM_OWN, "own");
#ifdef IG_HAVE_OPENBLAS
        assert_int_equal(ig__cpu_set_gemm(be, IG_CPU_GEMM_BLAS_POOL), 0);
        check_gemm_mode(be, IG_CPU_GEMM_BLAS_POOL, "blas-pool");
        assert_int_equal(ig__cpu_set_gemm(be, IG_CPU_GEMM_BLAS_OWN), 0);
        check_gemm_mode(be, IG_CPU_GEMM_BLAS_OWN, "blas");
#else
        assert_int_equal(ig__cpu_set_gemm(be, IG_CPU_GEMM_BLAS_POOL), IG_ENOTSUP);
#endif
        be->destroy(be);
    }
}

/* y = x W^T + bias as a scalar float loop: t from 0 to k - 1, or backwards;
 * `drop` terms left off the end (a loop that stops at k - drop). */
static void float_gemm(float *y, const float *x, const float *w, const float *bias, int m, int n,
                       int k, int backwards, int drop)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = bias ? bias[j] : 0.0f;
            for (int q = 0; q < k - drop; q++) {
                int t = backwards ? k - 1 - q : q;
                s += x[(size_t)i * k + t] * w[(size_t)j * k + t];
            }
            y[(size_t)i * n + j] = s;
        }
}

/* The GEMM bound is wide enough for every correct summation order and
 * narrow enough for a wrong kernel. On each shape of the GEMM tests a plain
 * float loop, forwards and backwards (recursive summation, the order with
 * the worst error growth), passes it; the same loop one term short (t < k - 1)
 * and the right results stored one column over both exceed it. */
static void test_bound_catches_wrong_results(void **state)
{
    double least_caught = INFINITY, most_passed = 0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        size_t mn = (size_t)m * n, at;
        float *x = rand_buf((size_t)m * k), *w = rand_buf((size_t)n * k), *b = rand_buf(n);
        float *y = malloc(mn * sizeof(float));
        double *ref = malloc(mn * sizeof(double)), *mag = malloc(mn * sizeof(double));
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bias = with_bias ? b : NULL;
            double terms = k + with_bias, floor = ig_f32_floor(terms);
            ig_ref_gemm(ref, mag, x, w, bias, m, n, k);
            for (int back = 0; back < 2; back++) {
                float_gemm(y, x, w, bias, m, n, k, back, 0);
                double r = ig_bound_worst(y, ref, mag, mn, terms, floor, &at);
                assert_true(r <= 1.0);
                most_passed = fmax(most_passed, r);
            }
            float_gemm(y, x, w, bias, m, n, k, 0, 1); /* one term short */
            double r = ig_bound_worst(y, ref, mag, mn, terms, floor, &at);
            if (!(r > 1.0))
                fail_msg("m=%d n=%d k=%d: one term dropped is within the bound (%.3g)", m, n, k, r);
            least_caught = fmin(least_caught, r);
            if (n > 1) { /* each row's outputs stored one column over */
                float_gemm(y, x, w, bias, m, n, k, 0, 0);
                for (int i = 0; i < m; i++)
                    memmove(y + (size_t)i * n + 1, y + (size_t)i * n, (size_t)(n - 1) * 4);
                r = ig_bound_worst(y, ref, mag, mn, terms, floor, &at);
                if (!(r > 1.0))
                    fail_msg("m=%d n=%d k=%d: shifted outputs are within the bound (%.3g)", m, n, k,
                             r);
                least_caught = fmin(least_caught, r);
            }
        }
        free(x), free(w), free(b), free(y), free(ref), free(mag);
    }
    printf("# bound: correct float loops use at most %.3g of it, wrong results at least %.3g x\n",
           most_passed, least_caught);
}

/* The own loop computes each output the same way whatever the batch size
 * and whatever slice of columns a thread takes: rows computed alone, in
 * every tile height and in column slices are bit-equal to one full call. */
static void test_gemm_own_rows_independent(void **state)
{
    int nr = ig__gemm_panel_width();
    int n = 2 * nr + 5, k = 300, m = 19; /* an edge panel, three k-blocks, tiles of 8, 8, 3 */
    float *x = rand_buf((size_t)m * k), *w = rand_buf((size_t)n * k);
    float *wp = malloc(ig__gemm_packed_floats(n, k) * sizeof(float));
    float *all = malloc((size_t)m * n * sizeof(float)), *part = malloc((size_t)m * n * 4);
    ig__gemm_pack(wp, w, n, k);
    ig__gemm_own(all, n, x, wp, m, k, n, 0, n);
    for (int i = 0; i < m; i++) {
        ig__gemm_own(part, n, x + (size_t)i * k, wp, 1, k, n, 0, n);
        assert_memory_equal(part, all + (size_t)i * n, (size_t)n * sizeof(float));
    }
    for (int rows = 2; rows <= m; rows++) { /* every tile height, at an odd offset */
        ig__gemm_own(part, n, x + (size_t)(m - rows) * k, wp, rows, k, n, 0, n);
        assert_memory_equal(part, all + (size_t)(m - rows) * n, (size_t)rows * n * sizeof(float));
    }
    for (int p = 0; p * nr < n; p++) /* one panel at a time */
        ig__gemm_own(part, n, x, wp, m, k, n, p * nr, (p + 1) * nr < n ? (p + 1) * nr : n);
    assert_memory_equal(part, all, (size_t)m * n * sizeof(float));
    free(x), free(w), free(wp), free(all), free(part);
}

/* The packed kernel against the naive loop on sizes that are not multiples
 * of the tile (8 rows with AVX-512), the panel (48 columns) or the k-block
 * (128), through the backend with 1 and 3 threads: the two agree to the bit,
 * so the thread count does not change results either. */
static void test_gemm_own_odd_shapes(void **state)
{
    static const int ms[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 64, 67};
    static const int nks[][2] = {{1, 1}, {47, 3}, {49, 127}, {95, 129}, {150, 300}, {200, 64}};
    ig_backend_t *be1, *be3;
    assert_int_equal(ig_backend_cpu_create(&be1, 1), 0);
    assert_int_equal(ig_backend_cpu_create(&be3, 3), 0);
    assert_int_equal(ig__cpu_set_gemm(be1, IG_CPU_GEMM_OWN), 0);
    assert_int_equal(ig__cpu_set_gemm(be3, IG_CPU_GEMM_OWN), 0);
    char what[96];
    for (size_t a = 0; a < sizeof(nks) / sizeof(nks[0]); a++) {
        int n = nks[a][0], k = nks[a][1], mmax = 67;
        float *x = rand_buf((size_t)mmax * k), *w = rand_buf((size_t)n * k);
        float *y1 = malloc((size_t)mmax * n * 4), *y3 = malloc((size_t)mmax * n * 4);
        double *ref = malloc((size_t)mmax * n * sizeof(double));
        double *mag = malloc((size_t)mmax * n * sizeof(double));
        ig_ref_gemm(ref, mag, x, w, NULL, mmax, n, k);
        ig_weight_t W1 = upload_f32(be1, w, n, k), W3 = upload_f32(be3, w, n, k);
        for (size_t b = 0; b < sizeof(ms) / sizeof(ms[0]); b++) {
            int m = ms[b];
            memset(y1, 0xff, (size_t)m * n * 4);
            memset(y3, 0xff, (size_t)m * n * 4);
            assert_int_equal(be1->matmul(be1, y1, x, &W1, NULL, m), 0);
            assert_int_equal(be3->matmul(be3, y3, x, &W3, NULL, m), 0);
            snprintf(what, sizeof(what), "own m=%d n=%d k=%d", m, n, k);
            assert_gemm_within_bound(y1, ref, mag, m, n, k, 0, what);
            assert_memory_equal(y1, y3, (size_t)m * n * 4);
        }
        be1->free_weight(be1, &W1);
        be3->free_weight(be3, &W3);
        free(x), free(w), free(y1), free(y3), free(ref), free(mag);
    }
    be1->destroy(be1);
    be3->destroy(be3);
}

/* ---- element-wise --------------------------------------------------------- */

static void test_rmsnorm_swiglu_add(void **state)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 2), 0);
    int m = 300, n = 136; /* big enough to go through the pool */
    float *x = rand_buf((size_t)m * n), *w = rand_buf(n), *out = rand_buf((size_t)m * n);
    double *ref = malloc((size_t)m * n * sizeof(double));
    ig_weight_t W = make_weight(w, n, 1);
    for (int i = 0; i < m; i++) {
        double ss = 0;
        for (int j = 0; j < n; j++)
            ss += (double)x[i * n + j] * x[i * n + j];
        double inv = 1.0 / sqrt(ss / n + 1e-5);
        for (int j = 0; j < n; j++)
            ref[i * n + j] = x[i * n + j] * inv * w[j];
    }
    /* x * w / sqrt(sum x^2 / n + eps): the sum of n positive terms is off by
     * gamma_n relative, the division by n, + eps (and eps's own rounding to
     * float) and sqrt add 3 (halved by the sqrt), then sqrt, 1/, and two
     * products 4: n / 2 + 6 roundings of |out|. */
    double *mag = abs_of(ref, (size_t)m * n);
    double units = n / 2.0 + 6, floor = ig_f32_floor(4);
    assert_int_equal(be->rmsnorm(be, out, x, &W, m, 1e-5f), 0);
    ig_assert_within_bound(out, ref, mag, (size_t)m * n, units, floor, "rmsnorm");
    assert_int_equal(be->rmsnorm(be, x, x, &W, m, 1e-5f), 0); /* in place */
    ig_assert_within_bound(x, ref, mag, (size_t)m * n, units, floor, "rmsnorm in place");
    free(mag);

    size_t len = (size_t)m * n;
    float *g = rand_buf(len), *u = rand_buf(len), *y = rand_buf(len), *y0 = malloc(len * 4);
    memcpy(y0, y, len * 4);
    for (size_t i = 0; i < len; i++) {
        double gg = g[i] * 4.0; /* reach the saturated ends of silu */
        g[i] = (float)gg;
        ref[i] = gg / (1.0 + exp(-gg)) * u[i];
    }
    /* g / (1 + e^-g) * u: e^-g's EXP_UNITS (relative, and 1 + e keeps it
     * relative as both are positive), then +, / and * : EXP_UNITS + 4. */
    mag = abs_of(ref, len);
    assert_int_equal(be->swiglu(be, out, g, u, len), 0);
    ig_assert_within_bound(out, ref, mag, len, EXP_UNITS + 4, ig_f32_floor(4), "swiglu");
    for (size_t i = 0; i < len; i++)
        ref[i] = (double)y0[i] + g[i], mag[i] = fabs(ref[i]);
    assert_int_equal(be->add(be, y, g, len), 0);
    ig_assert_within_bound(y, ref, mag, len, 1, 0, "add"); /* one rounding */
    free(mag);
    assert_int_equal(be->add(be, y, g, 5), 0); /* small: the calling thread alone */
    free(x), free(w), free(out), free(ref), free(g), free(u), free(y), free(y0);
    be->destroy(be);
}

static void test_rope(void **state)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 2), 0);
    int ntok = 11, nh = 4, nkv = 2, hd = 16, half = hd / 2;
    float *q = rand_buf((size_t)ntok * nh * hd), *k = rand_buf((size_t)ntok * nkv * hd);
    float *q0 = malloc((size_t)ntok * nh * hd * 4), *k0 = malloc((size_t)ntok * nkv * hd * 4);
    memcpy(q0, q, (size_t)ntok * nh * hd * 4);
    memcpy(k0, k, (size_t)ntok * nkv * hd * 4);
    int pos[11] = {0, 1, 2, 3, 7, 100, 5000, 31, 32, 33, 65535};
    float freq[8];
    for (int i = 0; i < half; i++)
        freq[i] = (float)(1.0 / pow(10000.0, 2.0 * i / hd));
    assert_int_equal(be->rope(be, q, k, pos, ntok, nh, nkv, hd, freq), 0);
    for (int pass = 0; pass < 2; pass++) {
        int heads = pass ? nkv : nh;
        const float *src = pass ? k0 : q0, *got = pass ? k : q;
        size_t total = (size_t)ntok * heads * hd;
        double *ref = malloc(total * sizeof(double)), *mag = malloc(total * sizeof(double));
        for (int t = 0; t < ntok; t++)
            for (int h = 0; h < heads; h++) {
                const float *v = src + ((size_t)t * heads + h) * hd;
                double *r = ref + ((size_t)t * heads + h) * hd;
                double *mg = mag + ((size_t)t * heads + h) * hd;
                for (int i = 0; i < half; i++) {
                    double a = (double)pos[t] * freq[i], c = cos(a), sn = sin(a);
                    r[i] = v[i] * c - v[i + half] * sn;
                    r[i + half] = v[i + half] * c + v[i] * sn;
                    mg[i] = fabs(v[i] * c) + fabs(v[i + half] * sn);
                    mg[i + half] = fabs(v[i + half] * c) + fabs(v[i] * sn);
                }
            }
        /* The angle in double (as the kernel takes it), cos and sin rounded
         * to float, two products and a sum: 3 roundings of |x1 c| + |x2 s|. */
        ig_assert_within_bound(got, ref, mag, total, 3, ig_f32_floor(3),
                               pass ? "rope k" : "rope q");
        free(ref), free(mag);
    }
    free(q), free(k), free(q0), free(k0);
    be->destroy(be);
}

static uint16_t bits16(const char *what, int i)
{
    /* (f16 bits, bf16 bits) of 1.0, -2.5, 65504 / 3.0e38-ish, 2^-24, 0 */
    static const uint16_t f16[] = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x0000, 0x3555};
    static const uint16_t bf16[] = {0x3f80, 0xc020, 0x7f7f, 0x0001, 0x8000, 0x3eab};
    return what[0] == 'f' ? f16[i] : bf16[i];
}

static void test_upload_convert(void **state)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
    uint16_t h[6], b[6];
    for (int i = 0; i < 6; i++)
        h[i] = bits16("f16", i), b[i] = bits16("bf16", i);
    double want_h[] = {1.0, -2.5, 65504.0, ldexp(1.0, -24), 0.0, 0.333251953125};
    double want_b[] = {1.0, -2.5, 3.3895313892515355e38, 9.183549615799121e-41, -0.0, 0.333984375};
    ig_tensor_t th = {IG_DTYPE_F16, h, 2, {2, 3}}, tb = {IG_DTYPE_BF16, b, 1, {6}};
    ig_weight_t wh, wb;
    assert_int_equal(be->upload_weight(be, &th, &wh), 0);
    assert_int_equal(be->upload_weight(be, &tb, &wb), 0);
    assert_int_equal(wh.dtype, IG_DTYPE_F16); /* 2-D 16-bit weights stay 16-bit */
    assert_int_equal(wh.rows, 2);
    assert_int_equal(wh.cols, 3);
    assert_int_equal(wb.rows, 6);
    assert_int_equal(wb.cols, 1);
    /* the 2-D weight is stored packed for the GEMM: read its rows back
     * through embed */
    float rowsh[6];
    int ids[2] = {0, 1};
    assert_int_equal(be->embed(be, rowsh, &wh, ids, 2), 0);
    for (int i = 0; i < 6; i++) {
        assert_true(rowsh[i] == (float)want_h[i]);
        assert_true(((float *)wb.data)[i] == (float)want_b[i]);
    }
    be->free_weight(be, &wh);
    be->free_weight(be, &wb);
    ig_tensor_t bad = {IG_DTYPE_F32, NULL, 1, {4}};
    assert_int_equal(be->upload_weight(be, &bad, &wh), IG_EINVAL);
    be->destroy(be);
}

static void test_embed_gather(void **state)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
    int vocab = 50, dim = 24;
    float *table = rand_buf((size_t)vocab * dim), *out = malloc(4 * dim * 4);
    ig_weight_t T = make_weight(table, vocab, dim);
    int tokens[4] = {3, 0, 49, 3};
    assert_int_equal(be->embed(be, out, &T, tokens, 4), 0);
    for (int i = 0; i < 4; i++)
        assert_memory_equal(out + i * dim, table + tokens[i] * dim, dim * 4);
    int bad[1] = {50};
    assert_int_equal(be->embed(be, out, &T, bad, 1), IG_ERANGE);
    /* the same table uploaded (packed, as a tied lm_head shares it) */
    ig_weight_t U = upload_f32(be, table, vocab, dim);
    assert_int_equal(be->embed(be, out, &U, tokens, 4), 0);
    for (int i = 0; i < 4; i++)
        assert_memory_equal(out + i * dim, table + tokens[i] * dim, dim * 4);
    assert_int_equal(be->embed(be, out, &U, bad, 1), IG_ERANGE);
    be->free_weight(be, &U);
    float *g = malloc(3 * dim * 4);
    int rows[3] = {2, 2, 0};
    assert_int_equal(be->gather(be, g, out, rows, 3, dim), 0);
    assert_memory_equal(g, out + 2 * dim, dim * 4);
    assert_memory_equal(g + dim, out + 2 * dim, dim * 4);
    assert_memory_equal(g + 2 * dim, out, dim * 4);
    free(table), free(out), free(g);
    be->destroy(be);
}

/* ---- paged attention ------------------------------------------------------ */

static void test_attention_paged(void **state)
{
    enum { NSEQ = 4, NL = 2, BS = 4, NB = 24, NKV = 2, NH = 6, HD = 8, MAXB = 10 };
    /* Sequence 0 decodes one row at position 9, sequence 1 prefills 7 rows
     * from position 0, sequence 2 prefills a chunk of 3 rows at 13..15,
     * sequence 3 a chunk of 37 rows at 3..39 (split over work items). */
    int qlen[NSEQ] = {1, 7, 3, 37}, ctx[NSEQ] = {10, 7, 16, 40};
    int maxb = MAXB;
    int tables[NSEQ * MAXB] = {
        5,  17, 2, 0, 0,  0,  0,  0,  0,  0, /* */
        9,  1,  0, 0, 0,  0,  0,  0,  0,  0, /* */
        23, 11, 3, 8, 0,  0,  0,  0,  0,  0, /* */
        4,  22, 6, 7, 10, 12, 13, 14, 15, 16 /* */
    };
    int threads[] = {1, 3};
    for (int ti = 0; ti < 2; ti++) {
        ig_backend_t *be;
        assert_int_equal(ig_backend_cpu_create(&be, threads[ti]), 0);
        size_t kvn = (size_t)NL * NB * NKV * BS * HD;
        ig_kv_layout_t kv = {NL, NB, BS, NKV, HD, rand_buf(kvn), rand_buf(kvn), IG_DTYPE_F32};
        /* The full history of every sequence, written through kv_append. */
        int layer = 1;
        float *hk[NSEQ], *hv[NSEQ];
        for (int s = 0; s < NSEQ; s++) {
            hk[s] = rand_buf((size_t)ctx[s] * NKV * HD);
            hv[s] = rand_buf((size_t)ctx[s] * NKV * HD);
            int *slots = malloc(ctx[s] * sizeof(int));
            for (int p = 0; p < ctx[s]; p++)
                slots[p] = tables[s * maxb + p / BS] * BS + p % BS;
            assert_int_equal(be->kv_append(be, &kv, layer, hk[s], hv[s], slots, ctx[s]), 0);
            free(slots);
        }
        int q_start[NSEQ + 1] = {0, 1, 8, 11, 48};
        int ntok = q_start[NSEQ];
        float *q = rand_buf((size_t)ntok * NH * HD), *out = malloc((size_t)ntok * NH * HD * 4);
        ig_attn_batch_t b = {NSEQ, ntok, q_start, ctx, tables, maxb, 40, 37};
        float scale = 1.0f / sqrtf((float)HD);
        assert_int_equal(be->attention(be, out, q, &kv, layer, &b, NH, scale), 0);

        /* The bound of each output, per (row, head): a score q.k * scale is
         * an HD-term dot product and one more product, so off by
         * (HD + 2) u * A_t with A_t = scale * sum |q k_t|; the shift by the
         * maximum adds u |s_t - max|, e^x EXP_UNITS. Softmax is invariant
         * to the shift itself, so each weight e_t is off by at most
         * eta = max_t (those) relative, and p_t = e_t / sum by 2 eta plus the
         * sum of T positive terms (gamma_T) and the 1 / sum and * inv
         * roundings. The weighted sum of T terms adds gamma_T again:
         * |err_i| <= (2 eta + (2T + 3) u) * sum_t p_t |v_ti|. */
        size_t nout = (size_t)ntok * NH * HD;
        double *ref = malloc(nout * sizeof(double)), *mag = malloc(nout * sizeof(double));
        double *units = malloc(nout * sizeof(double));
        for (int s = 0; s < NSEQ; s++)
            for (int r = 0; r < qlen[s]; r++) {
                int row = q_start[s] + r, pos = ctx[s] - qlen[s] + r;
                for (int h = 0; h < NH; h++) {
                    int g = h / (NH / NKV);
                    const float *qv = q + ((size_t)row * NH + h) * HD;
                    double sc[64], mx = -1e300, sum = 0, amax = 0, eta = 0;
                    for (int t = 0; t <= pos; t++) {
                        double d = 0, a = 0;
                        for (int i = 0; i < HD; i++) {
                            double p = (double)qv[i] * hk[s][((size_t)t * NKV + g) * HD + i];
                            d += p;
                            a += fabs(p);
                        }
                        sc[t] = d * scale;
                        mx = sc[t] > mx ? sc[t] : mx;
                        amax = fmax(amax, a * scale);
                    }
                    for (int t = 0; t <= pos; t++) {
                        eta = fmax(eta, (HD + 2) * amax + fabs(sc[t] - mx) + EXP_UNITS);
                        sum += (sc[t] = exp(sc[t] - mx));
                    }
                    for (int i = 0; i < HD; i++) {
                        double o = 0, a = 0;
                        for (int t = 0; t <= pos; t++) {
                            double v = hv[s][((size_t)t * NKV + g) * HD + i];
                            o += sc[t] / sum * v;
                            a += sc[t] / sum * fabs(v);
                        }
                        size_t at = ((size_t)row * NH + h) * HD + i;
                        ref[at] = o, mag[at] = a, units[at] = 2 * eta + 2 * (pos + 1) + 3;
                    }
                }
            }
        /* units differ per (row, head): scale mag by them, bound 1 unit */
        for (size_t i = 0; i < nout; i++)
            mag[i] *= units[i];
        ig_assert_within_bound(out, ref, mag, nout, 1, ig_f32_floor(3 * 40), "attention");

        /* A context longer than its block table is refused. */
        int bad_ctx[NSEQ] = {10, 7, 16, 41};
        ig_attn_batch_t bad = b;
        bad.ctx_len = bad_ctx;
        assert_int_equal(be->attention(be, out, q, &kv, layer, &bad, NH, scale), IG_ERANGE);
        int bad_slot = NB * BS;
        assert_int_equal(be->kv_append(be, &kv, 0, hk[0], hv[0], &bad_slot, 1), IG_ERANGE);

        for (int s = 0; s < NSEQ; s++)
            free(hk[s]), free(hv[s]);
        free(kv.k), free(kv.v), free(q), free(out), free(ref), free(mag), free(units);
        be->destroy(be);
    }
}

/* The vector exponential used by softmax and SwiGLU, from e^-87 to e^80
 * (a float sum of more would overflow), and its clamped ends. */
static void test_exp_shift_sum(void **state)
{
    enum { N = 2001 };
    static float s[N];
    double want_sum = 0, worst = 0;
    for (int i = 0; i < N; i++) {
        s[i] = -87.0f + 167.0f * (float)i / (N - 1) - 1.0f; /* then shifted by mx = -1 */
    }
    float got_sum = ig__exp_shift_sum(s, N, -1.0f);
    for (int i = 0; i < N; i++) {
        double want = exp((double)(float)(-87.0f + 167.0f * (float)i / (N - 1) - 1.0f) + 1.0);
        want_sum += want;
        double rel = fabs(s[i] - want) / want;
        worst = rel > worst ? rel : worst;
    }
    printf("# exp: worst relative error %.3g (%.2g u)\n", worst, worst / IG_F32_U);
    /* The shift s - mx is exact here (s + 1 for |s| >= 1 in float), so the
     * error is e^x's own: EXP_UNITS u, without IG_BOUND_C's margin, as the
     * claim of simd.h it checks. The sum adds gamma_N on positive terms. */
    assert_true(worst <= EXP_UNITS * IG_F32_U);
    assert_true(fabs(got_sum - want_sum) <= ig_bound_of(want_sum, N + EXP_UNITS, 0));
    float big[3] = {-200.0f, 0.0f, 200.0f};
    ig__exp_shift_sum(big, 3, 0.0f);
    assert_true(big[0] >= 0.0f && big[0] < 1e-30f);
    assert_true(big[1] == 1.0f);
    assert_true(big[2] > 1e38f && isfinite(big[2]));
}

/* Every unit of a range is taken exactly once, whatever the chunk. */
static void test_pool_take_covers(void **state)
{
    for (int n = 0; n < 70; n += 7)
        for (int chunk = 1; chunk <= 17; chunk += 4) {
            atomic_int next;
            atomic_init(&next, 0);
            int b, e, expect = 0;
            while (ig__pool_take(&next, n, chunk, &b, &e)) {
                assert_int_equal(b, expect);
                assert_true(e > b && e - b <= chunk);
                expect = e;
            }
            assert_int_equal(expect, n);
        }
}

int main(void)
{
    const char *core;
    int usable = ig__cpu_blas_usable(&core);
    printf("# CPU kernels compiled for %s; OpenBLAS core %s (%s)\n", ig__cpu_simd_name(), core,
           usable ? "as wide as the own loop" : "narrower than the own loop");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_paths),
        cmocka_unit_test(test_gemm_own_rows_independent),
        cmocka_unit_test(test_gemm_own_odd_shapes),
        cmocka_unit_test(test_bound_catches_wrong_results),
        cmocka_unit_test(test_rmsnorm_swiglu_add),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_upload_convert),
        cmocka_unit_test(test_embed_gather),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_pool_take_covers),
        cmocka_unit_test(test_exp_shift_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
