/* What the latency policy must hold on any fleet, checked in the routing
 * simulator over random fleets and with the router's own functions: it
 * never sends to an upstream at its limit while another one has room, and
 * an upstream it stopped using comes back once it is fast again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "infergate/admit.h"
#include "sim.h"

#define S(x) ((uint64_t)((x)*1e9))

/* Over random fleets and loads up to overload, no attempt of the infergate
 * policies went to an upstream at its limit while another eligible one had
 * room (the simulator counts each one); and many decisions were made with
 * some upstream at its limit and another with room (the check had
 * something to see). */
static void test_never_over_limit_in_random_fleets(void **state)
{
    (void)state;
    const double loads[] = {0.5, 0.9, 1.2};
    int crowded = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) {
        sim_fleet_t f;
        sim_fleet_generate(seed, &f);
        for (int l = 0; l < 3; l++) {
            sim_config_t c;
            sim_config_default(&c);
            c.requests = 3000;
            c.load = loads[l];
            c.seed = seed;
            for (int p = SIM_LATENCY; p <= SIM_ROUND_ROBIN; p++) {
                sim_result_t r;
                assert_int_equal(sim_run(&f, (sim_policy_t)p, &c, &r), 0);
                assert_int_equal(r.over_limit, 0);
                crowded += r.crowded;
            }
        }
    }
    assert_true(crowded > 1000);
    print_message("decisions with an upstream at its limit and another with room: %d\n", crowded);
}

/* The same, one decision at a time with the router's functions: random
 * states of four upstreams, one of them cheap and at its limit; the pick
 * over what ig_admit_mark leaves never names one at its limit, and it
 * fails only when every eligible one is at its limit. */
static void test_pick_respects_limits(void **state)
{
    (void)state;
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    ig_router_t r;
    ig_router_init(&r, &o);
    uint64_t x = 88172645463325252ULL;
    int checked = 0, queued = 0;
    for (int round = 0; round < 2000; round++) {
        ig_router_upstream_t u[4];
        ig_router_upstream_t *ups[4];
        uint64_t now = S(10 + round);
        for (int i = 0; i < 4; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ig_router_upstream_init(&u[i], "u", IG_ROUTER_LOCAL);
            u[i].ready = 1;
            u[i].slots = 1 + (int)(x % 8);
            u[i].reported_at_ns = now;
            ig_router_observe_ttft(&r, &u[i], 16, i == 0 ? 0.001 : 0.05 + (x % 100) * 1e-3, 0, now);
            int lim = ig_admit_limit(&r, &u[i], 0);
            u[i].inflight = i == 0 ? lim : (int)((x >> 8) % (uint64_t)(lim + 1));
            ups[i] = &u[i];
        }
        unsigned char exclude[4];
        ig_admit_view_t v;
        ig_admit_mark(&r, ups, 4, NULL, 0, 0, now, exclude, &v);
        assert_true(exclude[0]); /* the cheap one is full */
        ig_route_decision_t d;
        int rc = ig_router_pick(&r, ups, 4, 16, exclude, now, &d);
        if (v.saturated < v.eligible) {
            assert_int_equal(rc, 0);
            assert_true(u[d.chosen].inflight < ig_admit_limit(&r, &u[d.chosen], 0));
            checked++;
        } else {
            assert_int_not_equal(rc, 0);
            assert_int_equal(ig_admit_unplaced(&v, 0, 0, 0), IG_ADMIT_QUEUE);
            queued++;
        }
    }
    assert_true(checked > 1000);
    assert_true(queued > 0);
}

/* Three alike upstreams: 4 slots, exponential service, streamed. */
static void three_alike(sim_fleet_t *f)
{
    memset(f, 0, sizeof(*f));
    f->n = 3;
    f->stream = 1;
    f->prompt_mean = 64;
    f->output_mean = 16;
    f->token_sigma = 0.5;
    for (int i = 0; i < 3; i++) {
        sim_upstream_t *u = &f->up[i];
        u->slots = 4;
        u->rtt_s = 0.002;
        u->ttft0_s = 0.02;
        u->prefill_s_tok = 0.0002;
        u->decode_s_tok = 0.01;
        u->dist = SIM_DIST_EXP;
    }
}

/* An idle upstream's estimate stays fresh: u0 stalls for 3 s early in the
 * run, so its service estimate goes high (at least 5x the others' at the
 * end: the test sees a stale estimate), and at 20% load the two others
 * can carry everything. Once it is as fast as the others again its
 * estimate must come back (within half of theirs at the end) and it must
 * get traffic back: in the second half of the run at least a tenth. */
static void test_stalled_upstream_comes_back(void **state)
{
    (void)state;
    sim_fleet_t f;
    three_alike(&f);
    f.up[0].stall_at = 0.1;
    f.up[0].stall_s = 3.0;
    sim_config_t c;
    sim_config_default(&c);
    c.requests = 20000;
    c.load = 0.2;
    sim_result_t r;
    assert_int_equal(sim_run(&f, SIM_LATENCY, &c, &r), 0);
    print_message("sent: u0 %d, u1 %d, u2 %d; second half: u0 %d, u1 %d, u2 %d\n", r.sent[0],
                  r.sent[1], r.sent[2], r.late_sent[0], r.late_sent[1], r.late_sent[2]);
    int late = r.late_sent[0] + r.late_sent[1] + r.late_sent[2];
    print_message("service estimate: u0 peak %.3f s, at the end u0 %.4f, u1 %.4f, u2 %.4f s\n",
                  r.svc_peak[0], r.svc_final[0], r.svc_final[1], r.svc_final[2]);
    assert_true(r.late_sent[0] >= late / 10);
    assert_true(r.svc_peak[0] > 5 * r.svc_final[1]);
    assert_true(fabs(r.svc_final[0] - r.svc_final[1]) < 0.5 * r.svc_final[1]);
}

/* The tail's counts (sim_result_t, what --sent prints): their total,
 * which must be the same by upstream and by tenth and at least 1% of the
 * measured answers, and the tenth that holds the most. */
static int tail_total(const sim_result_t *r, int n, int *most)
{
    int total = r->tail_refused, by_tenth = 0;
    for (int u = 0; u < n; u++)
        total += r->tail[u];
    *most = 0;
    for (int k = 0; k < 10; k++) {
        by_tenth += r->tail_tenth[k];
        if (r->tail_tenth[k] > r->tail_tenth[*most])
            *most = k;
    }
    print_message("tail: u0 %d, u1 %d, u2 %d, refused %d; most in tenth %d (%d)\n", r->tail[0],
                  r->tail[1], r->tail[2], r->tail_refused, *most, r->tail_tenth[*most]);
    assert_int_equal(total, by_tenth);
    assert_true(total >= r->measured / 100);
    return total;
}

/* What --sent prints of a cell's tail points at its cause. An upstream
 * whose first token takes 8x the others' the whole run: the tail is its
 * answers, spread over the run. One that stalls for 5 s halfway through:
 * the tail is in the tenth of the stall (halfway through the arrivals is
 * 4/9 of the way through the measured answers; the first tenth is not
 * measured). */
static void test_tail_points_at_its_cause(void **state)
{
    (void)state;
    sim_fleet_t f;
    sim_config_t c;
    sim_config_default(&c);
    c.requests = 6000;
    c.load = 0.3;
    sim_result_t r;
    int most;

    three_alike(&f);
    f.up[0].ttft0_s *= 8;
    assert_int_equal(sim_run(&f, SIM_ROUND_ROBIN, &c, &r), 0);
    int total = tail_total(&r, f.n, &most);
    assert_true(r.tail[0] >= 0.9 * total);
    assert_true(r.tail_tenth[most] <= 0.3 * total);

    three_alike(&f);
    f.up[0].stall_at = 0.5;
    f.up[0].stall_s = 5.0;
    c.load = 0.5;
    assert_int_equal(sim_run(&f, SIM_ROUND_ROBIN, &c, &r), 0);
    total = tail_total(&r, f.n, &most);
    assert_true(r.tail[0] >= 0.8 * total);
    assert_true(most >= 3 && most <= 5);
    assert_true(r.tail_tenth[most] >= 0.8 * total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_over_limit_in_random_fleets),
        cmocka_unit_test(test_pick_respects_limits),
        cmocka_unit_test(test_stalled_upstream_comes_back),
        cmocka_unit_test(test_tail_points_at_its_cause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
