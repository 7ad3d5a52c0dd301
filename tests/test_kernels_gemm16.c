/*
 * The 16-bit GEMM (kernels/cpu/gemm16.c): BF16 and F16 weights kept in their
 * own precision and widened in registers, on every instruction set this CPU
 * runs (AVX-512, AVX2 + F16C, plain C, chosen through ig__cpu_set_isa):
 *   - results within the k-term error bound of fp_bound.h against a double
 *     reference on the widened weights (the widening is exact, so the F32
 *     bound applies unchanged), odd shapes around the panel and k-block;
 *   - a row gets the same bits alone, inside any batch, any column split and
 *     any thread count (batch invariance);
 *   - upload keeps the dtype (IG_CPU_WEIGHTS=f32 widens as before), embed
 *     reads exact rows back;
 *   - uploading from a mapped file hands the file's pages back (mincore).
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

#include <fcntl.h>
#include "xorshift.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float *rand_buf(size_t n)
{
    return ig_xs_buf(&rng, n, 1.0f);
}

/* w(n, k) as dtype, and its exact widening back into wf. */
static uint16_t *to16(const float *w, size_t n, ig_dtype_t dt, float *wf)
{
    uint16_t *h = malloc(n * 2 + 64);
    assert_non_null(h);
    ig_dtype_from_f32(h, dt, w, n);
    ig_dtype_to_f32(wf, h, dt, n);
    return h;
}

static ig_weight_t upload16(ig_backend_t *be, const uint16_t *h, ig_dtype_t dt, int n, int k)
{
    ig_tensor_t t = {dt, h, 2, {n, k}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &t, &W), 0);
    assert_int_equal(W.dtype, dt);
    return W;
}

static const int shapes[][3] = {
    /* m, n, k: n around the panel width (32), k around SUB (32) and the
     * k-block (256), m around the tiles (8 and 2 rows) */
    {1, 1, 1},     {1, 7, 5},    {3, 5, 17},    {4, 32, 32},   {5, 33, 31},  {1, 288, 288},
    {64, 100, 64}, {7, 96, 257}, {17, 65, 300}, {2, 1000, 48}, {9, 31, 513}, {13, 47, 129},
};

static int isa_list(ig_cpu_isa_t *out)
{
    int n = 0;
    for (int i = IG_CPU_ISA_SCALAR; i <= (int)ig__cpu_isa_max(); i++)
        out[n++] = (ig_cpu_isa_t)i;
    return n;
}

static void check_one(ig_backend_t *be, ig_dtype_t dt, int m, int n, int k, const char *label)
{
    float *x = rand_buf((size_t)m * k), *w = rand_buf((size_t)n * k);
    float *wf = malloc((size_t)n * k * sizeof(float));
    float *y = malloc((size_t)m * n * sizeof(float));
    double *ref = malloc((size_t)m * n * sizeof(double));
    double *mag = malloc((size_t)m * n * sizeof(double));
    uint16_t *h = to16(w, (size_t)n * k, dt, wf);
    ig_ref_gemm(ref, mag, x, wf, NULL, m, n, k);
    /* BF16 uploaded for vdpbf16ps rounds x to BF16: its own bound. */
    int bf16x = dt == IG_DTYPE_BF16 && ig__cpu_bf16_dot();
    ig_weight_t W = upload16(be, h, dt, n, k);
    memset(y, 0xff, (size_t)m * n * sizeof(float)); /* NaN: every cell written */
    assert_int_equal(be->matmul(be, y, x, &W, NULL, m), 0);
    char what[160];
    snprintf(what, sizeof(what), "%s%s %s m=%d n=%d k=%d", label, bf16x ? "+bf16dot" : "",
             ig_dtype_name(dt), m, n, k);
    if (bf16x)
        ig_assert_within_bound(y, ref, mag, (size_t)m * n, ig_bf16x_units(k),
                               ig_bf16x_floor(k, 1.0), what);
    else
        ig_assert_within_bound(y, ref, mag, (size_t)m * n, k, ig_f32_floor(k), what);
    be->free_weight(be, &W);
    free(x), free(w), free(wf), free(y), free(ref), free(mag), free(h);
}

static void test_within_bound(void **state)
{
    ig_cpu_isa_t isas[3];
    int nisa = isa_list(isas);
    for (int t = 1; t <= 3; t += 2) {
        ig_backend_t *be;
        assert_int_equal(ig_backend_cpu_create(&be, t), 0);
        for (int i = 0; i < nisa; i++) {
            assert_int_equal(ig__cpu_set_isa(isas[i]), 0);
            for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
                for (int d = 0; d < 2; d++)
                    check_one(be, d ? IG_DTYPE_BF16 : IG_DTYPE_F16, shapes[s][0], shapes[s][1],
                              shapes[s][2], ig__cpu_isa_name(isas[i]));
        }
        be->destroy(be);
    }
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
}

/* The bound check fails a kernel that drops one term: it can fail. */
static void test_bound_catches_a_dropped_term(void **state)
{
    int k = 256;
    float *x = rand_buf(k), *w = rand_buf(k), wf[256];
    uint16_t *h = to16(w, k, IG_DTYPE_BF16, wf);
    double ref = 0, mag = 0, drop = 0;
    for (int i = 0; i < k; i++) {
        ref += (double)x[i] * wf[i];
        mag += fabs((double)x[i] * wf[i]);
        if (i != 100)
            drop += (double)x[i] * wf[i];
    }
    float got = (float)drop;
    size_t at;
    assert_true(ig_bound_worst(&got, &ref, &mag, 1, k, ig_f32_floor(k), &at) > 1.0);
    free(x), free(w), free(h);
}

/* The vdpbf16ps path (k-pair layout, x rounded to BF16) and its plain C
 * form: each within the bound against a double reference on the unrounded
 * x; a row gets the same bits alone, in any batch, any column split,
 * through the backend with 1 and 2 threads. */
static void test_bf16_dot(void **state)
{
    static const int sh[][3] = {{1, 1, 1},     {1, 7, 5},    {5, 33, 31},    {1, 288, 288},
                                {64, 100, 64}, {7, 96, 257}, {21, 101, 600}, {13, 47, 129}};
    for (size_t s = 0; s < sizeof(sh) / sizeof(sh[0]); s++) {
        int m = sh[s][0], n = sh[s][1], k = sh[s][2], kp = ig__gemm16p_kpad(k);
        float *x = rand_buf((size_t)m * k), *w = rand_buf((size_t)n * k);
        float *wf = malloc((size_t)n * k * sizeof(float));
        float *y = malloc((size_t)m * n * 4), *yc = malloc((size_t)m * n * 4);
        float *part = malloc((size_t)m * n * 4);
        double *ref = malloc((size_t)m * n * sizeof(double)), *mag = malloc((size_t)m * n * 8);
        uint16_t *h = to16(w, (size_t)n * k, IG_DTYPE_BF16, wf);
        uint16_t *wp = malloc(ig__gemm16p_packed_elems(n, k) * 2);
        uint16_t *xb = malloc((size_t)m * kp * 2);
        ig__gemm16p_pack(wp, h, n, k);
        ig__bf16_round_rows(xb, x, m, k);
        for (int r = 0; r < m; r++) /* the vector rounding is ig_f32_to_bf16's */
            for (int kk = 0; kk < k; kk++)
                assert_int_equal(xb[(size_t)r * kp + kk], ig_f32_to_bf16(x[(size_t)r * k + kk]));
        ig_ref_gemm(ref, mag, x, wf, NULL, m, n, k);
        char what[96];
        snprintf(what, sizeof(what), "bf16 dot m=%d n=%d k=%d", m, n, k);
        assert_int_equal(ig__cpu_set_isa(IG_CPU_ISA_SCALAR), 0);
        memset(yc, 0xff, (size_t)m * n * 4);
        ig__gemm16p(yc, n, xb, wp, m, k, n, 0, n);
        ig_assert_within_bound(yc, ref, mag, (size_t)m * n, ig_bf16x_units(k),
                               ig_bf16x_floor(k, 1.0), what);
        assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
        memset(y, 0xff, (size_t)m * n * 4);
        ig__gemm16p(y, n, xb, wp, m, k, n, 0, n);
        /* Held to the bound, not to the C form's bits: how vdpbf16ps sums
         * inside one instruction is the CPU's own and may differ between
         * vendors. */
        ig_assert_within_bound(y, ref, mag, (size_t)m * n, ig_bf16x_units(k),
                               ig_bf16x_floor(k, 1.0), what);
        for (int r = 0; r < m; r++) {
            ig__gemm16p(part, n, xb + (size_t)r * kp, wp, 1, k, n, 0, n);
            assert_memory_equal(part, y + (size_t)r * n, (size_t)n * 4);
        }
        for (int rows = 2; rows <= m; rows += 3) {
            ig__gemm16p(part, n, xb + (size_t)(m - rows) * kp, wp, rows, k, n, 0, n);
            assert_memory_equal(part, y + (size_t)(m - rows) * n, (size_t)rows * n * 4);
        }
        for (int p = 0; p * IG_GEMM16_NR < n; p++)
            ig__gemm16p(part, n, xb, wp, m, k, n, p * IG_GEMM16_NR,
                        (p + 1) * IG_GEMM16_NR < n ? (p + 1) * IG_GEMM16_NR : n);
        assert_memory_equal(part, y, (size_t)m * n * 4);
        /* an embedding row reads back exact */
        ig__gemm16p_unpack_row(part, wp, k, n - 1);
        assert_memory_equal(part, wf + (size_t)(n - 1) * k, (size_t)k * 4);
        /* Through the backend, with the path on whatever this CPU's
         * default (it may measure that the widening path is faster). */
        int was = ig__cpu_bf16_dot();
        if (ig__cpu_set_bf16_dot(1) == 0)
            for (int t = 1; t <= 2; t++) {
                ig_backend_t *be;
                assert_int_equal(ig_backend_cpu_create(&be, t), 0);
                ig_weight_t W = upload16(be, h, IG_DTYPE_BF16, n, k);
                assert_int_equal(be->matmul(be, part, x, &W, NULL, m), 0);
                assert_memory_equal(part, y, (size_t)m * n * 4);
                be->free_weight(be, &W);
                be->destroy(be);
            }
        assert_int_equal(ig__cpu_set_bf16_dot(was), 0);
        free(x), free(w), free(wf), free(y), free(yc), free(part), free(ref), free(mag);
        free(h), free(wp), free(xb);
    }
}

/* The default path follows the measured rates: vdpbf16ps only where it
 * does IG_CPU_BF16_DOT_GAIN times the FMA's work, never without the
 * instruction; IG_CPU_BF16_DOT forces it (then nothing is measured). */
static void test_bf16_dot_default_is_measured(void **state)
{
    (void)state;
    double dot, fma;
    ig__cpu_bf16_dot_rates(&dot, &fma);
    const char *env = getenv("IG_CPU_BF16_DOT");
    if (!ig__cpu_has_bf16_dot()) {
        assert_int_equal(ig__cpu_bf16_dot(), 0);
        assert_int_equal(ig__cpu_set_bf16_dot(1), IG_ENOTSUP);
        assert_true(dot == 0 && fma == 0);
    } else if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0)) {
        assert_int_equal(ig__cpu_bf16_dot(), env[0] == '1');
    } else {
        print_message("# vdpbf16ps %.1f vs FMA %.1f multiply-adds/ns: default %s\n", dot, fma,
                      ig__cpu_bf16_dot() ? "on" : "off");
        assert_true(dot > 0 && fma > 0);
        assert_int_equal(ig__cpu_bf16_dot(), dot >= IG_CPU_BF16_DOT_GAIN * fma);
    }
}

static void test_batch_invariant(void **state)
{
    int n = 3 * IG_GEMM16_NR + 5, k = 600, m = 21;
    ig_cpu_isa_t isas[3];
    int nisa = isa_list(isas);
    float *x = rand_buf((size_t)m * k), *w = rand_buf((size_t)n * k);
    float *wf = malloc((size_t)n * k * sizeof(float));
    float *all = malloc((size_t)m * n * sizeof(float)), *part = malloc((size_t)m * n * 4);
    float *first = malloc((size_t)m * n * sizeof(float));
    for (int d = 0; d < 2; d++) {
        ig_dtype_t dt = d ? IG_DTYPE_BF16 : IG_DTYPE_F16;
        uint16_t *h = to16(w, (size_t)n * k, dt, wf);
        uint16_t *wp = malloc(ig__gemm16_packed_elems(n, k) * 2);
        ig__gemm16_pack(wp, h, n, k);
        for (int i = 0; i < nisa; i++) {
            assert_int_equal(ig__cpu_set_isa(isas[i]), 0);
            ig__gemm16(all, n, x, wp, d, m, k, n, 0, n);
            /* every instruction set (and its tiles for few and many rows)
             * does the same operations per output */
            if (i == 0)
                memcpy(first, all, (size_t)m * n * sizeof(float));
            else
                assert_memory_equal(all, first, (size_t)m * n * sizeof(float));
            for (int r = 0; r < m; r++) {
                ig__gemm16(part, n, x + (size_t)r * k, wp, d, 1, k, n, 0, n);
                assert_memory_equal(part, all + (size_t)r * n, (size_t)n * sizeof(float));
            }
            for (int rows = 2; rows <= m; rows++) {
                ig__gemm16(part, n, x + (size_t)(m - rows) * k, wp, d, rows, k, n, 0, n);
                assert_memory_equal(part, all + (size_t)(m - rows) * n,
                                    (size_t)rows * n * sizeof(float));
            }
            for (int p = 0; p * IG_GEMM16_NR < n; p++)
                ig__gemm16(part, n, x, wp, d, m, k, n, p * IG_GEMM16_NR,
                           (p + 1) * IG_GEMM16_NR < n ? (p + 1) * IG_GEMM16_NR : n);
            assert_memory_equal(part, all, (size_t)m * n * sizeof(float));
            /* through the backend with 1 and 2 threads: the same bits (BF16
             * on vdpbf16ps has its own, test_bf16_dot) */
            for (int t = 1; t <= 2 && !(d && ig__cpu_bf16_dot()); t++) {
                ig_backend_t *be;
                assert_int_equal(ig_backend_cpu_create(&be, t), 0);
                ig_weight_t W = upload16(be, h, dt, n, k);
                assert_int_equal(be->matmul(be, part, x, &W, NULL, m), 0);
                assert_memory_equal(part, all, (size_t)m * n * sizeof(float));
                be->free_weight(be, &W);
                be->destroy(be);
            }
        }
        free(h), free(wp);
    }
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
    free(x), free(w), free(wf), free(all), free(part), free(first);
}

static void test_upload_keeps_dtype_and_embed(void **state)
{
    int n = 70, k = 40;
    float *w = rand_buf((size_t)n * k), *wf = malloc((size_t)n * k * sizeof(float));
    float row[40];
    for (int d = 0; d < 2; d++) {
        ig_dtype_t dt = d ? IG_DTYPE_BF16 : IG_DTYPE_F16;
        uint16_t *h = to16(w, (size_t)n * k, dt, wf);
        ig_backend_t *be;
        assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
        ig_weight_t W = upload16(be, h, dt, n, k);
        for (int id = 0; id < n; id++) {
            assert_int_equal(be->embed(be, row, &W, &id, 1), 0);
            assert_memory_equal(row, wf + (size_t)id * k, sizeof(row));
        }
        be->free_weight(be, &W);
        /* the old behaviour on request: widened to F32 at upload */
        setenv("IG_CPU_WEIGHTS", "f32", 1);
        ig_tensor_t t = {dt, h, 2, {n, k}};
        assert_int_equal(be->upload_weight(be, &t, &W), 0);
        unsetenv("IG_CPU_WEIGHTS");
        assert_int_equal(W.dtype, IG_DTYPE_F32);
        int id = 17;
        assert_int_equal(be->embed(be, row, &W, &id, 1), 0);
        assert_memory_equal(row, wf + (size_t)id * k, sizeof(row));
        be->free_weight(be, &W);
        be->destroy(be);
        free(h);
    }
    free(w), free(wf);
}

/* Kilobytes of the mapping at map that this process holds (its Rss line in
 * /proc/self/smaps): what counts towards the worker's RSS. */
static long mapping_rss_kb(void *map)
{
    char line[256];
    long kb = -1;
    int in = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)map >= lo && (uintptr_t)map < hi;
            continue;
        }
        if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
            break;
    }
    fclose(f);
    return kb;
}

static void test_upload_releases_mapped_pages(void **state)
{
#ifndef MADV_PAGEOUT
    skip();
#else
    int n = 1024, k = 2048; /* 4 MiB of BF16 */
    size_t bytes = (size_t)n * k * 2;
    char path[] = "/tmp/ig_gemm16_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    uint16_t *h = malloc(bytes);
    for (size_t i = 0; i < (size_t)n * k; i++)
        h[i] = ig_f32_to_bf16(ig_xs_float(&rng));
    assert_int_equal(write(fd, h, bytes), (ssize_t)bytes);
    assert_int_equal(fsync(fd), 0); /* clean pages: a dirty one cannot be dropped */
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(map != MAP_FAILED);
    volatile unsigned sum = 0;
    for (size_t i = 0; i < bytes; i += 4096)
        sum += ((const unsigned char *)map)[i]; /* all resident first */
    long before = mapping_rss_kb(map);
    assert_true(before >= (long)(bytes / 1024) * 9 / 10);
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
    ig_weight_t W = upload16(be, map, IG_DTYPE_BF16, n, k);
    long after = mapping_rss_kb(map);
    print_message("# the mapping's RSS: %ld kB before upload, %ld kB after\n", before, after);
    assert_true(after >= 0 && after <= (long)(bytes / 1024) / 10);
    /* and the weight is right: row 5 */
    float row[2048];
    int id = 5;
    assert_int_equal(be->embed(be, row, &W, &id, 1), 0);
    for (int i = 0; i < k; i++)
        assert_true(row[i] == ig_bf16_to_f32(h[(size_t)5 * k + i]));
    be->free_weight(be, &W);
    be->destroy(be);
    munmap(map, bytes);
    close(fd);
    free(h);
#endif
}

int main(void)
{
    printf("# dispatched kernels: best %s\n", ig__cpu_isa_name(ig__cpu_isa_max()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_within_bound),
        cmocka_unit_test(test_bound_catches_a_dropped_term),
        cmocka_unit_test(test_batch_invariant),
        cmocka_unit_test(test_bf16_dot),
        cmocka_unit_test(test_bf16_dot_default_is_measured),
        cmocka_unit_test(test_upload_keeps_dtype_and_embed),
        cmocka_unit_test(test_upload_releases_mapped_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
