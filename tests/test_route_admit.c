/* Admission under the latency policy (gateway/route/admit.c): a request
 * that would queue behind others at a slow upstream waits in the gateway
 * instead when a place at an upstream now at its limit is expected sooner;
 * never while an upstream has a free place, never for one that has gone
 * silent or reports no slots, and only under the latency policy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/admit.h"
#include "infergate/router.h"

#define S(x) ((uint64_t)((x)*1e9))

/* Two upstreams and the router that weighs them, at one instant. */
typedef struct {
    ig_router_t r;
    ig_router_upstream_t fast, slow;
    uint64_t now;
    int held; /* requests held in the gateway's queue */
    unsigned char exclude[2];
} fleet_t;

/* fast: 4 slots, each request holds one for 0.1 s, at its limit (8, twice
 * its slots), an answer 10 ms ago. slow: 2 slots, 2 s a request, 3 in
 * flight, under its limit of 4: a new request there waits for 2 of them.
 * The router runs with opts (NULL: the defaults, the latency policy). */
static void fleet_init(fleet_t *f, const ig_router_opts_t *opts)
{
    ig_router_upstream_t *fast = &f->fast, *slow = &f->slow;
    uint64_t now = f->now = S(100);
    ig_router_init(&f->r, opts);
    ig_router_upstream_init(fast, "fast", IG_ROUTER_LOCAL);
    ig_router_upstream_init(slow, "slow", IG_ROUTER_LOCAL);
    fast->ready = slow->ready = 1;
    fast->slots = 4;
    slow->slots = 2;
    fast->reported_at_ns = slow->reported_at_ns = now;
    ig_router_observe_occupancy(&f->r, fast, 0.1, now);
    ig_router_observe_occupancy(&f->r, slow, 2.0, now);
    ig_router_observe_ttft(&f->r, fast, 16, 0.02, 0, now);
    ig_router_observe_ttft(&f->r, slow, 16, 0.2, 0, now);
    fast->inflight = ig_admit_limit(&f->r, fast, 0);
    slow->inflight = 3;
    fast->done_at_ns = slow->done_at_ns = now - S(0.01);
    f->held = 0;
}

#define PLACED 100

/* PLACED when the pick found an upstream, else the verdict; f->exclude
 * says which upstreams admission passed over. */
static int admit(fleet_t *f)
{
    ig_router_upstream_t *ups[2] = {&f->fast, &f->slow};
    ig_admit_view_t v;
    ig_admit_mark(&f->r, ups, 2, NULL, 0, f->held, f->now, f->exclude, &v);
    ig_route_decision_t d;
    if (ig_router_pick(&f->r, ups, 2, 16, f->exclude, f->now, &d) == 0)
        return PLACED;
    return (int)ig_admit_unplaced(&v, 0, 0, 0);
}

static void test_holds_rather_than_queue_behind_slow(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    /* 0.25 s for a place at fast, 4.2 s at slow: wait in the gateway. */
    assert_true(f.slow.inflight < ig_admit_limit(&f.r, &f.slow, 0));
    assert_true(ig_router_delay(&f.r, &f.fast, f.now) < ig_router_delay(&f.r, &f.slow, f.now));
    assert_int_equal(admit(&f), IG_ADMIT_QUEUE);
    assert_true(f.exclude[0] && f.exclude[1]);
}

/* The places that come free serve the whole queue: with 100 held, fast's
 * (40 a second) drain it in 0.25 + 2.5 s, still sooner than slow's 4.2 s;
 * with 200, in 5.25 s, and slow takes the request. Without this a queue
 * that grew faster than the places drained it was held until it timed
 * out while slow had room. */
static void test_held_requests_count(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    f.held = 100;
    assert_int_equal(admit(&f), IG_ADMIT_QUEUE);
    f.held = 200;
    assert_int_equal(admit(&f), PLACED);
    assert_true(f.exclude[0] && !f.exclude[1]);
}

static void test_free_place_is_used(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    f.slow.inflight = 1; /* a place free at slow: no capacity idles */
    assert_int_equal(admit(&f), PLACED);
    assert_false(f.exclude[1]);
}

static void test_silent_upstream_is_not_waited_for(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    f.fast.done_at_ns = f.now - S(5); /* nothing back for 5 s: stalled, or slower than believed */
    assert_int_equal(admit(&f), PLACED);
    assert_false(f.exclude[1]);
}

/* Its last answer 5 s ago, but it was idle until its requests in flight
 * began 10 ms ago: an idle spell is not a stall, so it is waited for (a
 * burst after a quiet spell went to the slow one: test_gateway_hold). */
static void test_idle_spell_is_not_silence(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    f.fast.done_at_ns = f.now - S(5);
    f.fast.busy_since_ns = f.now - S(0.01);
    assert_int_equal(admit(&f), IG_ADMIT_QUEUE);
    /* Busy for 5 s with nothing back: silent. */
    f.fast.busy_since_ns = f.now - S(5);
    assert_int_equal(admit(&f), PLACED);
}

static void test_only_the_latency_policy(void **state)
{
    (void)state;
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.policy = IG_ROUTE_LEAST_INFLIGHT;
    fleet_t f;
    fleet_init(&f, &o);
    assert_int_equal(admit(&f), PLACED);
    assert_false(f.exclude[1]);
}

/* A learned C that is only a lower bound (no queue seen) does not say the
 * request would queue: such an upstream is not passed over. */
static void test_lower_bound_c_is_not_a_queue(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    f.slow.slots = 0;
    f.slow.reported_at_ns = 0;
    f.slow.concurrency = 2; /* learned from buckets 0 and 1, flat */
    f.slow.hold_base_s = 2.0;
    f.slow.hold_svc_s = 0;
    assert_int_equal(ig_router_would_queue(&f.slow), 0);
    assert_int_equal(admit(&f), PLACED);
    f.slow.hold_svc_s = 2.0; /* a fitted queue: C = 2 is where it begins */
    assert_int_equal(ig_router_would_queue(&f.slow), 1);
    assert_int_equal(admit(&f), IG_ADMIT_QUEUE);
}

/* A place is waited for only at an upstream that reports its slots. One
 * that reports none is at the proxy's cap (64), not at its capacity, and
 * its delay rests on a learned C that a batch slowdown can put several
 * times low: the request goes to the upstream with room. */
static void test_unreported_limit_is_not_waited_for(void **state)
{
    (void)state;
    fleet_t f;
    fleet_init(&f, NULL);
    f.fast.slots = 0;
    f.fast.reported_at_ns = 0;
    f.fast.concurrency = 4; /* a fitted queue: 0.1 s a place, over 4 */
    f.fast.hold_base_s = 0.1;
    f.fast.hold_svc_s = 0.1;
    f.fast.inflight = ig_admit_limit(&f.r, &f.fast, 0);
    f.slow.slots = 0;
    f.slow.reported_at_ns = 0;
    f.slow.concurrency = 2;
    f.slow.hold_base_s = 2.0;
    f.slow.hold_svc_s = 2.0;
    /* The old rule held it: fast's place is expected sooner. */
    assert_true(ig_router_would_queue(&f.slow));
    assert_true(ig_router_delay(&f.r, &f.fast, f.now) > 0);
    assert_true(ig_router_delay(&f.r, &f.fast, f.now) < ig_router_delay(&f.r, &f.slow, f.now));
    assert_int_equal(admit(&f), PLACED);
    assert_true(f.exclude[0]);
    assert_false(f.exclude[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holds_rather_than_queue_behind_slow),
        cmocka_unit_test(test_held_requests_count),
        cmocka_unit_test(test_free_place_is_used),
        cmocka_unit_test(test_silent_upstream_is_not_waited_for),
        cmocka_unit_test(test_idle_spell_is_not_silence),
        cmocka_unit_test(test_only_the_latency_policy),
        cmocka_unit_test(test_lower_bound_c_is_not_a_queue),
        cmocka_unit_test(test_unreported_limit_is_not_waited_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
