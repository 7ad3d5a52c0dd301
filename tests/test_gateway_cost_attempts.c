/*
 * Attempts that give no answer count their cost (docs/routing.md, "Cost per
 * answer"): a hedge that lost to a per-token site is charged its prompt to
 * that site and in the answer's x-infergate-cost; an attempt that timed out
 * while the site had the request is charged; one the site refused with a
 * 5xx is not (pay-per-token endpoints do not bill errors).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gwfixture.h"

#define PRICE_S0 "{\"per_1m_input_tokens\":1,\"per_1m_output_tokens\":3}"

static const char *stream_body =
    "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":4,\"stream\":true}";
static const char *plain_body = "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":4}";

/* A gateway with site s0 (priced PRICE_S0) and, when s1 is not NULL, an
 * unpriced site s1; routing_extra spliced into the routing object. */
static void serve(ig_proc_t *g, const ig_proc_t *s0, const ig_proc_t *s1, const char *routing_extra)
{
    int port = ig_proc_free_port();
    char s1_site[256] = "";
    if (s1 != NULL)
        snprintf(s1_site, sizeof(s1_site),
                 ",{\"name\":\"s1\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}", s1->port);
    assert_int_equal(
        ig_gwf_serve_config(g, port, "warn", 0, 15000, 15000,
                            "{\"region\":\"test\",\"listen\":\"127.0.0.1:%d\","
                            "\"models\":[{\"name\":\"m\"}],\"sites\":[{\"name\":\"s0\","
                            "\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],\"price\":%s}%s],"
                            "\"routing\":{\"policy\":\"latency\"%s},"
                            "\"limits\":{\"drain_grace_ms\":0}}",
                            port, s0->port, PRICE_S0, s1_site, routing_extra),
        0);
    long long end = ig_tc_now_ms() + 10000;
    int want = s1 != NULL ? 2 : 1;
    while (ig_gwf_sites_up(g->port, NULL, 0) < want && ig_tc_now_ms() < end)
        ;
    assert_int_equal(ig_gwf_sites_up(g->port, NULL, 0), want);
}

static double s0_spend(int port)
{
    double v = ig_gwf_metric(
        port, "infergate_cost_usd_total{upstream=\"s0\",model=\"m\",key=\"none\"} ");
    return v < 0 ? 0 : v;
}

/* The x-infergate-cost comment that ends a stream, or -1. */
static double stream_cost(const ig_tc_response_t *r)
{
    const char *c = strstr(r->body, ": x-infergate-cost: ");
    return c != NULL ? atof(c + strlen(": x-infergate-cost: ")) : -1;
}

/* s0 answers first and fast until it stalls; the hedge to s1 (unpriced)
 * wins; s0's cancelled attempt is charged its prompt at $1/M, which is the
 * whole of the answer's cost. */
static void test_lost_hedge_charged(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--delay-ms", "2", "--itl-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "40", "--itl-ms", "1", NULL), 0);
    ig_proc_t g;
    serve(&g, &ups[0], &ups[1], IG_GWF_HEDGE);
    ig_tc_response_t r;
    for (int i = 0; i < 20; i++) { /* hedge budget, and s0's TTFT learned */
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", stream_body, &r, 20000), 0);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
    double before = s0_spend(g.port);
    assert_int_equal(ig_gwf_control(ups[0].port, "stall?ms=3000"), 200);
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", stream_body, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    const char *up = ig_tc_header(&r, "x-infergate-upstream");
    double cost = stream_cost(&r);
    double after = s0_spend(g.port);
    print_message("answered by %s, cost %.9g, s0 spend %.9g -> %.9g\n", up ? up : "-", cost,
                  before, after);
    assert_non_null(up);
    assert_string_equal(up, "s1");
    /* the prompt's tokens (the gateway's estimate, >= 1) at $1 per 1M */
    double charged = after - before;
    assert_true(charged >= 1e-6 - 1e-12);
    assert_true(fabs(charged * 1e6 - round(charged * 1e6)) < 1e-6);
    assert_true(fabs(cost - charged) <= 1e-5 * charged);
    ig_tc_response_free(&r);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

/* The only site takes the request and says nothing for 300 ms: 504, and
 * its prompt is charged; a site that answers 500 is not charged. */
static void test_timeout_charged_refusal_free(void **state)
{
    (void)state;
    ig_proc_t up;
    assert_int_equal(ig_gwf_upstream(&up, NULL), 0);
    ig_proc_t g;
    serve(&g, &up, NULL, ",\"first_token_timeout_ms\":300");
    assert_int_equal(ig_gwf_control(up.port, "delay?ms=3000"), 200);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
    print_message("timed out: %d, s0 spend %.9g\n", r.status, s0_spend(g.port));
    assert_int_equal(r.status, 504);
    ig_tc_response_free(&r);
    assert_true(s0_spend(g.port) >= 1e-6 - 1e-12);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&up, SIGKILL, 5000);

    assert_int_equal(ig_gwf_upstream(&up, "--error-status", "500", NULL), 0);
    serve(&g, &up, NULL, "");
    assert_int_equal(ig_gwf_control(up.port, "error-rate?p=1"), 200);
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
    print_message("refused: %d, s0 spend %.9g\n", r.status, s0_spend(g.port));
    assert_int_equal(r.status, 502);
    ig_tc_response_free(&r);
    assert_true(s0_spend(g.port) == 0);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&up, SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_hedge_charged),
        cmocka_unit_test(test_timeout_charged_refusal_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
