/* Exploration in the latency policy: an idle upstream whose service
 * estimate went stale is sent a request to measure it again, within a
 * budget of the decisions. Driven by a synthetic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "infergate/router.h"
#include "router_fixture.h"

#define S(x) ((uint64_t)((x)*1e9))

/* Three local upstreams: "stale" last answered at t = 0 and is believed
 * slow (100 ms), the two others answer 20 ms at `now` and have `busy` of
 * ours in flight each. With none in flight anywhere nobody is hot and the
 * stale one loses by its cost alone (an idle upstream beside busy ones is
 * the least loaded, and the hot/cold guard sends it traffic anyway). */
typedef struct {
    ig_router_upstream_t u[3];
    ig_router_upstream_t *ups[3];
} fleet_t;

static void fleet_init(fleet_t *f, ig_router_t *r, int busy, uint64_t now)
{
    static const char *names[] = {"stale", "f1", "f2"};
    for (int i = 0; i < 3; i++) {
        ig_router_upstream_init(&f->u[i], names[i], IG_ROUTER_LOCAL);
        f->u[i].ready = 1;
        f->ups[i] = &f->u[i];
        ig_router_observe_rtt(r, &f->u[i], 0.0005, i == 0 ? S(0.001) : now);
        ig_router_observe_ttft(r, &f->u[i], 16, i == 0 ? 0.100 : 0.020, 0, i == 0 ? S(0.001) : now);
        if (i > 0)
            f->u[i].inflight = busy;
    }
}

/* Picks n times at `now`, counting the picks of each and the explorations. */
static void pick_n(ig_router_t *r, fleet_t *f, int n, uint64_t now, int *chosen, int *explored)
{
    for (int i = 0; i < n; i++) {
        ig_route_decision_t d;
        assert_int_equal(ig_router_pick(r, f->ups, 3, 16, NULL, now, &d), 0);
        chosen[d.chosen]++;
        *explored += d.explored;
        if (d.explored)
            assert_int_equal(d.chosen, 0);
    }
}

static void test_stale_idle_upstream_explored_within_budget(void **state)
{
    (void)state;
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    fleet_t f;
    uint64_t now = S(5);
    fleet_init(&f, &r, 0, now);
    int chosen[3] = {0}, explored = 0;
    /* Ranked by cost alone "stale" (100 ms) loses to the fast ones. */
    pick_n(&r, &f, 99, now, chosen, &explored);
    assert_int_equal(chosen[0], 0);
    assert_int_equal(explored, 0);
    /* The hundredth decision fills the budget's token (0.01 a decision). */
    pick_n(&r, &f, 1, now, chosen, &explored);
    assert_int_equal(explored, 1);
    assert_int_equal(chosen[0], 1);
    /* It stays idle and stale here (nothing is begun): over 1000 more
     * decisions the budget allows 10, and no more. */
    pick_n(&r, &f, 1000, now, chosen, &explored);
    assert_int_equal(explored, 11);
    assert_int_equal(chosen[0], 11);
    assert_int_equal((int)r.explorations, 11);
}

static void test_not_explored_when_busy_fresh_or_off(void **state)
{
    (void)state;
    uint64_t now = S(5);
    int chosen[3] = {0}, explored = 0;

    /* Busy: one of ours in flight there measures it already. */
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    fleet_t f;
    fleet_init(&f, &r, 1, now);
    f.u[0].inflight = 1;
    pick_n(&r, &f, 300, now, chosen, &explored);
    assert_int_equal(explored, 0);

    /* Fresh: its last sample is younger than IG_ROUTER_EXPLORE_AFTER_S. */
    r = ig_trouter(IG_ROUTE_LATENCY);
    fleet_init(&f, &r, 0, now);
    f.u[0].svc_at_ns = now - S(IG_ROUTER_EXPLORE_AFTER_S / 2);
    pick_n(&r, &f, 300, now, chosen, &explored);
    assert_int_equal(explored, 0);

    /* Off: explore_ratio 0. */
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.explore_ratio = 0;
    ig_router_init(&r, &o);
    fleet_init(&f, &r, 0, now);
    pick_n(&r, &f, 300, now, chosen, &explored);
    assert_int_equal(explored, 0);

    /* Other policies never explore. */
    r = ig_trouter(IG_ROUTE_LEAST_INFLIGHT);
    fleet_init(&f, &r, 0, now);
    pick_n(&r, &f, 300, now, chosen, &explored);
    assert_int_equal(explored, 0);
    assert_int_equal((int)r.explorations, 0);
}

/* The point of it: an upstream whose estimate is wrong (100 ms believed,
 * 20 ms true) is measured again by explorations, where without them it
 * would never be chosen again while the others are idle too. */
static void test_exploration_brings_wrong_estimate_back(void **state)
{
    (void)state;
    for (int on = 0; on <= 1; on++) {
        ig_router_opts_t o;
        ig_router_opts_default(&o);
        o.explore_ratio = on ? 0.01 : 0;
        ig_router_t r;
        ig_router_init(&r, &o);
        fleet_t f;
        uint64_t now = S(1);
        fleet_init(&f, &r, 0, now);
        int won_by_cost = 0, explorations = 0;
        /* 20 s at 200 decisions a second; the fast ones answer every
         * decision at once; an exploration answers 20 ms later. */
        for (int step = 0; step < 4000; step++) {
            now += S(0.005);
            for (int i = 1; i < 3; i++)
                ig_router_observe_ttft(&r, &f.u[i], 16, 0.020, 0, now);
            ig_route_decision_t d;
            assert_int_equal(ig_router_pick(&r, f.ups, 3, 16, NULL, now, &d), 0);
            if (d.chosen == 0) {
                explorations += d.explored;
                won_by_cost += !d.explored;
                ig_router_observe_ttft(&r, &f.u[0], 16, 0.020, 0, now + S(0.020));
            }
        }
        if (!on) {
            assert_int_equal(won_by_cost + explorations, 0);
            assert_true(f.u[0].svc_s > 0.09); /* never measured again */
        } else {
            /* At most one exploration a stale interval, within the budget. */
            assert_true(explorations >= 5);
            assert_true(explorations <= 40);
            assert_true(fabs(f.u[0].svc_s - 0.020) < 0.005);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_idle_upstream_explored_within_budget),
        cmocka_unit_test(test_not_explored_when_busy_fresh_or_off),
        cmocka_unit_test(test_exploration_brings_wrong_estimate_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
