/*
 * The log-linear histogram of igbench (bench/igbench/hdr.c): buckets tile
 * the range without gaps, each is at most 1/1024 of its value wide, and
 * quantiles of known data come out within that precision. The p50's
 * batch-means interval holds the true median about 95% of the time, for
 * independent values and for values that come in correlated runs.
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

static uint64_t rng_state;

static double uniform(void) /* splitmix64, [0, 1) */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

#define SEQS 200 /* sequences per coverage test */
#define SEQ_N 10000

/* Of SEQS sequences drawn by draw(), how many intervals hold truth (µs);
 * the mean half-widths of the batch-means interval and of the order
 * statistics' as if independent (n/2 -+ 0.98 sqrt(n)) go to *half, *half_iid. */
static int coverage(double (*draw)(int i), double truth, double *half, double *half_iid)
{
    int held = 0;
    *half = *half_iid = 0;
    for (int s = 0; s < SEQS; s++) {
        igb_hdr_t h;
        assert_int_equal(igb_hdr_init(&h), 0);
        igb_hdr_keep_order(&h);
        for (int i = 0; i < SEQ_N; i++)
            igb_hdr_record(&h, (uint64_t)llround(draw(i)));
        double lo, hi;
        assert_int_equal(igb_hdr_p50_interval(&h, &lo, &hi), 0);
        held += lo <= truth && truth <= hi;
        *half += (hi - lo) / 2 / SEQS;
        double z = 0.98 / sqrt((double)SEQ_N);
        *half_iid += (igb_hdr_quantile(&h, 0.5 + z) - igb_hdr_quantile(&h, 0.5 - z)) / 2 / SEQS;
        igb_hdr_dispose(&h);
    }
    return held;
}

static double draw_exponential(int i)
{
    (void)i;
    return -100000.0 * log(1.0 - uniform()); /* mean 100 ms: median 100 ln 2 ms */
}

/* Runs of 100 alike values (a busy period): each run's level uniform in
 * [1, 2] s, each value within 50 ms of it. The marginal is symmetric about
 * 1.5 s, so that is the median. */
static double level;
static double draw_runs(int i)
{
    if (i % 100 == 0)
        level = 1e6 + 1e6 * uniform();
    return level + 1e5 * (uniform() - 0.5);
}

/* 200 intervals that each hold the truth with probability 0.95 hold it
 * 190 times, with a standard deviation of 3: 176 is 4.5 below. */
static void test_p50_interval_independent(void **state)
{
    rng_state = 1;
    double half, half_iid;
    int held = coverage(draw_exponential, 100000.0 * log(2.0), &half, &half_iid);
    print_message("  independent: %d of %d held; half-width %.0f µs, order statistics' %.0f\n",
                  held, SEQS, half, half_iid);
    assert_true(held >= 176 && held <= SEQS - 1);
    /* Independent values: both intervals measure the same spread. */
    assert_true(half > 0.7 * half_iid && half < 1.6 * half_iid);
}

static void test_p50_interval_correlated(void **state)
{
    rng_state = 2;
    double half, half_iid;
    int held = coverage(draw_runs, 1.5e6, &half, &half_iid);
    print_message("  in runs: %d of %d held; half-width %.0f µs, order statistics' %.0f\n", held,
                  SEQS, half, half_iid);
    assert_true(held >= 176 && held <= SEQS - 1);
    /* The runs make the order statistics' interval far too narrow. */
    assert_true(half > 3 * half_iid);
}

static void test_p50_interval_absent(void **state)
{
    igb_hdr_t h;
    double lo, hi;
    assert_int_equal(igb_hdr_init(&h), 0);
    for (int i = 0; i < 1000; i++)
        igb_hdr_record(&h, 1000 + (uint64_t)i);
    assert_int_equal(igb_hdr_p50_interval(&h, &lo, &hi), -1); /* order not kept */
    igb_hdr_keep_order(&h);
    igb_hdr_record(&h, 5);
    assert_int_equal(igb_hdr_p50_interval(&h, &lo, &hi), -1); /* kept from the middle */
    igb_hdr_dispose(&h);

    assert_int_equal(igb_hdr_init(&h), 0);
    igb_hdr_keep_order(&h);
    for (int i = 0; i < IGB_HDR_BATCHES * IGB_HDR_BATCH_MIN - 1; i++)
        igb_hdr_record(&h, 1000 + (uint64_t)i);
    assert_int_equal(igb_hdr_p50_interval(&h, &lo, &hi), -1); /* too few */
    igb_hdr_record(&h, 1000);
    assert_int_equal(igb_hdr_p50_interval(&h, &lo, &hi), 0);
    assert_true(lo <= igb_hdr_quantile(&h, 0.5) && igb_hdr_quantile(&h, 0.5) <= hi);
    igb_hdr_dispose(&h);

    /* A queue that grows: latency doubling every 60 answers, the batches'
     * p50s from 1.8 ms to 57 s. The interval is wide, within the values seen. */
    assert_int_equal(igb_hdr_init(&h), 0);
    igb_hdr_keep_order(&h);
    for (int i = 0; i < 1000; i++)
        igb_hdr_record(&h, (uint64_t)(1000 * exp2(i / 60.0)));
    assert_int_equal(igb_hdr_p50_interval(&h, &lo, &hi), 0);
    assert_true(lo == 1000.0 && hi > 2 * igb_hdr_quantile(&h, 0.5) && hi <= (double)h.max);
    igb_hdr_dispose(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_tile_the_range),
        cmocka_unit_test(test_quantiles_of_uniform_data),
        cmocka_unit_test(test_bimodal_and_extremes),
        cmocka_unit_test(test_p50_interval_independent),
        cmocka_unit_test(test_p50_interval_correlated),
        cmocka_unit_test(test_p50_interval_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
