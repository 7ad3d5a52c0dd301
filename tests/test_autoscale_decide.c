/* The autoscaler's decision function, driven by an injected clock and
 * synthetic load: step, spike, slow ramp, flapping load, scale to zero. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infergate/autoscale.h"
#include "autoscale_fixture.h"

#define S(x) ((uint64_t)((x)*1e9))

typedef double (*load_fn)(double t);

typedef struct {
    int max_instances;
    int changes; /* decisions that changed the count */
    int downs, ups;
    int at[400]; /* instance count at each 1 s tick */
    int panic_seen;
    const char *last_reason;
} run_t;

/* Runs `seconds` of 1 s ticks from t = 1 s; the pool follows each decision
 * at once (every instance is ready as soon as started). */
static void simulate(ig_autoscaler_t *as, load_fn f, int seconds, int start, run_t *out)
{
    memset(out, 0, sizeof(*out));
    int current = start;
    for (int t = 1; t <= seconds; t++) {
        uint64_t now = S(t);
        ig_autoscaler_sample(as, now, f(t));
        ig_scale_decision_t d =
            ig_autoscaler_decide(as, now, current, current, as->p.max_instances - current);
        if (d.desired != current) {
            out->changes++;
            if (d.desired > current)
                out->ups++;
            else
                out->downs++;
        }
        out->panic_seen |= d.panic;
        out->last_reason = d.reason;
        current = d.desired;
        if (current > out->max_instances)
            out->max_instances = current;
        if (t < 400)
            out->at[t] = current;
    }
}

static ig_autoscaler_t make(int min, int max)
{
    return ig_tas_make((ig_tas_t){.target_queue_depth = 4,
                                  .stable_window_s = 60,
                                  .panic_window_s = 6,
                                  .scale_down_delay_s = 30,
                                  .min_instances = min,
                                  .max_instances = max});
}

static double step_load(double t)
{
    return t < 100 ? 4 : 24; /* one instance's worth, then six */
}

static void test_step(void **state)
{
    ig_autoscaler_t as = make(1, 8);
    run_t r;
    simulate(&as, step_load, 220, 1, &r);
    assert_int_equal(r.at[99], 1);
    /* The short window sees the step within seconds: panic scales up fast. */
    assert_true(r.at[106] >= 2);
    assert_true(r.panic_seen);
    /* It settles at the load / target = 6, not more. */
    assert_int_equal(r.at[219], 6);
    assert_int_equal(r.max_instances, 6);
    assert_int_equal(r.downs, 0);
}

static double spike_load(double t)
{
    return t >= 50 && t < 56 ? 40 : 2;
}

static void test_spike_then_back_down_after_delay(void **state)
{
    ig_autoscaler_t as = make(1, 16);
    run_t r;
    simulate(&as, spike_load, 300, 1, &r);
    assert_true(r.panic_seen);
    assert_true(r.at[56] >= 4);
    /* Panic holds for the stable window: no scale-down right after. */
    assert_true(r.at[80] >= r.at[56]);
    /* And after the windows and the delay, it returns to one. */
    assert_int_equal(r.at[299], 1);
}

static double ramp_load(double t)
{
    return 16 + t * 0.05; /* 4 instances' worth, growing to about 7.75 */
}

static void test_slow_ramp_tracks_without_panic(void **state)
{
    ig_autoscaler_t as = make(1, 16);
    run_t r;
    simulate(&as, ramp_load, 300, 4, &r);
    assert_false(r.panic_seen);
    assert_int_equal(r.downs, 0);
    /* The stable mean lags the ramp by about half a window. */
    int expect = (int)ceil((16 + (300 - 30) * 0.05) / 4);
    assert_true(abs(r.at[299] - expect) <= 1);
}

static double flap_load(double t)
{
    return ((int)t / 10) % 2 ? 12 : 4; /* 10 s high, 10 s low, forever */
}

static void test_flapping_load_does_not_flap(void **state)
{
    ig_autoscaler_t as = make(1, 16);
    run_t r;
    simulate(&as, flap_load, 300, 1, &r);
    /* It reaches a level for the mean and stays: a few changes at most,
     * and never down then up again. */
    assert_true(r.changes <= 3);
    int first_down = 0;
    for (int t = 2; t < 300 && !first_down; t++)
        first_down = r.at[t] < r.at[t - 1] ? t : 0;
    for (int t = first_down ? first_down + 1 : 300; t < 300; t++)
        assert_true(r.at[t] <= r.at[t - 1]);
    /* It settles where the mean asks: 8 per 4 = 2. */
    assert_int_equal(r.at[299], 2);
}

static double idle_after_30(double t)
{
    return t < 30 ? 3 : 0;
}

static void test_scale_to_zero_and_back(void **state)
{
    ig_autoscaler_t as = make(0, 4);
    run_t r;
    simulate(&as, idle_after_30, 200, 1, &r);
    assert_int_equal(r.at[60], 1);  /* idle only 30 s: kept */
    assert_int_equal(r.at[199], 0); /* idle 60 s and past the delay: gone */
    /* A request arriving at zero asks for one at once. */
    ig_autoscaler_sample(&as, S(201), 1);
    ig_scale_decision_t d = ig_autoscaler_decide(&as, S(201), 0, 0, 4);
    assert_int_equal(d.desired, 1);
    assert_int_equal(d.direction, IG_SCALE_UP);
}

static void test_clamps(void **state)
{
    ig_autoscaler_t as = make(2, 3);
    ig_autoscaler_sample(&as, S(1), 0);
    ig_scale_decision_t d = ig_autoscaler_decide(&as, S(1), 2, 2, 1);
    assert_int_equal(d.desired, 2);
    assert_string_equal(d.limit, "min_instances");
    for (int t = 2; t < 10; t++)
        ig_autoscaler_sample(&as, S(t), 100);
    d = ig_autoscaler_decide(&as, S(10), 2, 2, 1);
    assert_int_equal(d.desired, 3);
    /* No free device: stays. */
    d = ig_autoscaler_decide(&as, S(11), 2, 2, 0);
    assert_int_equal(d.desired, 2);
    assert_string_equal(d.limit, "no_free_device");
    assert_string_equal(d.reason, "panic"); /* the policy's reason survives the bound */
}

/* Growth counts from what serves: while the new instances start, a
 * request for more does not start more than ready x rate, and the cap
 * never scales down what is already starting. */
static void test_scale_up_rate_counts_ready(void **state)
{
    ig_autoscaler_t as = make(1, 16);
    as.p.max_scale_up_rate = 2;
    for (int t = 1; t <= 6; t++)
        ig_autoscaler_sample(&as, S(t), 40); /* wants 10 */
    ig_scale_decision_t d = ig_autoscaler_decide(&as, S(6), 1, 1, 15);
    assert_int_equal(d.desired, 2);
    assert_string_equal(d.limit, "rate_limit");
    assert_string_equal(d.reason, "panic");
    /* Three starting, one ready: the cap (2) is below current: hold at 3. */
    d = ig_autoscaler_decide(&as, S(7), 3, 1, 13);
    assert_int_equal(d.desired, 3);
    assert_int_equal(d.direction, IG_SCALE_NONE);
    /* Once they serve, it may double again. */
    d = ig_autoscaler_decide(&as, S(8), 3, 3, 13);
    assert_int_equal(d.desired, 6);
}

/* Scale-down at most halves the count in one decision (Knative's 2x). */
static void test_scale_down_rate(void **state)
{
    ig_autoscaler_t as = make(1, 16);
    as.p.stable_window_s = 10;
    as.p.panic_window_s = 2;
    as.p.scale_down_delay_s = 0;
    for (int t = 1; t <= 30; t++)
        ig_autoscaler_sample(&as, S(t), 0.5);
    ig_scale_decision_t d = ig_autoscaler_decide(&as, S(30), 8, 8, 8);
    assert_int_equal(d.direction, IG_SCALE_DOWN);
    assert_int_equal(d.desired, 4);
    assert_string_equal(d.limit, "rate_limit");
    d = ig_autoscaler_decide(&as, S(31), 4, 4, 12);
    assert_int_equal(d.desired, 2);
    d = ig_autoscaler_decide(&as, S(32), 2, 2, 14);
    assert_int_equal(d.desired, 1);
}

/* Short requests that no 1 s sample catches still count as traffic: a
 * pool that gets a request every 10 s never goes to zero. */
static void test_requests_between_samples_keep_pool(void **state)
{
    ig_autoscaler_t as = make(0, 2);
    as.p.scale_to_zero_after_s = 30;
    int current = 1;
    for (int t = 1; t <= 200; t++) {
        if (t % 10 == 5)
            ig_autoscaler_note_request(&as, S(t) - S(0.5)); /* done before the sample */
        ig_autoscaler_sample(&as, S(t), 0);
        ig_scale_decision_t d = ig_autoscaler_decide(&as, S(t), current, current, 2 - current);
        current = d.desired;
        assert_int_equal(current, 1);
    }
    /* Without requests, it goes exactly when the idle time is up: the idle
     * time is the delay, the scale-down delay does not add to it. */
    int zero_at = 0;
    for (int t = 201; t <= 300 && !zero_at; t++) {
        ig_autoscaler_sample(&as, S(t), 0);
        ig_scale_decision_t d = ig_autoscaler_decide(&as, S(t), current, current, 2 - current);
        if (d.desired == 0) {
            zero_at = t;
            assert_string_equal(d.reason, "idle_to_zero");
        } else {
            assert_string_equal(d.reason, "idle_hold");
        }
        current = d.desired;
    }
    assert_int_equal(zero_at, 195 + 30); /* the last request was at 194.5 s */
}

/* The panic window alone decides during a burst: a step to 4x the target
 * on one instance asks for 4 at the first decision that sees it. */
static void test_panic_reacts_at_first_sample(void **state)
{
    ig_autoscaler_t as = make(1, 8);
    for (int t = 1; t <= 60; t++)
        ig_autoscaler_sample(&as, S(t), 2);
    ig_scale_decision_t d = ig_autoscaler_decide(&as, S(60), 1, 1, 7);
    assert_int_equal(d.direction, IG_SCALE_NONE);
    as.p.panic_window_s = 1; /* one sample: what the last second saw */
    ig_autoscaler_sample(&as, S(61), 16);
    d = ig_autoscaler_decide(&as, S(61), 1, 1, 7);
    assert_true(d.panic);
    assert_int_equal(d.direction, IG_SCALE_UP);
    assert_int_equal(d.desired, 4);
    /* The stable window alone would have asked for one more at most. */
    assert_true(ceil(d.stable_load / 4) <= 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step),
        cmocka_unit_test(test_spike_then_back_down_after_delay),
        cmocka_unit_test(test_slow_ramp_tracks_without_panic),
        cmocka_unit_test(test_flapping_load_does_not_flap),
        cmocka_unit_test(test_scale_to_zero_and_back),
        cmocka_unit_test(test_clamps),
        cmocka_unit_test(test_scale_up_rate_counts_ready),
        cmocka_unit_test(test_scale_down_rate),
        cmocka_unit_test(test_requests_between_samples_keep_pool),
        cmocka_unit_test(test_panic_reacts_at_first_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
