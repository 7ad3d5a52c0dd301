/*
 * The two-region example configs, run as shipped: config/us-east.json
 * (127.0.0.1:8081) and config/eu-west.json (127.0.0.1:8082) each start their
 * CPU pool, see the other region as a site, and serve requests (through
 * either: the peer is as near as the pool here); a request marked forwarded
 * is served by the local pool.
 * (Spill-over under saturation is shown on configs of the same shape with a
 * distance between the regions in test_gateway_pools.c.) Skipped when the
 * example ports are taken on this machine.
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
#include <unistd.h>

#include "gwfixture.h"

static int port_taken(int port)
{
    ig_tc_t *tc = ig_tc_connect(port);
    if (tc == NULL)
        return 0;
    ig_tc_close(tc);
    return 1;
}

static void start(ig_proc_t *p, const char *config, int port)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config/%s", getenv("IG_SOURCE_DIR"), config);
    assert_int_equal(ig_gwf_serve(p, path, port, "warn", 0, 60000, 0), 0);
}

static void test_example_regions(void **state)
{
    if (port_taken(8081) || port_taken(8082))
        skip();
    char cache[] = "/tmp/igtest-cache-XXXXXX";
    assert_non_null(mkdtemp(cache));
    setenv("INFERGATE_CACHE_DIR", cache, 1);

    ig_proc_t east, west;
    start(&east, "us-east.json", 8081);
    start(&west, "eu-west.json", 8082);
    assert_int_equal(ig_proc_wait_status(8081, "/ready", 200, 60000), 0);
    assert_int_equal(ig_proc_wait_status(8082, "/ready", 200, 60000), 0);
    long long end = ig_tc_now_ms() + 10000;
    while (!(ig_gwf_sites_up(8081, NULL, 0) == 1 && ig_gwf_sites_up(8082, NULL, 0) == 1) &&
           ig_tc_now_ms() < end)
        usleep(100 * 1000);
    assert_int_equal(ig_gwf_sites_up(8081, NULL, 0), 1);
    assert_int_equal(ig_gwf_sites_up(8082, NULL, 0), 1);

    const int ports[2] = {8081, 8082};
    const char *pools[2] = {"us-east-cpu/", "eu-west-cpu/"};
    const char *peers[2] = {"eu-west", "us-east"};
    for (int k = 0; k < 2; k++) {
        const char *body = "{\"model\":\"tiny\",\"prompt\":\"hello\",\"max_tokens\":4}";
        ig_tc_response_t r;
        /* Both regions run on this machine, so the peer is as near as the
         * local pool: the router may pick either, and either answers. */
        assert_int_equal(ig_gwf_post(ports[k], "/v1/completions", body, &r, 30000), 0);
        assert_int_equal(r.status, 200);
        const char *u = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(u);
        print_message("region %d: served by %s\n", k, u);
        assert_true(strncmp(u, pools[k], strlen(pools[k])) == 0 || strcmp(u, peers[k]) == 0);
        ig_tc_response_free(&r);
        /* Marked as forwarded (trusted: the examples have no keys), it stays
         * in the region: the local pool serves it. */
        char raw[512];
        snprintf(raw, sizeof(raw),
                 "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 "x-infergate-forwarded: 1\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                 strlen(body), body);
        assert_int_equal(ig_tc_request(ports[k], raw, &r, 30000), 0);
        assert_int_equal(r.status, 200);
        u = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(u);
        assert_true(strncmp(u, pools[k], strlen(pools[k])) == 0);
        ig_tc_response_free(&r);
        /* Each lists the model once, reachable locally and through the peer. */
        assert_int_equal(ig_gwf_get(ports[k], "/v1/models", &r), 0);
        assert_non_null(strstr(r.body, "\"id\":\"tiny\""));
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_proc_stop(&east, SIGTERM, 20000), 0);
    assert_int_equal(ig_proc_stop(&west, SIGTERM, 20000), 0);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", cache);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
