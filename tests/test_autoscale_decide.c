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
    ig_autoscale_params_t p;
    ig_autoscale_params_default(&p);
    p.target_queue_depth = 4;
    p.stable_window_s = 60;
    p.panic_window_s = 6;
    p.scale_down_delay_s = 30;
    p.scale_to_zero_after_s = 60;
    p.min_instances = min;
    p.max_instances = max;
    ig_autoscaler_t as;
    ig_autoscaler_init(&as, &p);
    return as;
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
    assert_int_equal(r.downs, 0);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step),
        cmocka_unit_test(test_spike_then_back_down_after_delay),
        cmocka_unit_test(test_slow_ramp_tracks_without_panic),
        cmocka_unit_test(test_flapping_load_does_not_flap),
        cmocka_unit_test(test_scale_to_zero_and_back),
        cmocka_unit_test(test_clamps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
