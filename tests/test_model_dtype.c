/* dtype.h: names, sizes, and the F16/BF16 <-> F32 conversions (exhaustive
 * round trips, round-to-nearest-even at the edges, unaligned bulk buffers). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "infergate/dtype.h"
#include "infergate/error.h"

static float f32_of(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void test_names_and_sizes(void **state)
{
    (void)state;
    ig_dtype_t d;
    assert_int_equal(ig_dtype_size(IG_DTYPE_F32), 4);
    assert_int_equal(ig_dtype_size(IG_DTYPE_F16), 2);
    assert_int_equal(ig_dtype_size(IG_DTYPE_BF16), 2);
    assert_string_equal(ig_dtype_name(IG_DTYPE_BF16), "BF16");
    assert_int_equal(ig_dtype_parse("F16", &d), 0);
    assert_int_equal(d, IG_DTYPE_F16);
    assert_int_equal(ig_dtype_parse("I8", &d), IG_ENOTSUP);
    assert_int_equal(ig_dtype_parse("F64", &d), IG_ENOTSUP);
    assert_int_equal(ig_dtype_parse("f32", &d), IG_ENOTSUP);
    assert_int_equal(ig_dtype_parse_user("bf16", &d), 0);
    assert_int_equal(d, IG_DTYPE_BF16);
    assert_int_equal(ig_dtype_parse_user("bfloat16", &d), 0);
    assert_int_equal(ig_dtype_parse_user("float64", &d), IG_EINVAL);
}

/* Every F16 bit pattern survives F16 -> F32 -> F16 (NaNs stay NaN). */
static void test_f16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ig_f16_to_f32((uint16_t)h);
        uint16_t back = ig_f32_to_f16(f);
        int is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
        if (is_nan) {
            assert_true(isnan(f));
            assert_true((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0);
        } else {
            assert_int_equal(back, h);
        }
    }
    assert_true(ig_f16_to_f32(0x3c00) == 1.0f);
    assert_true(ig_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(ig_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(isinf(ig_f16_to_f32(0xfc00)) && ig_f16_to_f32(0xfc00) < 0);
}

static void test_f16_rounding(void **state)
{
    (void)state;
    assert_int_equal(ig_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ig_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(ig_f32_to_f16(65520.0f), 0x7c00); /* the tie goes to even: infinity */
    assert_int_equal(ig_f32_to_f16(1e30f), 0x7c00);
    assert_int_equal(ig_f32_to_f16(-1e30f), 0xfc00);
    assert_int_equal(ig_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);     /* tie, even below */
    assert_int_equal(ig_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02); /* tie, even above */
    assert_int_equal(ig_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)), 0x3c01);
    assert_int_equal(ig_f32_to_f16(ldexpf(1, -14)), 0x0400); /* smallest normal */
    assert_int_equal(ig_f32_to_f16(ldexpf(1, -24)), 0x0001); /* smallest subnormal */
    assert_int_equal(ig_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie to even zero */
    assert_int_equal(ig_f32_to_f16(ldexpf(3, -26)), 0x0001); /* above the tie */
    assert_int_equal(ig_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp: tie to even 2 */
    assert_int_equal(ig_f32_to_f16(ldexpf(1023, -24)), 0x03ff);
    assert_int_equal(ig_f32_to_f16(ldexpf(2047, -25)), 0x0400); /* rounds up into normal */
    assert_int_equal(ig_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(ig_f32_to_f16(INFINITY), 0x7c00);
    uint16_t n = ig_f32_to_f16(NAN);
    assert_true((n & 0x7c00u) == 0x7c00u && (n & 0x3ffu) != 0);
}

/* For many finite floats, the chosen F16 is a nearest one, ties to even. */
static void test_f16_nearest(void **state)
{
    (void)state;
    uint64_t s = 12345;
    for (int i = 0; i < 400000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        /* exponents from 2^-27 to 2^16, any mantissa, either sign */
        uint32_t bits = (uint32_t)(s >> 32);
        uint32_t exp = 100u + (uint32_t)((s >> 20) % 44u);
        bits = (bits & 0x807fffffu) | (exp << 23);
        float x = f32_of(bits);
        uint16_t h = ig_f32_to_f16(x);
        double got = ig_f16_to_f32(h);
        if (isinf(got)) {
            assert_true(fabs((double)x) >= 65520.0);
            continue;
        }
        double err = fabs(got - (double)x);
        /* the neighbours on both sides of h, same sign */
        for (int d = -1; d <= 1; d += 2) {
            uint16_t nb = (uint16_t)(h + d);
            if ((h & 0x7fffu) == 0 && d < 0)
                continue;
            double other = ig_f16_to_f32(nb);
            if (isinf(other) || isnan(other))
                continue;
            double oerr = fabs(other - (double)x);
            assert_true(err <= oerr);
            if (err == oerr)
                assert_int_equal(h & 1u, 0);
        }
    }
}

static void test_bf16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ig_bf16_to_f32((uint16_t)h);
        uint16_t back = ig_f32_to_bf16(f);
        if (isnan(f))
            assert_true(isnan(ig_bf16_to_f32(back)));
        else
            assert_int_equal(back, h);
    }
    assert_int_equal(ig_f32_to_bf16(f32_of(0x3f808000u)), 0x3f80); /* tie, even below */
    assert_int_equal(ig_f32_to_bf16(f32_of(0x3f818000u)), 0x3f82); /* tie, even above */
    assert_int_equal(ig_f32_to_bf16(f32_of(0x3f808001u)), 0x3f81);
    assert_int_equal(ig_f32_to_bf16(f32_of(0x7f7fffffu)), 0x7f80); /* rounds to infinity */
    assert_true(isnan(ig_bf16_to_f32(ig_f32_to_bf16(f32_of(0x7f800001u))))); /* stays NaN */
    assert_true(ig_bf16_to_f32(ig_f32_to_bf16(0.02f)) - 0.02f < 0.02f / 128);
}

/* Bulk conversions read and write unaligned buffers and agree with the scalar ones. */
static void test_bulk_unaligned(void **state)
{
    (void)state;
    enum { N = 1000 };
    static float src[N], back[N + 1];
    static unsigned char raw[4 * N + 1];
    for (int i = 0; i < N; i++)
        src[i] = (float)(i - 500) * 0.37f;
    for (int d = IG_DTYPE_F32; d <= IG_DTYPE_BF16; d++) {
        ig_dtype_from_f32(raw + 1, (ig_dtype_t)d, src, N);
        ig_dtype_to_f32(back + 1, raw + 1, (ig_dtype_t)d, N);
        for (int i = 0; i < N; i++) {
            float want = d == IG_DTYPE_F32   ? src[i]
                         : d == IG_DTYPE_F16 ? ig_f16_to_f32(ig_f32_to_f16(src[i]))
                                             : ig_bf16_to_f32(ig_f32_to_bf16(src[i]));
            assert_true(back[i + 1] == want);
            /* and within the format's unit roundoff (round to nearest, normal
             * range: 2^-11 for f16's 11-bit significand, 2^-8 for bf16's 8) */
            float tol = d == IG_DTYPE_F32 ? 0 : d == IG_DTYPE_F16 ? 0x1p-11f : 0x1p-8f;
            assert_true(fabsf(back[i + 1] - src[i]) <= fabsf(src[i]) * tol);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_sizes),
        cmocka_unit_test(test_f16_roundtrip_exhaustive),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_f16_nearest),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_bulk_unaligned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
