/*
 * The log-linear histogram of igbench (bench/igbench/hdr.c): buckets tile
 * the range without gaps, each is at most 1/1024 of its value wide, and
 * quantiles of known data come out within that precision.
 */
#include "../bench/igbench/hdr.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>

static void test_buckets_tile_the_range(void **state)
{
    uint64_t prev_hi = 0;
    int last = igb_hdr_index(IGB_HDR_MAX_US);
    for (int i = 0; i <= last; i++) {
        uint64_t lo, hi;
        igb_hdr_range(i, &lo, &hi);
        assert_true(lo == prev_hi);
        assert_true(hi > lo);
        /* Relative width: exact below 2,048 µs, <= 1/1024 above. */
        if (lo < 2048)
            assert_true(hi - lo == 1);
        else
            assert_true((double)(hi - lo) / (double)lo <= 1.0 / 1024 + 1e-12);
        assert_int_equal(igb_hdr_index(lo), i);
        assert_int_equal(igb_hdr_index(hi - 1), i);
        prev_hi = hi;
    }
    assert_true(prev_hi > IGB_HDR_MAX_US);
}

static void test_quantiles_of_uniform_data(void **state)
{
    igb_hdr_t h;
    assert_int_equal(igb_hdr_init(&h), 0);
    /* 1..100000 µs, once each: the q-quantile is q * 100000. */
    for (uint64_t v = 1; v <= 100000; v++)
        igb_hdr_record(&h, v);
    const double qs[] = {0.5, 0.9, 0.99, 0.999};
    for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
        double got = igb_hdr_quantile(&h, qs[i]), truth = qs[i] * 100000;
        /* The bucket's middle: within half a bucket (1/2048), and one
         * value for the rank's rounding. */
        assert_true(fabs(got - truth) <= truth / 2048 + 1);
    }
    assert_true(igb_hdr_quantile(&h, 1.0) == 100000.0);
    assert_true(h.min == 1);
    assert_true(fabs(igb_hdr_mean(&h) - 50000.5) < 1e-6);
    igb_hdr_dispose(&h);
}

static void test_bimodal_and_extremes(void **state)
{
    igb_hdr_t h;
    assert_int_equal(igb_hdr_init(&h), 0);
    assert_true(igb_hdr_quantile(&h, 0.5) == 0.0); /* empty */
    for (int i = 0; i < 600; i++)
        igb_hdr_record(&h, 10000); /* 10 ms */
    for (int i = 0; i < 400; i++)
        igb_hdr_record(&h, 40000); /* 40 ms */
    assert_true(fabs(igb_hdr_quantile(&h, 0.5) - 10000) <= 10000 / 2048.0);
    assert_true(fabs(igb_hdr_quantile(&h, 0.6) - 10000) <= 10000 / 2048.0);
    assert_true(fabs(igb_hdr_quantile(&h, 0.601) - 40000) <= 40000 / 2048.0);
    assert_true(fabs(igb_hdr_quantile(&h, 0.99) - 40000) <= 40000 / 2048.0);
    /* A value past 100 s is clamped in the buckets but kept as the max. */
    igb_hdr_record(&h, 500000000ull);
    assert_true(igb_hdr_quantile(&h, 1.0) == 500000000.0);
    assert_true(igb_hdr_quantile(&h, 0.9999) <= (double)IGB_HDR_MAX_US * 1.01);
    igb_hdr_dispose(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_tile_the_range),
        cmocka_unit_test(test_quantiles_of_uniform_data),
        cmocka_unit_test(test_bimodal_and_extremes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
