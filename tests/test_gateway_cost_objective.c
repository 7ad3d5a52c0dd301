/*
 * routing.objective "cost" in the real gateway (docs/routing.md, "The cost
 * objective"), on a "colo" site priced by the hour that answers after
 * 60 ms and a "cloud" site priced per token that answers after 5 ms:
 *  - with an SLO of 150 ms colo meets it and costs nothing more, so it
 *    answers though the cloud is faster; the route header says
 *    objective=cost, colo's marginal cost 0 and the cloud's as runner-up
 *    (its max_tokens at its output price, its input price being 0);
 *  - a request whose x-infergate-slo-ttft-ms (30) colo cannot meet goes to
 *    the cloud; with the config's SLO at 30 ms, one that asks for 5000 ms
 *    does not loosen it and goes to the cloud too.
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
#include <unistd.h>

#include "gwfixture.h"
#include "testclient.h"

#define MAX_TOKENS 50
static const char *body = "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":50}";

/* The number after "key=" in the route header r carries, or -1. */
static double route_num(const ig_tc_response_t *r, const char *key)
{
    return ig_tc_route_num(ig_tc_header(r, "x-infergate-route"), key);
}

/* A completion with an x-infergate-slo-ttft-ms of slo_ms (0: none); the
 * caller frees it. */
static ig_tc_response_t post_slo(int port, int slo_ms)
{
    char slo[64] = "";
    if (slo_ms > 0)
        snprintf(slo, sizeof(slo), "x-infergate-slo-ttft-ms: %d\r\n", slo_ms);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post_headers(port, "/v1/completions", slo, body, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    print_message("slo %d -> %s; %s\n", slo_ms, ig_tc_header(&r, "x-infergate-upstream"),
                  ig_tc_header(&r, "x-infergate-route"));
    return r;
}

static ig_proc_t colo, cloud;

static int setup(void **state)
{
    (void)state;
    if (ig_gwf_upstream(&colo, "--delay-ms", "60", "--itl-ms", "1", NULL) != 0 ||
        ig_gwf_upstream(&cloud, "--delay-ms", "5", "--itl-ms", "1", NULL) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ig_proc_stop(&colo, SIGKILL, 5000);
    ig_proc_dispose(&colo);
    ig_proc_stop(&cloud, SIGKILL, 5000);
    ig_proc_dispose(&cloud);
    return 0;
}

/* A gateway over colo and cloud with routing.slo_ttft_ms slo_ms, both
 * sites up and their TTFTs learned from answers of each. */
static void serve(ig_proc_t *g, int slo_ms)
{
    int port = ig_proc_free_port();
    assert_int_equal(
        ig_gwf_serve_config(
            g, port, "warn", 0, 10000, 15000,
            "{\"region\":\"test\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"m\"}],"
            "\"sites\":[{\"name\":\"colo\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],"
            "\"price\":{\"per_hour\":2}},"
            "{\"name\":\"cloud\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],"
            "\"price\":{\"per_1m_input_tokens\":0,\"per_1m_output_tokens\":2}}],"
            "\"routing\":{\"objective\":\"cost\",\"slo_ttft_ms\":%d},"
            "\"limits\":{\"drain_grace_ms\":0}}",
            port, colo.port, cloud.port, slo_ms),
        0);
    long long end = ig_tc_now_ms() + 10000;
    while (ig_gwf_sites_up(g->port, NULL, 0) < 2 && ig_tc_now_ms() < end)
        usleep(20000);
    assert_int_equal(ig_gwf_sites_up(g->port, NULL, 0), 2);
    /* Requests only the cloud meets and ones colo meets too, so that both
     * answer some and their TTFTs are learned. */
    for (int i = 0; i < 12; i++) {
        ig_tc_response_t r = post_slo(g->port, i % 2 ? 30 : 150);
        ig_tc_response_free(&r);
    }
}

static void test_cheapest_within_slo(void **state)
{
    (void)state;
    ig_proc_t g;
    serve(&g, 150);
    ig_tc_response_t r = post_slo(g.port, 0);
    assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "colo");
    const char *route = ig_tc_header(&r, "x-infergate-route");
    assert_non_null(strstr(route, "objective=cost"));
    assert_non_null(strstr(route, "runner_up=cloud"));
    assert_true(route_num(&r, "marginal_usd") == 0);
    double runner = route_num(&r, "runner_up_marginal_usd");
    assert_true(fabs(runner - MAX_TOKENS * 2 / 1e6) <= 1e-5 * runner);
    ig_tc_response_free(&r);

    /* A tighter SLO of the request's own: colo's 60 ms cannot meet 30. */
    r = post_slo(g.port, 30);
    assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "cloud");
    assert_true(fabs(route_num(&r, "marginal_usd") - MAX_TOKENS * 2 / 1e6) <= 1e-11);
    ig_tc_response_free(&r);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
}

/* The config's SLO at 30 ms: a request's 5000 does not loosen it. */
static void test_request_slo_only_tightens(void **state)
{
    (void)state;
    ig_proc_t g;
    serve(&g, 30);
    for (int slo = 0; slo <= 5000; slo += 5000) {
        ig_tc_response_t r = post_slo(g.port, slo);
        assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "cloud");
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cheapest_within_slo),
        cmocka_unit_test(test_request_slo_only_tightens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
