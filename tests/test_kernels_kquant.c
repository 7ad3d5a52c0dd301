/*
 * Q4_K and Q6_K weights on the CPU backend: upload_weight dequantizes them
 * (dtype.c, ggml's values: test_gguf_quants_ggufpy) into the F32 panels,
 * so
 *   - the GEMM is within the F32 bound (k products and sums, any order:
 *     tests/support/fp_bound.h) of a double reference on the dequantized
 *     weights;
 *   - embed gives a row's dequantized values, bit for bit;
 *   - rows that are not whole super-blocks of 256 and vectors are refused.
 * Super-blocks are random bytes with finite F16 scales: every byte pattern
 * is a valid block of these formats.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "infergate/dtype.h"
#include "infergate/error.h"
#include "infergate/kernels.h"

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

static void check(ig_backend_t *be, ig_dtype_t dt, int m, int n, int k)
{
    unsigned char *wq = rand_blocks(dt, n, k);
    float *w = malloc((size_t)n * k * sizeof(float)), *x = ig_xs_buf(&rng, (size_t)m * k, 1.0f);
    ig_dtype_to_f32(w, wq, dt, (size_t)n * k);
    double *ref = malloc((size_t)m * n * sizeof(double)), *mag = malloc((size_t)m * n * 8);
    ig_ref_gemm(ref, mag, x, w, NULL, m, n, k);
    ig_tensor_t t = {dt, wq, 2, {n, k}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &t, &W), 0);
    float *y = malloc((size_t)m * n * sizeof(float));
    assert_int_equal(be->matmul(be, y, x, &W, NULL, m), 0);
    char what[96];
    snprintf(what, sizeof(what), "%s m=%d n=%d k=%d", ig_dtype_name(dt), m, n, k);
    ig_assert_within_bound(y, ref, mag, (size_t)m * n, k, ig_f32_floor(k), what);
    float *row = malloc((size_t)k * sizeof(float));
    int id = n - 1;
    assert_int_equal(be->embed(be, row, &W, &id, 1), 0);
    assert_memory_equal(row, w + (size_t)id * k, (size_t)k * sizeof(float));
    be->free_weight(be, &W);
    free(wq), free(w), free(x), free(ref), free(mag), free(y), free(row);
}

static void test_within_bounds(void **state)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 2), 0);
    static const int shapes[][3] = {{1, 3, 256}, {5, 40, 512}, {17, 33, 768}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        check(be, IG_DTYPE_Q4_K, shapes[s][0], shapes[s][1], shapes[s][2]);
        check(be, IG_DTYPE_Q6_K, shapes[s][0], shapes[s][1], shapes[s][2]);
    }
    be->destroy(be);
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
        cmocka_unit_test(test_within_bounds),
        cmocka_unit_test(test_rejects_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
