/*
 * The adaptive concurrency limit and the learned concurrency with real
 * processes: `infergate serve` in front of build/testupstream with --slots
 * and no /load (a plain OpenAI server whose slot count the gateway is not
 * told).
 *   - A burst of 24 on a 2-slot upstream: the gateway holds most of them
 *     in its own queue (the upstream never has more than a few inside, nor
 *     more connections open than the limit and the prober's one),
 *     /status and /metrics show the limit and why it moved, every request
 *     is answered.
 *   - Bursts on a 4-slot upstream of a fixed 30 ms service time: /status
 *     and the route header show a learned concurrency near 4 (exponential
 *     service times are test_router_learn's simulation: here, a slow build's
 *     own latency on top of their spread biased the fit, 2.5 under ASan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "burst.h"
#include "gwfixture.h"

static const char *body = "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":2}";

static json_t *site0(int port, json_t **doc)
{
    *doc = ig_gwf_get_json(port, "/status");
    json_t *sites = *doc ? json_object_get(*doc, "sites") : NULL;
    return json_array_get(sites, 0);
}

/* Sequential requests, each alone: the base hold the limit measures. */
static void calibrate(int port, int n)
{
    for (int i = 0; i < n; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(port, "/v1/completions", body, &r, 10000), 0);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
}

/* A testupstream with slots slots and the delay flag/value given, behind
 * a gateway as its one site, calibrated. */
static void one_site(ig_proc_t *up, ig_proc_t *g, const char *slots, const char *delay_flag,
                     const char *delay)
{
    assert_int_equal(ig_gwf_upstream(up, "--instant-raw", "--slots", slots, delay_flag, delay,
                                     "--tokens", "2", NULL),
                     0);
    /* The limit is off by default: these tests turn it on. */
    assert_int_equal(
        ig_gwf_sites_serve(g, up, 1, 1, ",\"concurrency_limit\":{\"enabled\":true}", NULL), 0);
    calibrate(g->port, 8);
}

static void test_limit_holds_in_gateway(void **state)
{
    (void)state;
    ig_proc_t up, g;
    one_site(&up, &g, "2", "--delay-ms", "100");

    ig_burst_one_t out[24];
    assert_int_equal(ig_burst(g.port, "/v1/completions", body, 24, 30000, out), 24);
    int inside = ig_gwf_upstream_stat(up.port, "max_inside");
    print_message("24 at once on 2 slots: at most %d inside the upstream\n", inside);
    /* Without a limit all 24 would have waited inside the upstream. */
    assert_true(inside >= 2 && inside <= 10);
    /* Nor more connections than the limit (at most 10 here) and the
     * prober's one: 24 would have been opened for 24 at once. */
    int conns = ig_gwf_upstream_stat(up.port, "max_open_connections");
    print_message("at most %d connections open to it\n", conns);
    assert_true(conns >= 2 && conns <= 11);

    json_t *doc;
    json_t *s = site0(g.port, &doc);
    assert_non_null(s);
    int limit = (int)json_integer_value(json_object_get(s, "concurrency_limit"));
    const char *why = json_string_value(json_object_get(s, "limit_reason"));
    print_message("limit %d (%s), W %.3f s, baseline %.3f s, concurrency %.2f\n", limit,
                  why ? why : "?", json_real_value(json_object_get(s, "limit_w_s")),
                  json_real_value(json_object_get(s, "limit_baseline_s")),
                  json_real_value(json_object_get(s, "concurrency")));
    assert_true(limit >= 1 && limit <= 10);
    assert_non_null(why);
    assert_true(json_integer_value(json_object_get(s, "limit_changes")) > 0);
    json_decref(doc);
    double shrinks = ig_gwf_metric(g.port, "infergate_upstream_concurrency_limit_changes_total{"
                                           "upstream=\"s0\",reason=\"throughput_down\"} ");
    print_message("throughput_down moves: %.0f\n", shrinks);
    assert_true(shrinks >= 1);
    double gauge = ig_gwf_metric(g.port, "infergate_upstream_concurrency_limit{upstream=\"s0\"} ");
    assert_true(gauge >= 1 && gauge <= 10);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&up, SIGKILL, 5000);
}

static void test_learned_concurrency(void **state)
{
    (void)state;
    ig_proc_t up, g;
    one_site(&up, &g, "4", "--delay-ms", "30");
    ig_burst_one_t out[12];
    for (int round = 0; round < 30; round++)
        assert_int_equal(ig_burst(g.port, "/v1/completions", body, 12, 20000, out), 12);

    json_t *doc;
    json_t *s = site0(g.port, &doc);
    assert_non_null(s);
    double c = json_real_value(json_object_get(s, "concurrency"));
    print_message("learned concurrency %.2f (4 slots); limit %lld\n", c,
                  (long long)json_integer_value(json_object_get(s, "concurrency_limit")));
    assert_true(c >= 2.75 && c <= 6.0);
    /* The order the answers ended in never shows more at once than the
     * slots: the upstream serves its queue in order, and sends closer
     * than the slack may have arrived in the other order. */
    json_t *order = json_object_get(s, "order_c");
    print_message("the order allows C >= %.0f\n", json_real_value(order));
    assert_true(json_is_real(order) && json_real_value(order) <= 4);
    json_decref(doc);
    /* The route header names the winner's predicted wait and concurrency. */
    const char *route = out[0].route;
    print_message("x-infergate-route: %s\n", route);
    assert_true(ig_burst_route_num(route, "wait") >= 0);
    assert_true(ig_burst_route_num(route, "concurrency") >= 1);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&up, SIGKILL, 5000);
}

/* routing.concurrency_limit from the config: a max of 3 holds however
 * many arrive, and enabled false lets them all through. */
static void test_limit_config(void **state)
{
    (void)state;
    for (int enabled = 1; enabled >= 0; enabled--) {
        ig_proc_t up;
        assert_int_equal(ig_gwf_upstream(&up, "--instant-raw", "--slots", "2", "--delay-ms", "50",
                                         "--tokens", "2", NULL),
                         0);
        ig_proc_t g;
        const char *extra =
            enabled ? ",\"concurrency_limit\":{\"enabled\":true,\"initial\":3,\"max\":3}"
                    : ",\"concurrency_limit\":{\"enabled\":false}";
        assert_int_equal(ig_gwf_sites_serve(&g, &up, 1, 1, extra, NULL), 0);
        calibrate(g.port, 8);
        ig_burst_one_t out[16];
        assert_int_equal(ig_burst(g.port, "/v1/completions", body, 16, 30000, out), 16);
        int inside = ig_gwf_upstream_stat(up.port, "max_inside");
        print_message("limit %s: 16 at once, at most %d inside the upstream\n",
                      enabled ? "max 3" : "off", inside);
        if (enabled)
            assert_true(inside >= 2 && inside <= 3);
        else
            assert_true(inside >= 12);
        assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
        ig_proc_stop(&up, SIGKILL, 5000);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_holds_in_gateway),
        cmocka_unit_test(test_learned_concurrency),
        cmocka_unit_test(test_limit_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
