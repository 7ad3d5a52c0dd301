/* Admission under the latency policy (gateway/route/admit.c): a request
 * that would queue behind others at a slow upstream waits in the gateway
 * instead when a place at an upstream now at its limit is expected sooner;
 * never while an upstream has a free place, never for one that has gone
 * silent, and only under the latency policy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/admit.h"
#include "infergate/router.h"

#define S(x) ((uint64_t)((x)*1e9))

/* fast: 4 slots, each request holds one for 0.1 s, at its limit (8, twice
 * its slots), an answer 10 ms ago. slow: 2 slots, 2 s a request, 3 in
 * flight, under its limit of 4: a new request there waits for 2 of them. */
static void fleet(ig_router_t *r, ig_router_upstream_t *fast, ig_router_upstream_t *slow,
                  uint64_t now)
{
    ig_router_upstream_init(fast, "fast", IG_ROUTER_LOCAL);
    ig_router_upstream_init(slow, "slow", IG_ROUTER_LOCAL);
    fast->ready = slow->ready = 1;
    fast->slots = 4;
    slow->slots = 2;
    fast->reported_at_ns = slow->reported_at_ns = now;
    ig_router_observe_occupancy(r, fast, 0.1, now);
    ig_router_observe_occupancy(r, slow, 2.0, now);
    ig_router_observe_ttft(r, fast, 16, 0.02, 0, now);
    ig_router_observe_ttft(r, slow, 16, 0.2, 0, now);
    fast->inflight = ig_admit_limit(r, fast, 0);
    slow->inflight = 3;
    fast->done_at_ns = slow->done_at_ns = now - S(0.01);
}

#define PLACED 100

/* PLACED when the pick found an upstream, else the verdict. */
static int admit(ig_router_t *r, ig_router_upstream_t *fast, ig_router_upstream_t *slow,
                 uint64_t now, unsigned char *exclude)
{
    ig_router_upstream_t *ups[2] = {fast, slow};
    ig_admit_view_t v;
    ig_admit_mark(r, ups, 2, NULL, 0, now, exclude, &v);
    ig_route_decision_t d;
    if (ig_router_pick(r, ups, 2, 16, exclude, now, &d) == 0)
        return PLACED;
    return (int)ig_admit_unplaced(&v, 0, 0, 0);
}

static void test_holds_rather_than_queue_behind_slow(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t fast, slow;
    uint64_t now = S(100);
    fleet(&r, &fast, &slow, now);
    unsigned char exclude[2];
    /* 0.25 s for a place at fast, 4.2 s at slow: wait in the gateway. */
    assert_true(slow.inflight < ig_admit_limit(&r, &slow, 0));
    assert_true(ig_router_delay(&r, &fast, now) < ig_router_delay(&r, &slow, now));
    assert_int_equal(admit(&r, &fast, &slow, now, exclude), IG_ADMIT_QUEUE);
    assert_true(exclude[0] && exclude[1]);
}

static void test_free_place_is_used(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t fast, slow;
    uint64_t now = S(100);
    fleet(&r, &fast, &slow, now);
    slow.inflight = 1; /* a place free at slow: no capacity idles */
    unsigned char exclude[2];
    assert_int_equal(admit(&r, &fast, &slow, now, exclude), PLACED);
    assert_false(exclude[1]);
}

static void test_silent_upstream_is_not_waited_for(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t fast, slow;
    uint64_t now = S(100);
    fleet(&r, &fast, &slow, now);
    fast.done_at_ns = now - S(5); /* nothing back for 5 s: stalled, or slower than believed */
    unsigned char exclude[2];
    assert_int_equal(admit(&r, &fast, &slow, now, exclude), PLACED);
    assert_false(exclude[1]);
}

static void test_only_the_latency_policy(void **state)
{
    (void)state;
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.policy = IG_ROUTE_LEAST_INFLIGHT;
    ig_router_t r;
    ig_router_init(&r, &o);
    ig_router_upstream_t fast, slow;
    uint64_t now = S(100);
    fleet(&r, &fast, &slow, now);
    unsigned char exclude[2];
    assert_int_equal(admit(&r, &fast, &slow, now, exclude), PLACED);
    assert_false(exclude[1]);
}

/* A learned C that is only a lower bound (no queue seen) does not say the
 * request would queue: such an upstream is not passed over. */
static void test_lower_bound_c_is_not_a_queue(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t fast, slow;
    uint64_t now = S(100);
    fleet(&r, &fast, &slow, now);
    slow.slots = 0;
    slow.reported_at_ns = 0;
    slow.concurrency = 2; /* learned from buckets 0 and 1, flat */
    slow.hold_base_s = 2.0;
    slow.hold_svc_s = 0;
    assert_int_equal(ig_router_would_queue(&slow), 0);
    unsigned char exclude[2];
    assert_int_equal(admit(&r, &fast, &slow, now, exclude), PLACED);
    slow.hold_svc_s = 2.0; /* a fitted queue: C = 2 is where it begins */
    assert_int_equal(ig_router_would_queue(&slow), 1);
    assert_int_equal(admit(&r, &fast, &slow, now, exclude), IG_ADMIT_QUEUE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holds_rather_than_queue_behind_slow),
        cmocka_unit_test(test_free_place_is_used),
        cmocka_unit_test(test_silent_upstream_is_not_waited_for),
        cmocka_unit_test(test_only_the_latency_policy),
        cmocka_unit_test(test_lower_bound_c_is_not_a_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
