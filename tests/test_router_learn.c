/*
 * What the router learns of an upstream that reports nothing: its
 * concurrency from the hold times per requests-in-flight, and its adaptive
 * concurrency limit. Driven by a simulated upstream on a synthetic clock
 * (C slots, FIFO queue, exponential service times, Poisson arrivals, or a
 * closed loop of clients), so the router's estimates are checked against
 * the C and service time the simulation was given.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infergate/router.h"

#define MAXQ 4096

typedef struct {
    double arrive;
    int rif;
    uint64_t order; /* ig_router_order_begin()'s number; unused where `ordered` is 0 */
} job_t;

typedef struct {
    int slots;
    double svc_mean;
    double contention; /* each job already in service slows a new one by this fraction */
    double slow;       /* every service time times 1 + slow (the whole machine slower) */
    double end[64];    /* in service: end time; < 0 free */
    job_t serving[64];
    job_t queue[MAXQ];
    int qhead, qlen;
    uint64_t rng;
    int ordered; /* the router is told the order the jobs end in */
} sim_t;

static double urand(sim_t *s)
{
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return ((s->rng * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}

static double expo(sim_t *s, double mean)
{
    return -mean * log(1.0 - urand(s));
}

static uint64_t ns(double t)
{
    return (uint64_t)(t * 1e9) + 1000000000ULL;
}

/* A router with the default options but the adaptive limit on (it is off
 * by default), and one ready site u of a 0.2 ms RTT. */
static void one_site(ig_router_t *r, ig_router_upstream_t *u, const char *name)
{
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.limit_max = IG_ROUTER_LIMIT_MAX;
    ig_router_init(r, &o);
    ig_router_upstream_init(u, name, IG_ROUTER_SITE);
    u->ready = 1;
    ig_router_observe_rtt(r, u, 0.0002, ns(0));
}

static void sim_init(sim_t *s, int slots, double svc)
{
    memset(s, 0, sizeof(*s));
    s->slots = slots;
    s->svc_mean = svc;
    s->rng = 0x1234567ULL + (uint64_t)slots;
    s->ordered = 1;
    for (int i = 0; i < 64; i++)
        s->end[i] = -1;
}

/* A service time: exponential, slowed by the jobs in service when the
 * machine they share is contended, and by `slow` when all of it is. */
static double sim_service(sim_t *s)
{
    int busy = 0;
    for (int i = 0; i < s->slots; i++)
        busy += s->end[i] >= 0;
    return expo(s, s->svc_mean) * (1.0 + s->contention * busy) * (1.0 + s->slow);
}

/* Starts job j at time t in a free slot, or queues it. */
static void sim_admit(sim_t *s, job_t j, double t)
{
    for (int i = 0; i < s->slots; i++) {
        if (s->end[i] < 0) {
            s->end[i] = t + sim_service(s);
            s->serving[i] = j;
            return;
        }
    }
    s->queue[(s->qhead + s->qlen++) % MAXQ] = j;
}

/* The slot that ends first, or -1 when none is busy. */
static int sim_next_end(const sim_t *s)
{
    int best = -1;
    for (int i = 0; i < s->slots; i++) {
        if (s->end[i] >= 0 && (best < 0 || s->end[i] < s->end[best]))
            best = i;
    }
    return best;
}

/* Ends slot i: the router observes the job's hold; the next queued one
 * takes the slot. Returns the end time. */
static double sim_finish(sim_t *s, int i, ig_router_t *r, ig_router_upstream_t *u)
{
    double t = s->end[i];
    job_t j = s->serving[i];
    ig_router_observe_done(r, u, j.rif, t - j.arrive, ns(t));
    ig_router_attempt_end(r, u, IG_OUTCOME_SUCCESS, 0, ns(t));
    if (s->ordered)
        ig_router_order_end(u, j.order, j.rif, 1, ns(t));
    s->end[i] = -1;
    if (s->qlen > 0) {
        job_t n = s->queue[s->qhead];
        s->qhead = (s->qhead + 1) % MAXQ;
        s->qlen--;
        s->end[i] = t + sim_service(s);
        s->serving[i] = n;
    }
    return t;
}

/* Poisson arrivals at `load` x capacity for n requests, every one sent (no
 * limit): the router sees each with the RIF it began at. Returns the time
 * the last one ended. */
static double run_open(ig_router_t *r, ig_router_upstream_t *u, sim_t *s, double load, int n)
{
    double rate = load * s->slots / s->svc_mean;
    double t = 0, next = expo(s, 1.0 / rate);
    int sent = 0;
    while (sent < n) {
        int e = sim_next_end(s);
        if (e >= 0 && s->end[e] <= next) {
            t = sim_finish(s, e, r, u);
            continue;
        }
        t = next;
        job_t j = {t, u->inflight, s->ordered ? ig_router_order_begin(u, ns(t)) : 0};
        ig_router_attempt_begin(r, u, ns(t));
        sim_admit(s, j, t);
        sent++;
        next = t + expo(s, 1.0 / rate);
    }
    int e;
    while ((e = sim_next_end(s)) >= 0)
        t = sim_finish(s, e, r, u);
    return t;
}

/* A wide upstream lightly used is not taken for a narrow one. The holds
 * by RIF of a 16-slot upstream (100 ms, exponential) that
 * bench/routing-foreign.sh recorded on its narrow fleet at 50%: flat but
 * noisy (the spread of an exponential is its mean). The old noise rule
 * (half a bucket's noise per bucket) took this for C = 1.5, the router
 * then idled the upstream, and the buckets never filled further; a queue
 * must now explain a chi-square of 12 more than none. */
static void test_wide_not_taken_for_narrow(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t u;
    ig_router_upstream_init(&u, "wide2", IG_ROUTER_SITE);
    const int n[] = {32, 32, 32, 6, 9};
    const double mean[] = {0.095, 0.100, 0.134, 0.110, 0.161};
    uint64_t t = ns(0);
    for (int k = 0; k < 5; k++) {
        /* n holds of that mean, spread +-90% (about an exponential's). */
        for (int i = 0; i < n[k]; i++) {
            double v = i == n[k] - 1 && n[k] % 2 ? mean[k] : (i % 2 ? 1.9 : 0.1) * mean[k];
            ig_router_observe_done(&r, &u, k, v, t += 1000000);
        }
    }
    u.concurrency = 0; /* fit once more, on every sample */
    ig_router_observe_done(&r, &u, 0, 0.095, t);
    double c = ig_router_concurrency(&u);
    print_message("recorded holds of a 16-slot upstream: C %.2f (no queue seen up to RIF 4)\n", c);
    assert_true(c >= 5);
    /* A queue that is there is still seen: 4 slots, the same noise, and a
     * wait of (k + 1 - 4) x 25 ms from RIF 4 on. */
    ig_router_upstream_init(&u, "narrow", IG_ROUTER_SITE);
    for (int k = 0; k < 12; k++) {
        double m = 0.100 + (k >= 4 ? (k - 3) * 0.025 : 0);
        for (int i = 0; i < 32; i++)
            ig_router_observe_done(&r, &u, k, (i % 2 ? 1.9 : 0.1) * m, t += 1000000);
    }
    u.concurrency = 0;
    ig_router_observe_done(&r, &u, 0, 0.100, t);
    c = ig_router_concurrency(&u);
    print_message("4 slots, the same noise: C %.2f\n", c);
    assert_true(c >= 3.5 && c <= 5);
}

/* A bucket that missed a heavy tail is not a base to measure a queue
 * from. Bimodal holds (0.7 s nine times in ten, 7.7 s the tenth) and no
 * queue: RIF 3 has 7 holds, none of them long; RIF 4-15 have 32 each, 3
 * of them long (a mean of 1.36 s). Weighed by its own variance (almost
 * none) RIF 3 had 185 times the weight of each other bucket, and the step
 * from it to RIF 4 read as a queue of C 4-5: the router's view of 16-slot
 * upstreams at 90% load in routing-sim (their RIF 0-2 never sampled). One
 * coefficient of variation pooled over the buckets gives RIF 3 the weight
 * of its 7 samples, and C stays the lower bound of what was seen. */
static void test_unlucky_bucket_not_a_queue(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t u;
    ig_router_upstream_init(&u, "wide", IG_ROUTER_LOCAL);
    uint64_t t = ns(0);
    for (int i = 0; i < 7; i++)
        ig_router_observe_done(&r, &u, 3, 0.7, t += 1000000);
    for (int k = 4; k < 16; k++)
        for (int i = 0; i < 32; i++)
            ig_router_observe_done(&r, &u, k, i % 10 == 5 && i < 30 ? 7.7 : 0.7, t += 1000000);
    u.concurrency = 0; /* fit once more */
    ig_router_observe_done(&r, &u, 3, 0.7, t);
    double c = ig_router_concurrency(&u);
    print_message("no queue, a 7-sample bucket without the tail: C %.2f\n", c);
    assert_true(c >= 12);
}

/* A wide upstream at the cap from its first seconds: a few holds at RIF
 * 0-5 as the load ramps up, then every attempt begins with 70 others in
 * flight, beyond the fit's buckets. With no bucket to fit, the fit
 * returned a NaN base, read as C 1 with a queue; what was seen says C is
 * at least the buckets' reach and no queue. */
static void test_busy_from_start_not_narrow(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t u;
    ig_router_upstream_init(&u, "wide-busy", IG_ROUTER_SITE);
    uint64_t t = ns(0);
    for (int k = 0; k < 6; k++)
        ig_router_observe_done(&r, &u, k, 0.95, t += 1000000);
    for (int i = 0; i < 200; i++)
        ig_router_observe_done(&r, &u, 70, i % 2 ? 1.7 : 0.2, t += 3000000);
    double c = ig_router_concurrency(&u);
    print_message("busy from the start at RIF 70: C %.2f, base %.3f s, queue slope %.3f s\n", c,
                  u.hold_base_s, u.hold_svc_s);
    assert_true(c >= IG_ROUTER_RIF_BUCKETS);
    assert_true(u.hold_base_s > 0.5 && u.hold_base_s < 1.5);
    assert_false(u.hold_svc_s > 0);
    assert_false(ig_router_would_queue(&u));
    assert_true(isfinite(ig_router_delay(&r, &u, t)));
}

/* Holds of a 1-slot upstream the policy seldom sends a second request:
 * 32 at RIF 0 (1 s, spread +-90%) and 25 at RIF 1 (2 s: one ahead). So
 * few, so noisy, the hold's queue is not believed (RIF_QUEUE_CHI2), and C
 * is the least that shows none, 2. */
static void one_slot_holds(ig_router_t *r, ig_router_upstream_t *u, uint64_t *t)
{
    for (int i = 0; i < 32; i++)
        ig_router_observe_done(r, u, 0, i % 2 ? 1.9 : 0.1, *t += 1000000);
    for (int i = 0; i < 25; i++)
        ig_router_observe_done(r, u, 1, (i % 2 ? 1.9 : 0.1) * 2, *t += 1000000);
    u->concurrency = 0; /* fit once more */
    ig_router_observe_done(r, u, 0, 1.0, *t);
}

/* The first tokens of the same attempts: 50 ms at RIF 0, and at RIF 1
 * first (a wait behind the one in service, about its 1 s service, plus
 * the prefill). 57 samples: the last one fits (every 8th does). */
static void first_tokens(ig_router_t *r, ig_router_upstream_t *u, double first, uint64_t *t)
{
    for (int i = 0; i < 32; i++)
        ig_router_observe_wait(r, u, 0, i % 2 ? 0.06 : 0.04, *t += 1000000);
    for (int i = 0; i < 25; i++)
        ig_router_observe_wait(r, u, 1, (i % 2 ? 1.2 : 0.8) * first, *t += 1000000);
}

/* A wait for a place seen at the first token lowers C: the hold's fit
 * alone says 2; a first token about one service time later at RIF 1 than
 * at RIF 0 says 1. A first token only stretched at RIF 1 (a batch slowdown
 * of the prefill, 50 to 80 ms), or not at all, is no wait, and C stays the
 * hold's. */
static void test_first_token_wait_lowers_c(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_init(&r, NULL);
    ig_router_upstream_t held, waited, stretched;
    uint64_t t = ns(0);
    ig_router_upstream_init(&held, "held", IG_ROUTER_SITE);
    one_slot_holds(&r, &held, &t);
    ig_router_upstream_init(&waited, "waited", IG_ROUTER_SITE);
    one_slot_holds(&r, &waited, &t);
    first_tokens(&r, &waited, 1.05, &t);
    ig_router_upstream_init(&stretched, "stretched", IG_ROUTER_SITE);
    one_slot_holds(&r, &stretched, &t);
    first_tokens(&r, &stretched, 0.08, &t);
    print_message("1 slot: C %.2f from the holds, %.2f with a wait at the first token, %.2f with a "
                  "slowdown there\n",
                  ig_router_concurrency(&held), ig_router_concurrency(&waited),
                  ig_router_concurrency(&stretched));
    assert_true(ig_router_concurrency(&held) >= 2);
    assert_true(ig_router_concurrency(&waited) == 1);
    assert_true(ig_router_concurrency(&stretched) == ig_router_concurrency(&held));
    assert_true(stretched.wait_c == 0);
    /* First tokens as fast at RIF 1 as at 0: no queue seen there either
     * (first_token_c 0 in /status), not the lower bound of 2. */
    ig_router_upstream_t flat;
    ig_router_upstream_init(&flat, "flat", IG_ROUTER_SITE);
    one_slot_holds(&r, &flat, &t);
    first_tokens(&r, &flat, 0.05, &t);
    assert_true(flat.wait_samples > 0 && flat.wait_c == 0);
    assert_true(ig_router_concurrency(&flat) == ig_router_concurrency(&held));
    /* A queue seen at the first token is a queue known (rule 5 of the
     * latency pick may pass over an upstream that would queue): one in
     * flight fills the 1 place; the hold's lower bound of 2 is no queue. */
    waited.inflight = 1;
    held.inflight = 2;
    assert_true(ig_router_would_queue(&waited));
    assert_false(ig_router_would_queue(&held));
    /* An upstream that reports its slots learns nothing here. */
    ig_router_upstream_t reported;
    ig_router_upstream_init(&reported, "reported", IG_ROUTER_SITE);
    reported.slots = 4;
    first_tokens(&r, &reported, 1.05, &t);
    assert_true(reported.wait_samples == 0 && ig_router_concurrency(&reported) == 4);
}

static void test_concurrency_converges(void **state)
{
    (void)state;
    static const int slots[] = {1, 2, 4, 8, 16};
    for (size_t k = 0; k < sizeof(slots) / sizeof(slots[0]); k++) {
        ig_router_t r;
        ig_router_upstream_t u;
        one_site(&r, &u, "sim");
        sim_t s;
        sim_init(&s, slots[k], 0.020);
        /* Light load first (the unqueued hold), then heavy (the queue). */
        run_open(&r, &u, &s, 0.3, 2000);
        double end = run_open(&r, &u, &s, 0.9, 6000);
        double c = ig_router_concurrency(&u);
        print_message("slots %d: learned concurrency %.2f\n", slots[k], c);
        assert_true(c >= 0.7 * slots[k] && c <= 1.35 * slots[k] + 0.5);
        /* The order the answers ended in bounds C from below: this queue
         * serves in order, so no answer ends before fewer than rif + 1 -
         * slots of those in flight when it began, and the bound is at most
         * the slots (a bound above them is an order a queue cannot
         * produce); exponential service lets short answers pass long ones
         * often enough that it comes near them. */
        double bound = ig_router_order_c(&u, ns(end));
        print_message("  the order allows C >= %.0f\n", bound);
        assert_true(bound <= slots[k] && bound >= 0.5 * slots[k]);
        /* The wait it predicts for a request behind 2 x slots in flight:
         * about (slots + 1) / slots service times (M/M/c: (k + 1 - c) / c). */
        u.inflight = 2 * slots[k];
        double want = (slots[k] + 1.0) / slots[k] * 0.020;
        double w = ig_router_wait(&r, &u, ns(1000));
        print_message("  wait behind %d: %.4f s (M/M/c %.4f s)\n", u.inflight, w, want);
        assert_true(w > 0.6 * want && w < 1.6 * want);
        u.inflight = 0;
    }
}

/* A batch slowdown is not a queue: a 16-slot upstream where each job in
 * service slows a new one by 15% (2.8x at 12), at a quarter of its
 * capacity, so that nothing waits. Its holds rise with the requests in
 * flight as a queue's would, and without the order the fit takes that
 * for a narrow upstream; with it, short answers that pass long ones show
 * that many ran at once, and C is at least that. */
static void test_slowdown_not_a_queue(void **state)
{
    (void)state;
    double c[2], bound = 0;
    for (int ordered = 0; ordered < 2; ordered++) {
        ig_router_t r;
        ig_router_upstream_t u;
        one_site(&r, &u, "sim");
        sim_t s;
        sim_init(&s, 16, 0.020);
        s.contention = 0.15;
        s.ordered = ordered;
        double end = run_open(&r, &u, &s, 0.25, 4000);
        c[ordered] = ig_router_concurrency(&u);
        if (ordered)
            bound = ig_router_order_c(&u, ns(end));
    }
    print_message("learned C %.2f without the order, %.2f with it (the order allows >= %.0f)\n",
                  c[0], c[1], bound);
    assert_true(c[1] >= bound);
    assert_true(bound >= 8);
    assert_true(c[0] < 8); /* the case this test is about: the fit alone reads a queue */
}

/* Before it has learned anything the router assumes one place, as the
 * old model did (it errs toward spreading); a second upstream learned as
 * 8-wide is preferred at the same in-flight count. */
static void test_learned_beats_unknown(void **state)
{
    (void)state;
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    ig_router_t r;
    ig_router_init(&r, &o);
    ig_router_upstream_t wide, unknown;
    ig_router_upstream_init(&wide, "wide", IG_ROUTER_SITE);
    ig_router_upstream_init(&unknown, "unknown", IG_ROUTER_SITE);
    wide.ready = unknown.ready = 1;
    ig_router_observe_rtt(&r, &wide, 0.0002, ns(0));
    ig_router_observe_rtt(&r, &unknown, 0.0002, ns(0));
    sim_t s;
    sim_init(&s, 8, 0.020);
    run_open(&r, &wide, &s, 0.3, 1000);
    run_open(&r, &wide, &s, 0.9, 4000);
    assert_true(ig_router_concurrency(&unknown) == 1);
    assert_true(ig_router_concurrency(&wide) > 5);
    /* Same service and RTT, both with 4 in flight. */
    for (int i = 0; i < 10; i++) {
        ig_router_observe_ttft(&r, &unknown, 10, 0.020, 0, ns(1000));
        ig_router_observe_ttft(&r, &wide, 10, 0.020, 0, ns(1000));
    }
    unknown.occupancy_s = 0.020;
    wide.inflight = unknown.inflight = 4;
    ig_router_upstream_t *ups[2] = {&unknown, &wide};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 2, 10, NULL, ns(1000), &d), 0);
    assert_int_equal(d.chosen, 1);
    assert_true(d.wait_s < 1e-9);
    assert_true(d.runner_up_wait_s > 0.05);
    assert_true(d.concurrency > 5 && d.runner_up_concurrency == 1);
}

/* Clients of a closed loop on one clock across phases: sends while the
 * limit allows until `until`; *late is the most in flight in the phase's
 * second half. */
static void run_closed_until(ig_router_t *r, ig_router_upstream_t *u, sim_t *s, int *waiting,
                             double *t, double until, int *late)
{
    double from = *t;
    *late = 0;
    while (*t < until) {
        while (*waiting > 0 && u->inflight < ig_router_limit(r, u)) {
            job_t j = {*t, u->inflight, s->ordered ? ig_router_order_begin(u, ns(*t)) : 0};
            ig_router_attempt_begin(r, u, ns(*t));
            sim_admit(s, j, *t);
            (*waiting)--;
        }
        if (*t > (from + until) / 2 && u->inflight > *late)
            *late = u->inflight;
        int e = sim_next_end(s);
        if (e < 0)
            break;
        *t = sim_finish(s, e, r, u);
        (*waiting)++;
    }
}

/* A closed loop of 32 clients on a 2-slot upstream: the limit calibrates
 * (one at a time until the base is known), then settles near the slots
 * (probing a little above them now and then), well under the clients,
 * and the rest would wait in the gateway. On a
 * 32-slot upstream the same clients all get through. */
static void run_closed(ig_router_t *r, ig_router_upstream_t *u, sim_t *s, int clients, double secs,
                       int *max_inflight_late)
{
    double t = 0;
    int waiting = clients; /* clients with a request not yet sent */
    run_closed_until(r, u, s, &waiting, &t, secs, max_inflight_late);
}

static void test_limit_settles(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_upstream_t u;
    one_site(&r, &u, "narrow");
    assert_int_equal(ig_router_limit(&r, &u), 1); /* calibrating */
    sim_t s;
    sim_init(&s, 2, 0.050);
    int late = 0;
    run_closed(&r, &u, &s, 32, 20.0, &late);
    print_message("2 slots: limit %d (%s, %llu moves), most in flight late %d\n",
                  ig_router_limit(&r, &u), u.limit_reason, (unsigned long long)u.limit_changes,
                  late);
    /* Every RIF_STALE_S the buckets above the limit are forgotten, C is
     * then only a lower bound, and the limit probes upward until the queue
     * shows again: to 7 in this seeded run; more would mean the probe
     * does not stop when the queue is there. */
    assert_true(late >= 2 && late <= 7);
    assert_true(u.limit_changes > 0);

    ig_router_upstream_t w;
    ig_router_upstream_init(&w, "wide", IG_ROUTER_SITE);
    w.ready = 1;
    ig_router_observe_rtt(&r, &w, 0.0002, ns(0));
    sim_init(&s, 32, 0.050);
    run_closed(&r, &w, &s, 32, 20.0, &late);
    print_message("32 slots: limit %d (%s), most in flight late %d\n", ig_router_limit(&r, &w),
                  w.limit_reason, late);
    assert_true(late >= 28);
}

/* A closed loop on one simulated upstream, and its clock. */
typedef struct {
    ig_router_t r;
    ig_router_upstream_t u;
    sim_t s;
    int waiting, late;
    double t;
} loop_t;

/* 12 clients on a 4-slot upstream (20 ms) for 5 quiet seconds: every
 * slot in use by the end. */
static void four_slots_busy(loop_t *b, const char *name)
{
    one_site(&b->r, &b->u, name);
    sim_init(&b->s, 4, 0.020);
    b->waiting = 12;
    b->t = 0;
    run_closed_until(&b->r, &b->u, &b->s, &b->waiting, &b->t, 5.0, &b->late);
    print_message("quiet: limit %d, C %.2f, most in flight late %d\n",
                  ig_router_limit(&b->r, &b->u), ig_router_concurrency(&b->u), b->late);
    assert_true(b->late >= 4);
}

/* A machine-wide slowdown is not a queue to remember. 12 clients on a
 * 4-slot upstream (20 ms); for 4 s the machine is contended, each job in
 * service slowing a new one by 60%, so holds rise with the in-flight count
 * as behind a queue of one or two places; then it is quiet again. The
 * buckets above what the shrunken limit lets in would keep the slow
 * phase's holds for ever: the fit forgets buckets no sample reached for
 * RIF_STALE_S, the limit climbs back while no queue shows, and within 4 s
 * all 4 slots are used again (bench/routing-foreign.sh ended 35 of 157
 * runs with a limit of 2-3 on such upstreams). */
static void test_limit_recovers_after_slowdown(void **state)
{
    (void)state;
    loop_t b;
    four_slots_busy(&b, "slowed");
    b.s.contention = 0.6;
    run_closed_until(&b.r, &b.u, &b.s, &b.waiting, &b.t, 9.0, &b.late);
    print_message("contended: limit %d, C %.2f, most in flight late %d\n",
                  ig_router_limit(&b.r, &b.u), ig_router_concurrency(&b.u), b.late);
    b.s.contention = 0;
    run_closed_until(&b.r, &b.u, &b.s, &b.waiting, &b.t, 13.0, &b.late);
    print_message("quiet again: limit %d (%s), C %.2f, most in flight late %d\n",
                  ig_router_limit(&b.r, &b.u), b.u.limit_reason, ig_router_concurrency(&b.u),
                  b.late);
    assert_true(b.late >= 4);
    assert_true(ig_router_limit(&b.r, &b.u) >= 4);
    assert_true(ig_router_concurrency(&b.u) >= 3);
}

/* The whole machine twice as slow for a while: every hold doubles, at
 * every in-flight count, and the upstream queues no more than before. 12
 * clients on a 4-slot upstream (20 ms). The holds are then twice the
 * baseline (bucket 0 gets no fresh sample while the clients keep it busy),
 * so 2 x X_max x baseline equals the limit itself: the limit drifts down
 * (to 2 in this seeded run; not asserted, the part of issue 12 still
 * open). Asserted: 2 simulated seconds after the slowdown ends (about 20
 * windows) the limit is at least the 4 slots again and they are used, and
 * it is still 9 s after (bench/routing-foreign.sh ended 35 of 157 runs with
 * a limit of 2-3 on such upstreams). */
static void test_limit_back_after_machine_slowdown(void **state)
{
    (void)state;
    loop_t b;
    four_slots_busy(&b, "machine");
    b.s.slow = 1.0;
    int least = INT32_MAX;
    while (b.t < 11.0) {
        run_closed_until(&b.r, &b.u, &b.s, &b.waiting, &b.t, b.t + 0.1, &b.late);
        if (ig_router_limit(&b.r, &b.u) < least)
            least = ig_router_limit(&b.r, &b.u);
    }
    print_message("holds doubled 6 s: least limit %d, limit %d (%s), C %.2f\n", least,
                  ig_router_limit(&b.r, &b.u), b.u.limit_reason, ig_router_concurrency(&b.u));
    b.s.slow = 0;
    run_closed_until(&b.r, &b.u, &b.s, &b.waiting, &b.t, 13.0, &b.late);
    print_message("2 s after: limit %d (%s), C %.2f, most in flight late %d\n",
                  ig_router_limit(&b.r, &b.u), b.u.limit_reason, ig_router_concurrency(&b.u),
                  b.late);
    assert_true(ig_router_limit(&b.r, &b.u) >= 4);
    assert_true(b.late >= 4);
    run_closed_until(&b.r, &b.u, &b.s, &b.waiting, &b.t, 20.0, &b.late);
    print_message("9 s after: limit %d (%s), most in flight late %d\n", ig_router_limit(&b.r, &b.u),
                  b.u.limit_reason, b.late);
    assert_true(ig_router_limit(&b.r, &b.u) >= 4);
}

/* A truly saturated upstream keeps a limit near its slots: 2 slots
 * (50 ms) offered 8x what they serve (16 clients always waiting). The
 * throughput target is about 2 x 2 = 4 there and the floor 1.25 x C + 1
 * about 3.5; forgetting the stale buckets above the limit (RIF_STALE_S)
 * lets it probe a little higher until the queue shows again, up to 7 in
 * test_limit_settles. Bound: 2 x slots + 3 = 7, checked every 100 ms over
 * the second half of 20 s, so a probe that does not stop at the queue
 * fails it. */
static void test_limit_bounded_when_saturated(void **state)
{
    (void)state;
    ig_router_t r;
    ig_router_upstream_t u;
    one_site(&r, &u, "saturated");
    sim_t s;
    sim_init(&s, 2, 0.050);
    int waiting = 16, late = 0, most = 0;
    double t = 0;
    run_closed_until(&r, &u, &s, &waiting, &t, 10.0, &late);
    while (t < 20.0) {
        run_closed_until(&r, &u, &s, &waiting, &t, t + 0.1, &late);
        if (ig_router_limit(&r, &u) > most)
            most = ig_router_limit(&r, &u);
    }
    print_message("2 slots, 16 clients: most limit late %d, limit %d (%s), in flight %d\n", most,
                  ig_router_limit(&r, &u), u.limit_reason, late);
    assert_true(most >= 2 && most <= 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrency_converges),
        cmocka_unit_test(test_wide_not_taken_for_narrow),
        cmocka_unit_test(test_unlucky_bucket_not_a_queue),
        cmocka_unit_test(test_busy_from_start_not_narrow),
        cmocka_unit_test(test_first_token_wait_lowers_c),
        cmocka_unit_test(test_slowdown_not_a_queue),
        cmocka_unit_test(test_learned_beats_unknown),
        cmocka_unit_test(test_limit_settles),
        cmocka_unit_test(test_limit_recovers_after_slowdown),
        cmocka_unit_test(test_limit_back_after_machine_slowdown),
        cmocka_unit_test(test_limit_bounded_when_saturated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
