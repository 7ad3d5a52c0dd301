/*
 * Q8_0 weights on the CPU backend (kernels/cpu/gemmq.c, dtype.c):
 *   - the layout is GGUF's, byte for byte, on a hand-made block; quantizing
 *     puts every weight within d / 2 (+ the F16 rounding of d) of its value;
 *   - the GEMM, on every instruction set this CPU runs, is within the float
 *     error bound of a double reference on the dequantized weights and the
 *     dequantized activations (the integer block sums are exact; what rounds
 *     is the scale product, the conversion and nb block additions);
 *   - against the exact F32 product the error stays within the quantization
 *     bound sum |x| |w - w_q| + |w_q| |x - x_q| (plus that float bound);
 *   - a row gets the same bits alone, in a batch, on any column split and
 *     thread count, and on every instruction set; embed dequantizes;
 *   - the panel layout holds the file's bytes and every weight and scale;
 *   - quantizing x gives the same bytes, scales and block sums on every
 *     instruction set, halves (x / d = k + 0.5) rounded away from zero.
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

static uint64_t rng = 0x2545f4914f6cdd1dull;

static void test_layout_is_ggufs(void **state)
{
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16) / 4.0f; /* amax 4 at i = 0: d = 4 / 127 */
    unsigned char blk[IG_Q8_0_BYTES];
    ig_dtype_from_f32(blk, IG_DTYPE_Q8_0, x, 32);
    uint16_t d;
    memcpy(&d, blk, 2);
    assert_int_equal(d, ig_f32_to_f16(4.0f / 127.0f));
    assert_int_equal((int8_t)blk[2], -127);     /* -4 */
    assert_int_equal((int8_t)blk[2 + 16], 0);   /* 0 */
    assert_int_equal((int8_t)blk[2 + 18], 16);  /* round(0.5 * 127 / 4) */
    assert_int_equal((int8_t)blk[2 + 31], 119); /* round(3.75 * 127 / 4) */
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q8_0, 64), 68);
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q8_0, 33), 0);
    assert_string_equal(ig_dtype_name(IG_DTYPE_Q8_0), "Q8_0");
    /* round trip: within d / 2 + |q| * (F16 rounding of d) */
    ig_tq_check_round_trip32(IG_DTYPE_Q8_0, &rng, 127, 0.5);
}

/* y = x W^T through the backend for W(n, k) quantized; checks both bounds. */
static void check_one(ig_backend_t *be, int m, int n, int k, const char *label)
{
    ig_tq_check_blocks32(be, IG_DTYPE_Q8_0, &rng, m, n, k, label);
}

static void test_within_bounds_every_isa(void **state)
{
    static const int shapes[][3] = {{1, 1, 32},     {1, 7, 64},    {3, 33, 96},  {8, 100, 288},
                                    {17, 65, 1024}, {64, 40, 256}, {2, 300, 32}, {5, 17, 544}};
    ig_tq_every_isa(shapes, (int)(sizeof(shapes) / sizeof(shapes[0])), check_one);
}

static void test_batch_invariant(void **state)
{
    ig_tq_batch_invariant_random(IG_DTYPE_Q8_0, &rng, 19, 77,
                                 672); /* 21 blocks: a chunk of 16 and a short one */
}

static void test_panels_same_bytes(void **state)
{
    ig_tq_check_panels32(IG_DTYPE_Q8_0, &rng);
}

static void test_quantize_same_every_isa(void **state)
{
    int m = 3, k = 256, nb = k / 32;
    float *x = ig_xs_buf(&rng, (size_t)m * k, 1.0f);
    /* Block 1 of row 0: amax 127 gives d = 1, so these are exact halves. */
    for (int i = 0; i < 32; i++)
        x[32 + i] = i == 0 ? 127.0f : (float)(i - 16) + (i % 2 ? 0.5f : -0.5f);
    for (int i = 0; i < 32; i++)
        x[64 + i] = 0.0f; /* a block of zeros: d = 0 */
    int8_t q0[768], q1[768];
    float d0[24], d1[24];
    int32_t s0[24], s1[24];
    assert_int_equal(ig__cpu_set_isa(IG_CPU_ISA_SCALAR), 0);
    ig__q8_quantize_rows_sums(q0, d0, s0, x, m, k);
    for (int b = 0; b < m * nb; b++) {
        int32_t sum = 0;
        for (int i = 0; i < 32; i++)
            sum += q0[b * 32 + i];
        assert_int_equal(sum, s0[b]);
    }
    assert_int_equal(q0[32 + 1], -15); /* -14.5 */
    assert_int_equal(q0[32 + 2], -15); /* -14.5 */
    assert_int_equal(q0[32 + 17], 2);  /* 1.5 */
    assert_int_equal(q0[32 + 16], -1); /* -0.5 */
    for (int i = IG_CPU_ISA_SCALAR + 1; i <= (int)ig__cpu_isa_max(); i++) {
        assert_int_equal(ig__cpu_set_isa((ig_cpu_isa_t)i), 0);
        ig__q8_quantize_rows_sums(q1, d1, s1, x, m, k);
        assert_memory_equal(q0, q1, (size_t)m * k);
        assert_memory_equal(d0, d1, sizeof(float) * (size_t)(m * nb));
        assert_memory_equal(s0, s1, sizeof(int32_t) * (size_t)(m * nb));
    }
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
    free(x);
}

static void test_rejects_bad_shapes(void **state)
{
    ig_tq_check_bad_shapes(IG_DTYPE_Q8_0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_is_ggufs),    cmocka_unit_test(test_within_bounds_every_isa),
        cmocka_unit_test(test_batch_invariant),    cmocka_unit_test(test_quantize_same_every_isa),
        cmocka_unit_test(test_rejects_bad_shapes), cmocka_unit_test(test_panels_same_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
