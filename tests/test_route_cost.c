/*
 * The cost formulas (gateway/route/cost.c) against values computed by hand:
 * an answer per token and per hour, unpriced answers, the meter's cost per
 * 1M generated tokens, its idle capacity (with a busy share that spans a
 * tick carried to the next), the window and the spend rate; the cost
 * objective's pick, its p99 TTFT bound and which explorations it keeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "infergate/cost.h"

#define S 1000000000ULL /* ns per second */

/* Equal to within a few ulps of the larger: the formulas are a handful of
 * floating-point operations on exact inputs. */
static void near(double got, double want)
{
    double tol = 8 * 2.2e-16 * fmax(fabs(got), fabs(want));
    if (!(fabs(got - want) <= tol))
        print_error("got %.17g, want %.17g\n", got, want);
    assert_true(fabs(got - want) <= tol);
}

static void test_answer(void **state)
{
    (void)state;
    ig_price_t tok = {IG_PRICE_PER_TOKEN, 0, 0.5, 1.5};
    /* 1000 prompt tokens at $0.50/M and 200 generated at $1.50/M */
    near(ig_cost_answer(&tok, 1000, 200, 9.0, 4), 0.0005 + 0.0003);
    near(ig_cost_answer(&tok, -1, 200, 0, 1), 0.0003); /* unknown prompt: 0 */
    ig_price_t hour = {IG_PRICE_PER_HOUR, 3.6, 0, 0};
    /* 2 s of a 4-wide instance at $3.60/h = $0.001/s: half a second's worth */
    near(ig_cost_answer(&hour, 1000, 200, 2.0, 4), 0.0005);
    near(ig_cost_answer(&hour, 0, 0, 2.0, 0.5), 0.002); /* C < 1 counts as 1 */
    ig_price_t none = {IG_PRICE_NONE, 0, 0, 0};
    assert_true(isnan(ig_cost_answer(&none, 10, 10, 1, 1)));
}

static void test_meter_idle_and_per_1m(void **state)
{
    (void)state;
    ig_price_t hour = {IG_PRICE_PER_HOUR, 3.6, 0, 0}; /* $0.001 a second */
    ig_cost_meter_t m;
    memset(&m, 0, sizeof(m));
    uint64_t t0 = 1000 * 60 * S; /* minute 1000 */
    assert_true(ig_cost_meter_idle(&m, &hour, t0) == 0); /* the first tick starts the clock */
    ig_cost_meter_answer(&m, 0.0004, 100, t0 + 1 * S);
    /* 2 s paid ($0.002), $0.0004 of it charged: $0.0016 idle */
    near(ig_cost_meter_idle(&m, &hour, t0 + 2 * S), 0.0016);
    /* an answer that held more than the tick's time: the excess carries */
    ig_cost_meter_answer(&m, 0.003, 300, t0 + 3 * S);
    assert_true(ig_cost_meter_idle(&m, &hour, t0 + 4 * S) == 0); /* 0.002 paid, 0.003 charged */
    near(ig_cost_meter_idle(&m, &hour, t0 + 6 * S), 0.001); /* 0.002 paid, 0.001 carried */
    /* spend in the window: 0.0004 + 0.0016 + 0.003 + 0.001 = 0.006 for 400 tokens */
    near(ig_cost_meter_per_1m(&m, t0 + 6 * S), 0.006 / 400 * 1e6);
    near(ig_cost_meter_rate(&m, t0 + 6 * S), 0.006 / (IG_COST_MINUTES / 60.0));
    /* five minutes on, the window has forgotten it */
    assert_true(isnan(ig_cost_meter_per_1m(&m, t0 + IG_COST_MINUTES * 60 * S)));
    assert_true(ig_cost_meter_rate(&m, t0 + IG_COST_MINUTES * 60 * S) == 0);
}

static void test_meter_per_token_has_no_idle(void **state)
{
    (void)state;
    ig_price_t tok = {IG_PRICE_PER_TOKEN, 0, 0.5, 1.5};
    ig_cost_meter_t m;
    memset(&m, 0, sizeof(m));
    uint64_t t0 = 7 * 60 * S;
    ig_cost_meter_answer(&m, ig_cost_answer(&tok, 1000, 200, 0, 1), 200, t0);
    assert_true(ig_cost_meter_idle(&m, &tok, t0 + 10 * S) == 0);
    near(ig_cost_meter_per_1m(&m, t0 + 10 * S), 0.0008 / 200 * 1e6);
    ig_cost_meter_answer(&m, NAN, 50, t0 + 11 * S); /* unpriced: tokens only */
    near(ig_cost_meter_per_1m(&m, t0 + 11 * S), 0.0008 / 250 * 1e6);
}

/* Attempts that gave no answer: per token only when the upstream took the
 * request in; per hour the held share whatever the outcome. */
static void test_attempt(void **state)
{
    (void)state;
    ig_price_t tok = {IG_PRICE_PER_TOKEN, 0, 0.5, 1.5};
    /* a lost hedge: 1000 prompt tokens, nothing generated */
    near(ig_cost_attempt(&tok, 1, 1000, 0, 0.3, 1), 0.0005);
    /* a stream that broke after 20 tokens */
    near(ig_cost_attempt(&tok, 1, 1000, 20, 0.3, 1), 0.0005 + 0.00003);
    /* refused (429, 5xx) or never sent: free */
    assert_true(ig_cost_attempt(&tok, 0, 1000, 0, 0.3, 1) == 0);
    ig_price_t hour = {IG_PRICE_PER_HOUR, 3.6, 0, 0};
    near(ig_cost_attempt(&hour, 0, 1000, 0, 2.0, 4), 0.0005);
    near(ig_cost_attempt(&hour, 1, 1000, 0, 2.0, 4), 0.0005);
    ig_price_t none = {IG_PRICE_NONE, 0, 0, 0};
    assert_true(isnan(ig_cost_attempt(&none, 1, 10, 10, 1, 1)));
}

/* The cost objective: hourly capacity (already paid) first while it meets
 * the SLO, per-token endpoints by their tokens, the latency pick among
 * equals, and nothing when none meets the SLO. */
static void test_cost_pick(void **state)
{
    (void)state;
    ig_price_t p[4] = {{IG_PRICE_PER_TOKEN, 0, 0.5, 1.5},  /* cloud A */
                       {IG_PRICE_PER_HOUR, 2.0, 0, 0},     /* colo 1 */
                       {IG_PRICE_PER_HOUR, 9.0, 0, 0},     /* colo 2 */
                       {IG_PRICE_PER_TOKEN, 0, 0.2, 3.0}}; /* cloud B */
    double ttft[4] = {0.05, 0.12, 0.10, 0.04};
    unsigned char ex[4] = {0, 0, 0, 0};
    /* both colos meet 150 ms and cost 0 more: the lower hourly price,
     * whichever the latency pick is */
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 100, 50, 0.150, 0), 1);
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 100, 50, 0.150, 2), 1);
    /* of two at one hourly price, the latency pick, else the faster */
    ig_price_t same[2] = {{IG_PRICE_PER_HOUR, 2.0, 0, 0}, {IG_PRICE_PER_HOUR, 2.0, 0, 0}};
    double t2[2] = {0.12, 0.10};
    assert_int_equal(ig_cost_pick(same, t2, NULL, 2, 100, 50, 0.150, 0), 0);
    assert_int_equal(ig_cost_pick(same, t2, NULL, 2, 100, 50, 0.150, -1), 1);
    /* an SLO of 110 ms leaves colo 2 only; of 90 ms, the clouds: A costs
     * 100 x 0.5 + 50 x 1.5 = 125, B 100 x 0.2 + 50 x 3 = 170 (per 1M) */
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 100, 50, 0.110, 3), 2);
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 100, 50, 0.090, 3), 0);
    /* a long prompt and a short answer turn it around: A 1000 x 0.5 + 10 x
     * 1.5 = 515, B 1000 x 0.2 + 10 x 3 = 230 */
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 1000, 10, 0.090, 0), 3);
    /* excluded ones never, and none within 30 ms: -1 */
    ex[2] = 1;
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 100, 50, 0.150, 0), 1);
    assert_int_equal(ig_cost_pick(p, ttft, ex, 4, 100, 50, 0.030, 0), -1);
    near(ig_cost_marginal(&p[0], 100, 50), 125e-6);
    assert_true(ig_cost_marginal(&p[1], 100, 50) == 0);
}

/* The p99 TTFT bound: the mean plus 2.326 standard deviations of the wait,
 * ahead exponential gaps (variance wait^2 / ahead). */
static void test_ttft_bound(void **state)
{
    (void)state;
    /* 100 ms mean, 80 ms of it the wait behind 16 gaps of 5 ms: sd 20 ms */
    near(ig_cost_ttft_bound(0.100, 0.080, 16), 0.100 + IG_COST_SLO_Z * 0.020);
    /* the deeper the queue for one wait, the narrower: 64 gaps, sd 10 ms */
    near(ig_cost_ttft_bound(0.100, 0.080, 64), 0.100 + IG_COST_SLO_Z * 0.010);
    /* a wait with fewer than one ahead (a reported wait, say) counts one gap */
    near(ig_cost_ttft_bound(0.050, 0.030, -2), 0.050 + IG_COST_SLO_Z * 0.030);
    near(ig_cost_ttft_bound(0.050, 0.030, 0.5), 0.050 + IG_COST_SLO_Z * 0.030);
    /* no wait: the mean, however many were counted ahead */
    assert_true(ig_cost_ttft_bound(0.020, 0, 0) == 0.020);
    assert_true(ig_cost_ttft_bound(0.020, 0, 3) == 0.020);
    assert_true(ig_cost_ttft_bound(0.020, NAN, 3) == 0.020);
}

/* The latency pick's exploration stands under the cost objective only for
 * the cheapest capacity. */
static void test_keeps_exploration(void **state)
{
    (void)state;
    ig_price_t p[3] = {{IG_PRICE_PER_TOKEN, 0, 0.5, 1.5}, /* cloud */
                       {IG_PRICE_PER_HOUR, 2.0, 0, 0},    /* colo */
                       {IG_PRICE_NONE, 0, 0, 0}};         /* unpriced: marginal 0 */
    unsigned char ex[3] = {0, 0, 0};
    assert_int_equal(ig_cost_keeps_exploration(p, ex, 3, 1, 100, 50), 1);
    assert_int_equal(ig_cost_keeps_exploration(p, ex, 3, 2, 100, 50), 1); /* ties colo */
    assert_int_equal(ig_cost_keeps_exploration(p, ex, 3, 0, 100, 50), 0);
    /* with both marginal-free ones excluded, the cloud is the cheapest left */
    ex[1] = ex[2] = 1;
    assert_int_equal(ig_cost_keeps_exploration(p, ex, 3, 0, 100, 50), 1);
    assert_int_equal(ig_cost_keeps_exploration(p, NULL, 3, 0, 100, 50), 0);
    assert_int_equal(ig_cost_keeps_exploration(p, NULL, 3, -1, 100, 50), 0);
    assert_int_equal(ig_cost_keeps_exploration(p, NULL, 3, 3, 100, 50), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer),
        cmocka_unit_test(test_meter_idle_and_per_1m),
        cmocka_unit_test(test_meter_per_token_has_no_idle),
        cmocka_unit_test(test_attempt),
        cmocka_unit_test(test_cost_pick),
        cmocka_unit_test(test_ttft_bound),
        cmocka_unit_test(test_keeps_exploration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
