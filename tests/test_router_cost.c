/* The router's cost model, policies, ejection and retry budget, driven by a
 * synthetic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "infergate/error.h"
#include "infergate/router.h"
#include "router_fixture.h"

#define S(x) ((uint64_t)((x)*1e9))

static void ready_upstream(ig_router_upstream_t *u, const char *name,
                           ig_router_upstream_kind_t kind)
{
    ig_router_upstream_init(u, name, kind);
    u->ready = 1;
}

static void test_peak_ewma_rtt(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u;
    ready_upstream(&u, "a", IG_ROUTER_LOCAL);
    ig_router_observe_rtt(&r, &u, 0.010, S(1));
    assert_true(fabs(u.rtt_s - 0.010) < 1e-12);
    /* A slower sample takes over at once. */
    ig_router_observe_rtt(&r, &u, 0.100, S(2));
    assert_true(fabs(u.rtt_s - 0.100) < 1e-12);
    /* A faster one decays in with weight e^(-dt/tau): after tau the old
     * value keeps 1/e. */
    ig_router_observe_rtt(&r, &u, 0.010, S(12));
    double w = exp(-1.0);
    assert_true(fabs(u.rtt_s - (0.100 * w + 0.010 * (1 - w))) < 1e-9);
}

static void test_probe_median_ignores_one_late_probe(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u;
    ready_upstream(&u, "a", IG_ROUTER_SITE);
    ig_router_observe_probe_rtt(&r, &u, 0.001, S(1));
    ig_router_observe_probe_rtt(&r, &u, 0.001, S(2));
    ig_router_observe_probe_rtt(&r, &u, 0.001, S(3));
    /* One probe late by 100 ms: the path is not taken to be slow. */
    ig_router_observe_probe_rtt(&r, &u, 0.100, S(4));
    assert_true(u.rtt_s < 0.002);
    /* Two in a row: it is. */
    ig_router_observe_probe_rtt(&r, &u, 0.100, S(5));
    assert_true(fabs(u.rtt_s - 0.100) < 1e-9);
}

static void test_reported_queue_not_counted_twice(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u;
    ready_upstream(&u, "a", IG_ROUTER_LOCAL);
    u.slots = 2;
    u.occupancy_s = 1.0;
    u.inflight = 4;         /* 2 running, 2 of ours waiting there */
    u.reported_waiting = 2; /* the same 2, as the upstream reports them */
    u.reported_at_ns = S(1);
    /* A new request is third in line: 3 x 1 s / 2 slots. */
    assert_true(fabs(ig_router_wait(&r, &u, S(1)) - 1.5) < 1e-9);
    /* Other clients' requests wait there too: the report wins. */
    u.reported_waiting = 6;
    assert_true(fabs(ig_router_wait(&r, &u, S(1)) - 3.0) < 1e-9);
}

/* A worker's reported wait drains as time passes; a site's stands. */
static void test_worker_wait_drains(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t w, site;
    ready_upstream(&w, "w", IG_ROUTER_LOCAL);
    ready_upstream(&site, "site", IG_ROUTER_SITE);
    w.reported_wait_s = site.reported_wait_s = 0.100; /* a prefill under way */
    w.reported_at_ns = site.reported_at_ns = S(1);
    w.reported_wait_drains = 1;
    assert_true(fabs(ig_router_wait(&r, &w, S(1)) - 0.100) < 1e-9);
    assert_true(fabs(ig_router_wait(&r, &w, S(1.06)) - 0.040) < 1e-9);
    assert_true(ig_router_wait(&r, &w, S(1.2)) == 0.0);
    assert_true(fabs(ig_router_wait(&r, &site, S(1.06)) - 0.100) < 1e-9);
    /* The pick sees it too: of two equal workers, the one whose report is
     * older has less of its prefill left. */
    ig_router_upstream_t a, b;
    ready_upstream(&a, "a", IG_ROUTER_LOCAL);
    ready_upstream(&b, "b", IG_ROUTER_LOCAL);
    a.reported_wait_s = b.reported_wait_s = 0.100;
    a.reported_wait_drains = b.reported_wait_drains = 1;
    a.reported_at_ns = S(1);
    b.reported_at_ns = S(1.05);
    ig_router_upstream_t *ups[] = {&a, &b};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 2, 0, NULL, S(1.06), &d), 0);
    assert_int_equal(d.chosen, 0);
    b.reported_at_ns = S(1);
    a.reported_at_ns = S(1.05);
    assert_int_equal(ig_router_pick(&r, ups, 2, 0, NULL, S(1.06), &d), 0);
    assert_int_equal(d.chosen, 1);
}

static void test_service_time_never_collapses(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u;
    ready_upstream(&u, "a", IG_ROUTER_LOCAL);
    ig_router_observe_rtt(&r, &u, 0.001, S(1));
    /* The router predicted more wait than the whole TTFT: still a quarter
     * of what was seen counts as service. */
    for (int i = 0; i < 20; i++)
        ig_router_observe_ttft(&r, &u, 10, 0.101, 0.5, S(1));
    assert_true(u.svc_s > 0.024 && u.svc_s < 0.026);
}

static void test_cost_prefers_faster_service(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t fast, slow;
    ready_upstream(&fast, "fast", IG_ROUTER_LOCAL);
    ready_upstream(&slow, "slow", IG_ROUTER_LOCAL);
    for (int i = 0; i < 10; i++) {
        ig_router_observe_ttft(&r, &fast, 100, 0.010, 0, S(1));
        ig_router_observe_ttft(&r, &slow, 100, 0.030, 0, S(1));
    }
    double cf = ig_router_cost(&r, &fast, 100, S(1));
    double cs = ig_router_cost(&r, &slow, 100, S(1));
    assert_true(cf < cs);
    /* The service time scales with the prompt: 4x the tokens costs more. */
    assert_true(ig_router_cost(&r, &fast, 400, S(1)) > cf * 2);

    ig_router_upstream_t *ups[2] = {&slow, &fast};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 2, 100, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
    assert_int_equal(d.runner_up, 0);
    assert_true(d.cost_s < d.runner_up_cost_s);
}

/* An upstream that has served only whole answers has no time to first
 * token (the proxy learns one at a stream's first content token): its
 * cost counts its unqueued hold as the request's own time, not the prior
 * prefill rate that made a 0.8 s upstream cost what a 0.2 s one does. */
static void test_whole_answers_cost_their_hold(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t fast, slow;
    ready_upstream(&fast, "fast", IG_ROUTER_LOCAL);
    ready_upstream(&slow, "slow", IG_ROUTER_LOCAL);
    double prior = ig_router_cost(&r, &slow, 100, S(1));
    for (int i = 0; i < 10; i++) {
        ig_router_observe_done(&r, &fast, 0, 0.2, S(1) + i);
        ig_router_observe_done(&r, &slow, 0, 0.8, S(1) + i);
    }
    double cf = ig_router_cost(&r, &fast, 100, S(2));
    double cs = ig_router_cost(&r, &slow, 100, S(2));
    print_message("prior %.3f s; whole answers of 0.2 and 0.8 s: cost %.3f and %.3f s\n", prior, cf,
                  cs);
    assert_true(prior < 0.1);
    assert_true(fabs(cf - 0.2) < 0.02 && fabs(cs - 0.8) < 0.02);
    ig_router_upstream_t *ups[2] = {&slow, &fast};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 2, 100, NULL, S(2), &d), 0);
    assert_int_equal(d.chosen, 1);
    /* Where part of the prompt is cached, the rest is priced at the prior
     * rate (2,000 tokens a second): 20 of 100 tokens, 10 ms. */
    slow.cached_tokens = 80;
    assert_true(fabs(ig_router_cost(&r, &slow, 100, S(2)) - 0.01) < 0.002);
    slow.cached_tokens = 0;
    /* A stream's time to first token, once there is one, is the service
     * time again. */
    ig_router_observe_ttft(&r, &slow, 100, 0.030, 0, S(2));
    assert_true(ig_router_cost(&r, &slow, 100, S(2)) < 0.05);
}

static void test_remote_site_only_when_faster(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t local, site;
    ready_upstream(&local, "local", IG_ROUTER_LOCAL);
    ready_upstream(&site, "eu-west", IG_ROUTER_SITE);
    ig_router_observe_rtt(&r, &local, 0.0005, S(1));
    ig_router_observe_rtt(&r, &site, 0.040, S(1));
    for (int i = 0; i < 8; i++) {
        ig_router_observe_ttft(&r, &local, 50, 0.0205, 0, S(1));
        ig_router_observe_ttft(&r, &site, 50, 0.060, 0, S(1));
    }
    ig_router_upstream_t *ups[2] = {&local, &site};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 2, 50, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);

    /* The local pool reports a deep queue: now the site is faster. */
    local.slots = 4;
    local.occupancy_s = 1.0;
    local.reported_waiting = 8;
    local.reported_at_ns = S(1);
    assert_int_equal(ig_router_pick(&r, ups, 2, 50, NULL, S(1.5), &d), 0);
    assert_int_equal(d.chosen, 1);
    /* A stale report is not believed. */
    assert_int_equal(ig_router_pick(&r, ups, 2, 50, NULL, S(30), &d), 0);
    assert_int_equal(d.chosen, 0);
}

static void test_hot_guard(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t a, b, c;
    ready_upstream(&a, "a", IG_ROUTER_LOCAL);
    ready_upstream(&b, "b", IG_ROUTER_LOCAL);
    ready_upstream(&c, "c", IG_ROUTER_LOCAL);
    /* a is the cheapest by far, but carries more in flight than the others:
     * it is hot, and the cheapest cold one wins. */
    a.svc_samples = b.svc_samples = c.svc_samples = 1;
    a.svc_s = 0.001;
    b.svc_s = 0.050;
    c.svc_s = 0.020;
    a.slots = b.slots = c.slots = 64; /* wait stays 0 */
    a.inflight = 5;
    b.inflight = 1;
    c.inflight = 1;
    ig_router_upstream_t *ups[3] = {&a, &b, &c};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 3, 10, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 2);
    /* Equal load: nobody is hot, the cheapest wins. */
    a.inflight = 1;
    assert_int_equal(ig_router_pick(&r, ups, 3, 10, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
    assert_int_equal(d.hot, 0);
}

/* Two local upstreams that report their slots, 0.2 ms away: a narrow one
 * (4 places held 0.4 s: 100 ms a step; a 20 ms TTFT) and a wide one (16
 * held 0.8 s: 50 ms a step; 30 ms), with the given requests in flight. A
 * latency router without the tail term: the queue alone. */
static void narrow_and_wide(ig_router_t *r, ig_router_upstream_t *narrow,
                            ig_router_upstream_t *wide, int narrow_inflight, int wide_inflight)
{
    *r = ig_trouter(IG_ROUTE_LATENCY);
    r->opts.tail_weight = 0;
    ready_upstream(narrow, "narrow", IG_ROUTER_LOCAL);
    ready_upstream(wide, "wide", IG_ROUTER_LOCAL);
    ig_router_upstream_t *u2[2] = {narrow, wide};
    for (int i = 0; i < 2; i++) {
        ig_router_observe_rtt(r, u2[i], 0.0002, S(1));
        u2[i]->svc_samples = 32;
    }
    narrow->slots = 4;
    narrow->occupancy_s = 0.4;
    narrow->svc_s = 0.020;
    narrow->inflight = narrow_inflight;
    wide->slots = 16;
    wide->occupancy_s = 0.8;
    wide->svc_s = 0.030;
    wide->inflight = wide_inflight;
}

/* The latency pick ranks by the shortest expected delay: every request
 * in flight counts, a step of hold / C each, not only those beyond C. A
 * 4-wide upstream (a place held 0.4 s: 100 ms a step) with one in flight
 * and a 20 ms TTFT, against a 16-wide one (0.8 s: 50 ms a step) with two
 * and 30 ms: 0.2 + 2 x 100 + 20 = 220 ms against 0.2 + 3 x 50 + 30 = 180 ms,
 * the wide one, though neither queues and the narrow one answers sooner
 * alone (the queue beyond C alone chose the narrow one). The cost reported
 * stays the plain predicted TTFT. */
static void test_sed_counts_every_request_in_flight(void **state)
{
    ig_router_t r;
    ig_router_upstream_t narrow, wide;
    narrow_and_wide(&r, &narrow, &wide, 1, 2); /* the spread: test_tail_prefers_steadier */
    ig_router_upstream_t *u2[2] = {&narrow, &wide};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
    assert_float_equal(d.cost_s, 0.0002 + 0.030, 1e-9); /* no wait: the plain prediction */
    /* Twelve on the wide one, three on the narrow one (neither is hot: the
     * narrow one is as full, the wide one has more): 0.2 + 13 x 50 + 30 =
     * 680 ms against 0.2 + 4 x 100 + 20 = 420 ms, the narrow one. */
    wide.inflight = 12;
    narrow.inflight = 3;
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
}

/* Rule 6: a free place that is known beats a queue that is known. The
 * narrow upstream of the test above at its 4 places (520 ms by SED) beside
 * the wide one at 12 of its 16 (680 ms): SED takes the narrow one, where
 * the request would wait, while a place at the wide one starts it at once
 * (30.2 ms without the queue term). */
static void test_free_place_beats_known_queue(void **state)
{
    ig_router_t r;
    ig_router_upstream_t narrow, wide;
    narrow_and_wide(&r, &narrow, &wide, 4, 12);
    ig_router_upstream_t *u2[2] = {&narrow, &wide};
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
    assert_int_equal(d.runner_up, 0); /* the queue it was spared */

    /* A place reported free but with a queue reported: none is free. */
    wide.reported_at_ns = S(1);
    wide.reported_waiting = 1;
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
    wide.reported_waiting = 0;

    /* The narrow one reports nothing; its holds put a queue at C 4 (a
     * step of 100 ms again). A batch slowdown reads as such a queue in
     * the holds, so it is not believed: SED's pick stands. */
    narrow.slots = 0;
    narrow.occupancy_s = 0;
    narrow.concurrency = 4;
    narrow.hold_base_s = narrow.hold_svc_s = 0.4;
    assert_true(ig_router_would_queue(&narrow));
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
    /* Its first tokens showed the queue at 4 too: the free place wins. */
    narrow.wait_c = 4;
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);

    /* A free place that is no sooner than the queue does not win: the wide
     * one 600 ms away (630 ms against 520 ms). */
    ig_router_observe_rtt(&r, &wide, 0.6, S(1));
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
}

/* An upstream with no hold sample yet takes the median step of the others:
 * a new one (nothing learned) is neither free nor avoided. Four with one
 * in flight each (nobody is hot), three with a step of 100 ms, the last
 * one new: with a step of 0 it would cost 20 ms and win every pick; with
 * the others' 100 ms it costs what they cost, 220 ms, and equal costs take
 * turns: over 8 picks it gets its quarter. */
static void test_new_upstream_takes_peers_step(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u[4];
    ig_router_upstream_t *ups[4];
    for (int i = 0; i < 4; i++) {
        ready_upstream(&u[i], "u", IG_ROUTER_LOCAL);
        ups[i] = &u[i];
        ig_router_observe_rtt(&r, &u[i], 0.0002, S(1));
        u[i].svc_samples = 32;
        u[i].svc_s = 0.020;
        u[i].slots = 4;
        u[i].occupancy_s = i < 3 ? 0.4 : 0;
        u[i].inflight = 1;
    }
    int chosen[4] = {0};
    for (int k = 0; k < 8; k++) {
        ig_route_decision_t d;
        assert_int_equal(ig_router_pick(&r, ups, 4, 0, NULL, S(1), &d), 0);
        chosen[d.chosen]++;
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(chosen[i], 2);
}

/* A worker never sent a prompt, which reports no prefill rate yet, is
 * priced at its peer's measured service per token, not at the prior rate
 * (2,000 tokens/s against a peer measured at 8,000 kept every request off
 * it for good): it takes a prompt when the peer reports a prefill under
 * way, and a prompt the peer holds still goes to the peer; its own report,
 * once it has one, comes before the peer's figure. */
static void test_new_upstream_takes_peers_service(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t fresh, known;
    ready_upstream(&fresh, "fresh", IG_ROUTER_LOCAL);
    ready_upstream(&known, "known", IG_ROUTER_LOCAL);
    ig_router_upstream_t *ups[2] = {&fresh, &known};
    for (int i = 0; i < 2; i++) {
        ig_router_observe_rtt(&r, ups[i], 0.001, S(1));
        ups[i]->slots = 16;
        ups[i]->reported_at_ns = S(1);
        ups[i]->kv_blocks = 112;
    }
    known.svc_samples = 8;
    known.svc_weight = 0; /* no noise: the costs decide */
    known.svc_s = 0.068;
    known.svc_tokens = 536;
    known.reported_prefill_tps = 8000;
    known.occupancy_s = 0.08;
    known.reported_wait_s = 0.050; /* another gateway's prefill under way */
    ig_route_peers_t peers;
    ig_router_peers(&r, ups, 2, NULL, S(1), &peers);
    assert_float_equal(peers.svc_unit_s, 0.068 / (536 + 32), 1e-12);
    assert_float_equal(peers.step_s, 0.08 / 16, 1e-12);
    ig_route_terms_t t;
    ig_router_terms(&r, &fresh, 536, &peers, S(1), &t);
    assert_float_equal(t.prefill_s, 0.068, 1e-9); /* the prior said 0.268 */
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 2, 536, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0); /* 5 + 68 ms against 50 + 68 */
    /* The peer holds the prompt's 512-token prefix: it keeps it. */
    known.cached_tokens = 512;
    assert_int_equal(ig_router_pick(&r, ups, 2, 536, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
    known.cached_tokens = 0;
    /* Its own report of a slow prefill comes first. */
    fresh.reported_prefill_tps = 1000;
    assert_int_equal(ig_router_pick(&r, ups, 2, 536, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
}

/* An upstream never measured is priced at its peers' service; an attempt
 * there cancelled before its first token (a hedge elsewhere won) says it
 * took longer than it ran. A bound above the belief is learned, so the
 * pick moves to the measured peer; one below it changes nothing. */
static void test_lost_race_is_learned(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t fresh, known;
    ready_upstream(&fresh, "fresh", IG_ROUTER_LOCAL);
    ready_upstream(&known, "known", IG_ROUTER_LOCAL);
    ig_router_upstream_t *ups[2] = {&fresh, &known};
    ig_router_observe_rtt(&r, &fresh, 0.0001, S(1));
    ig_router_observe_rtt(&r, &known, 0.0002, S(1));
    ig_router_observe_ttft(&r, &known, 40, 0.0022, 0, S(1));
    known.svc_weight = 0; /* no noise: the costs decide */
    ig_route_decision_t d;
    /* Priced as its peer, and nearer: the fresh one is the pick. */
    assert_int_equal(ig_router_pick(&r, ups, 2, 40, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
    /* A bound below what it is believed to take says nothing. */
    ig_router_observe_ttft_above(&r, &fresh, 40, 0.0001, 0, S(1));
    assert_int_equal(fresh.svc_samples, 0);
    /* It lost a race after 4 ms, twice what its peer takes. */
    ig_router_observe_ttft_above(&r, &fresh, 40, 0.004, 0, S(1));
    assert_int_equal(fresh.svc_samples, 1);
    assert_true(fresh.svc_s > known.svc_s);
    fresh.svc_weight = 0;
    assert_int_equal(ig_router_pick(&r, ups, 2, 40, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
    /* Measured now, a bound below its own estimate is no sample. */
    ig_router_observe_ttft_above(&r, &fresh, 40, 0.002, 0, S(2));
    assert_int_equal(fresh.svc_samples, 1);
}

/* tail_weight standard deviations of the TTFT are added to the rank: of
 * two upstreams with about the same mean the steadier wins; the reported
 * cost stays the plain prediction. */
static void test_tail_prefers_steadier(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    r.opts.tail_weight = 1; /* off by default */
    ig_router_upstream_t steady, jumpy;
    ready_upstream(&steady, "steady", IG_ROUTER_LOCAL);
    ready_upstream(&jumpy, "jumpy", IG_ROUTER_LOCAL);
    ig_router_upstream_t *u2[2] = {&steady, &jumpy};
    for (int i = 0; i < 2; i++) {
        ig_router_observe_rtt(&r, u2[i], 0.001, S(1));
        u2[i]->svc_samples = 32;
    }
    steady.svc_s = 0.030, steady.svc_dev_s = 0.001; /* spread 1.25 ms */
    jumpy.svc_s = 0.025, jumpy.svc_dev_s = 0.020;   /* spread 25 ms */
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0); /* 31 + 1.25 ms against 26 + 25 */
    assert_float_equal(d.cost_s, 0.001 + 0.030, 1e-9);
    r.opts.tail_weight = 0; /* off: the mean alone */
    assert_int_equal(ig_router_pick(&r, u2, 2, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
}

/* Costs closer than the noise of the cheapest's service estimate are a
 * tie, and the least utilised of them wins: three upstreams, 4, 4 and 8
 * wide, one request in flight on each, whose 20 ms exponential service is
 * estimated at 19, 20 and 21 ms (an EWMA of weight 1/16: 4.8 ms of noise
 * in a difference). A clearly faster estimate still wins. */
static void test_noise_tie_goes_to_least_loaded(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u[3];
    ig_router_upstream_t *ups[3] = {&u[0], &u[1], &u[2]};
    const double width[3] = {4, 4, 8};
    for (int i = 0; i < 3; i++) {
        ready_upstream(&u[i], "u", IG_ROUTER_LOCAL);
        ig_router_observe_rtt(&r, &u[i], 0.001, S(1));
        u[i].concurrency = width[i];
        u[i].svc_samples = 32;
        u[i].svc_weight = 1.0 / 16;
        u[i].svc_s = 0.019 + 0.001 * i;
        u[i].svc_dev_s = 0.015;
        u[i].inflight = 1;
    }
    ig_route_decision_t d;
    assert_int_equal(ig_router_pick(&r, ups, 3, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 2);
    assert_int_equal(d.runner_up, 0); /* the cheapest of the others */
    assert_int_equal(d.hot, 0);
    /* Estimates known exactly (weight 0): the cheapest, as before. */
    for (int i = 0; i < 3; i++)
        u[i].svc_weight = 0;
    assert_int_equal(ig_router_pick(&r, ups, 3, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
    /* 10 ms against 20: beyond the noise, the busier one wins. */
    for (int i = 0; i < 3; i++)
        u[i].svc_weight = 1.0 / 16;
    u[0].svc_s = 0.010;
    u[0].svc_dev_s = 0.0075;
    assert_int_equal(ig_router_pick(&r, ups, 3, 0, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 0);
}

static void test_policies_and_exclusion(void **state)
{
    ig_router_upstream_t a, b, c;
    ready_upstream(&a, "a", IG_ROUTER_LOCAL);
    ready_upstream(&b, "b", IG_ROUTER_LOCAL);
    ready_upstream(&c, "c", IG_ROUTER_LOCAL);
    ig_router_upstream_t *ups[3] = {&a, &b, &c};
    ig_route_decision_t d;

    ig_router_t rr = ig_trouter(IG_ROUTE_ROUND_ROBIN);
    int seen[3] = {0};
    for (int i = 0; i < 9; i++) {
        assert_int_equal(ig_router_pick(&rr, ups, 3, 10, NULL, S(1), &d), 0);
        seen[d.chosen]++;
    }
    assert_int_equal(seen[0], 3);
    assert_int_equal(seen[1], 3);
    assert_int_equal(seen[2], 3);

    ig_router_t li = ig_trouter(IG_ROUTE_LEAST_INFLIGHT);
    a.inflight = 3;
    b.inflight = 0;
    c.inflight = 2;
    assert_int_equal(ig_router_pick(&li, ups, 3, 10, NULL, S(1), &d), 0);
    assert_int_equal(d.chosen, 1);
    unsigned char exclude[3] = {0, 1, 0};
    assert_int_equal(ig_router_pick(&li, ups, 3, 10, exclude, S(1), &d), 0);
    assert_int_equal(d.chosen, 2);

    ig_router_t rnd = ig_trouter(IG_ROUTE_RANDOM);
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < 300; i++) {
        assert_int_equal(ig_router_pick(&rnd, ups, 3, 10, NULL, S(1), &d), 0);
        seen[d.chosen]++;
    }
    for (int i = 0; i < 3; i++)
        assert_true(seen[i] > 60);

    /* Not ready, draining or all excluded: nothing to pick. */
    a.ready = 0;
    b.draining = 1;
    unsigned char only_c[3] = {0, 0, 1};
    assert_int_equal(ig_router_pick(&li, ups, 3, 10, only_c, S(1), &d), IG_ENOUPSTREAM);

    ig_route_policy_t p;
    assert_int_equal(ig_route_policy_parse("least_inflight", &p), 0);
    assert_int_equal(p, IG_ROUTE_LEAST_INFLIGHT);
    assert_int_equal(ig_route_policy_parse("fastest", &p), IG_EINVAL);
}

static void test_ejection_and_half_open(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u;
    ready_upstream(&u, "u", IG_ROUTER_SITE);
    /* 4xx never counts against an upstream, nor does backpressure. */
    for (int i = 0; i < 20; i++) {
        ig_router_attempt_begin(&r, &u, S(1));
        ig_router_attempt_end(&r, &u, i % 2 ? IG_OUTCOME_CLIENT_ERROR : IG_OUTCOME_BACKPRESSURE, 0,
                              S(1));
    }
    assert_true(ig_router_eligible(&u, S(1)));
    /* Four failures in a row: still in; the fifth ejects it for 2 s. */
    for (int i = 0; i < 5; i++) {
        assert_true(ig_router_eligible(&u, S(1)));
        assert_int_equal(ig_router_attempt_begin(&r, &u, S(1)), 0);
        ig_router_attempt_end(&r, &u, IG_OUTCOME_FAILURE, 0, S(1));
    }
    assert_false(ig_router_eligible(&u, S(2)));
    assert_int_equal(u.inflight, 0);
    /* After 2 s: half-open, one trial at a time. */
    assert_true(ig_router_eligible(&u, S(3.1)));
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(3.1)), 1);
    assert_false(ig_router_eligible(&u, S(3.1)));
    /* The trial fails: ejected again, for twice as long. */
    ig_router_attempt_end(&r, &u, IG_OUTCOME_FAILURE, 1, S(3.2));
    assert_false(ig_router_eligible(&u, S(7.1)));
    assert_true(ig_router_eligible(&u, S(7.3)));
    /* The next trial succeeds: back in, backoff forgotten. */
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(7.3)), 1);
    ig_router_attempt_end(&r, &u, IG_OUTCOME_SUCCESS, 1, S(7.4));
    assert_true(ig_router_eligible(&u, S(7.4)));
    assert_int_equal(u.ejected_until_ns, 0);
    assert_int_equal(u.ejections, 0);
}

static void test_retry_budget(void **state)
{
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.retry_ratio = 0.2;
    o.retry_min_per_s = 0; /* only deposits count */
    ig_router_t r;
    ig_router_init(&r, &o);
    assert_false(ig_router_budget_take(&r, S(1)));
    for (int i = 0; i < 10; i++)
        ig_router_budget_deposit(&r, S(1));
    /* 10 requests x 0.2 = 2 retries, not 3. */
    assert_true(ig_router_budget_take(&r, S(1)));
    assert_true(ig_router_budget_take(&r, S(1)));
    assert_false(ig_router_budget_take(&r, S(1)));

    /* The floor rate refills over time, up to a cap. */
    o.retry_min_per_s = 5;
    ig_router_init(&r, &o);
    while (ig_router_budget_take(&r, S(1)))
        ;
    assert_false(ig_router_budget_take(&r, S(1)));
    assert_true(ig_router_budget_take(&r, S(1.3)));
    int n = 0;
    while (ig_router_budget_take(&r, S(1000)) && n < 1000)
        n++;
    assert_true(n <= 10 * 5 + 20 + 1);
}

/* Three upstreams, one three times slower, fed by a synthetic open-loop
 * arrival process: the latency policy sends most traffic to the fast two,
 * and its mean TTFT beats round robin's. */
static double simulate(ig_route_policy_t policy, int counts[3])
{
    ig_router_t r = ig_trouter(policy);
    ig_router_upstream_t u[3];
    const double svc[3] = {0.010, 0.010, 0.030};
    const int slots = 2;
    ig_router_upstream_t *ups[3];
    for (int i = 0; i < 3; i++) {
        ready_upstream(&u[i], "u", IG_ROUTER_LOCAL);
        ups[i] = &u[i];
    }
    /* Each upstream serves `slots` requests at once; busy_until holds when
     * each slot frees. */
    double busy[3][2] = {{0}};
    double total = 0;
    int n = 2000;
    uint64_t inflight_end[3][64];
    int ninflight[3] = {0};
    for (int k = 0; k < n; k++) {
        double t = k * 0.006; /* ~167 req/s, ~70% of capacity */
        uint64_t now = S(1 + t);
        for (int i = 0; i < 3; i++) { /* retire finished requests */
            for (int j = 0; j < ninflight[i];) {
                if (inflight_end[i][j] <= now) {
                    ig_router_attempt_end(&r, &u[i], IG_OUTCOME_SUCCESS, 0, now);
                    inflight_end[i][j] = inflight_end[i][--ninflight[i]];
                } else {
                    j++;
                }
            }
        }
        ig_route_decision_t d;
        assert_int_equal(ig_router_pick(&r, ups, 3, 20, NULL, now, &d), 0);
        int c = d.chosen;
        int s = busy[c][0] <= busy[c][1] ? 0 : 1;
        double start = fmax(busy[c][s], t);
        double end = start + svc[c];
        busy[c][s] = end;
        double ttft = end - t;
        total += ttft;
        counts[c]++;
        ig_router_attempt_begin(&r, &u[c], now);
        ig_router_observe_ttft(&r, &u[c], 20, ttft, ig_router_wait(&r, &u[c], now), now);
        u[c].slots = slots;
        ig_router_observe_occupancy(&r, &u[c], svc[c], now);
        if (ninflight[c] < 64)
            inflight_end[c][ninflight[c]++] = S(1 + end);
    }
    return total / n;
}

static void test_simulated_routing(void **state)
{
    int lat[3] = {0}, rr[3] = {0};
    double mean_lat = simulate(IG_ROUTE_LATENCY, lat);
    double mean_rr = simulate(IG_ROUTE_ROUND_ROBIN, rr);
    assert_true(lat[0] + lat[1] > 4 * lat[2]);
    assert_true(mean_lat < mean_rr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak_ewma_rtt),
        cmocka_unit_test(test_probe_median_ignores_one_late_probe),
        cmocka_unit_test(test_reported_queue_not_counted_twice),
        cmocka_unit_test(test_worker_wait_drains),
        cmocka_unit_test(test_service_time_never_collapses),
        cmocka_unit_test(test_cost_prefers_faster_service),
        cmocka_unit_test(test_whole_answers_cost_their_hold),
        cmocka_unit_test(test_remote_site_only_when_faster),
        cmocka_unit_test(test_hot_guard),
        cmocka_unit_test(test_sed_counts_every_request_in_flight),
        cmocka_unit_test(test_free_place_beats_known_queue),
        cmocka_unit_test(test_new_upstream_takes_peers_step),
        cmocka_unit_test(test_new_upstream_takes_peers_service),
        cmocka_unit_test(test_lost_race_is_learned),
        cmocka_unit_test(test_tail_prefers_steadier),
        cmocka_unit_test(test_noise_tie_goes_to_least_loaded),
        cmocka_unit_test(test_policies_and_exclusion),
        cmocka_unit_test(test_ejection_and_half_open),
        cmocka_unit_test(test_retry_budget),
        cmocka_unit_test(test_simulated_routing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
