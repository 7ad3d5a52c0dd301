/*
 * Q4_0 weights on the CPU backend (kernels/cpu/gemmq.c, dtype.c):
 *   - the layout is GGUF's, byte for byte, on a hand-made block (low
 *     nibbles weights 0..15, high nibbles 16..31, value (q - 8) d, d = m / -8
 *     for m the weight of largest magnitude), and quantizing puts every
 *     weight within |d| (the clamp of the side opposite m) plus the F16
 *     rounding of d (8 units of q at 2^-11 |d|) of its value;
 *   - the GEMM, on every instruction set this CPU runs, is within the float
 *     error bound of a double reference on the dequantized weights and the
 *     dequantized activations (the integer block sums are exact; what rounds
 *     is the scale product, the conversion, the fma and nb block additions:
 *     nb + 3 roundings);
 *   - against the exact F32 product the error stays within the quantization
 *     bound sum |x| |w - w_q| + |w_q| |x - x_q| (plus that float bound),
 *     which holds for any format: it is the product's error written out;
 *   - a row gets the same bits alone, in a batch, on any column split and
 *     thread count, and on every instruction set; embed dequantizes;
 *   - the panel layout holds the file's bytes and every weight and scale.
 * The shapes cross the AVX-512 tiles' cases (1 to 4 rows, 1 to 4 panels, a
 * short last panel) and the AVX2 tile's (odd row counts).
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

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void test_layout_is_ggufs(void **state)
{
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16); /* m = -16 at i = 0: d = 2 */
    unsigned char blk[IG_Q4_0_BYTES];
    ig_dtype_from_f32(blk, IG_DTYPE_Q4_0, x, 32);
    uint16_t d;
    memcpy(&d, blk, 2);
    assert_int_equal(d, ig_f32_to_f16(2.0f));
    assert_int_equal(blk[2] & 15, 0);       /* -16 / 2 + 8 */
    assert_int_equal(blk[2] >> 4, 8);       /* weight 16: 0 */
    assert_int_equal(blk[2 + 15] & 15, 8);  /* weight 15: -1 / 2 + 8.5 = 8 */
    assert_int_equal(blk[2 + 15] >> 4, 15); /* weight 31: 15 / 2 + 8.5 = 16, clamped */
    assert_int_equal(blk[2 + 1] & 15, 1);   /* -15 / 2 + 8.5 = 1 */
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q4_0, 64), 36);
    assert_int_equal(ig_dtype_bytes(IG_DTYPE_Q4_0, 33), 0);
    assert_int_equal(ig_dtype_block(IG_DTYPE_Q4_0), 32);
    assert_string_equal(ig_dtype_name(IG_DTYPE_Q4_0), "Q4_0");
    /* a hand-made block read back: (q - 8) d, low nibbles first */
    unsigned char h[IG_Q4_0_BYTES];
    uint16_t half = ig_f32_to_f16(0.5f);
    memcpy(h, &half, 2);
    for (int j = 0; j < 16; j++)
        h[2 + j] = (unsigned char)(j | (15 - j) << 4);
    float back[32];
    ig_dtype_to_f32(back, h, IG_DTYPE_Q4_0, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(back[j] == 0.5f * (float)(j - 8));
        assert_true(back[16 + j] == 0.5f * (float)(7 - j));
    }
    /* round trip: within |d| + 8 |d| 2^-11 */
    ig_tq_check_round_trip32(IG_DTYPE_Q4_0, &rng, 8, 1);
}

/* y = x W^T through the backend for W(n, k) quantized; checks both bounds. */
static void check_one(ig_backend_t *be, int m, int n, int k, const char *label)
{
    ig_tq_check_blocks32(be, IG_DTYPE_Q4_0, &rng, m, n, k, label);
}

static void test_within_bounds_every_isa(void **state)
{
    static const int shapes[][3] = {{1, 1, 32},     {1, 7, 64},    {3, 33, 96},   {8, 100, 288},
                                    {17, 65, 1024}, {64, 40, 256}, {2, 300, 32},  {5, 17, 544},
                                    {1, 100, 128},  {4, 64, 64},   {6, 50, 2048}, {1, 49, 96}};
    ig_tq_every_isa(shapes, (int)(sizeof(shapes) / sizeof(shapes[0])), check_one);
}

static void test_batch_invariant(void **state)
{
    ig_tq_batch_invariant_random(IG_DTYPE_Q4_0, &rng, 19, 77,
                                 672); /* 5 panels, the last short; 4 rows, then 3 */
}

static void test_panels_same_bytes(void **state)
{
    ig_tq_check_panels32(IG_DTYPE_Q4_0, &rng);
}

static void test_rejects_bad_shapes(void **state)
{
    ig_tq_check_bad_shapes(IG_DTYPE_Q4_0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_is_ggufs),   cmocka_unit_test(test_within_bounds_every_isa),
        cmocka_unit_test(test_batch_invariant),   cmocka_unit_test(test_rejects_bad_shapes),
        cmocka_unit_test(test_panels_same_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
