/*
 * The cheap active probe of a plain upstream (issue 12, item 4): an idle
 * site that reports nothing gets a timed GET /health when its RTT is stale,
 * so that its estimate follows the path; the probe traffic stays bounded.
 *   - ig_router_probe_due() with a synthetic clock: due when idle and
 *     stale, not after a sample, not while real traffic ends there, never
 *     for an upstream that reports its slots or with the probe off.
 *   - `infergate serve` in front of faultproxy and build/testupstream (no
 *     /load): faultproxy adds 25 ms each way to an idle site and /status
 *     shows the RTT follow; in 3 idle seconds the probes stay within one
 *     per interval; a stalled upstream gets no second probe while one
 *     hangs; a site that carries traffic gets none.
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gwfixture.h"
#include "infergate/router.h"

#define MS 1000000ULL

static void test_due_rules(void **state)
{
    (void)state;
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.rtt_probe_s = 0.2;
    ig_router_t r;
    ig_router_init(&r, &o);
    ig_router_upstream_t u;
    ig_router_upstream_init(&u, "s", IG_ROUTER_SITE);
    uint64_t t = 1000 * MS;
    assert_false(ig_router_probe_due(&r, &u, t)); /* not ready: the liveness probe first */
    u.ready = 1;
    assert_true(ig_router_probe_due(&r, &u, t)); /* no RTT yet */
    ig_router_observe_probe_rtt(&r, &u, 0.01, t);
    assert_false(ig_router_probe_due(&r, &u, t + 100 * MS));
    assert_true(ig_router_probe_due(&r, &u, t + 200 * MS));
    /* Real traffic: an attempt that ended 100 ms ago holds the probe off,
     * however stale the RTT. */
    ig_router_observe_done(&r, &u, 0, 0.02, t + 900 * MS);
    assert_false(ig_router_probe_due(&r, &u, t + 1000 * MS));
    assert_true(ig_router_probe_due(&r, &u, t + 1100 * MS));
    /* One that reports its slots is probed with /load by its owner. */
    u.slots = 4;
    assert_false(ig_router_probe_due(&r, &u, t + 2000 * MS));
    u.slots = 0;
    r.opts.rtt_probe_s = 0;
    assert_false(ig_router_probe_due(&r, &u, t + 2000 * MS));
}

static json_t *site0(int port, json_t **doc)
{
    *doc = ig_gwf_get_json(port, "/status");
    return json_array_get(*doc ? json_object_get(*doc, "sites") : NULL, 0);
}

static double site_num(int port, const char *key)
{
    json_t *doc;
    json_t *s = site0(port, &doc);
    double v = s ? json_number_value(json_object_get(s, key)) : -1;
    json_decref(doc);
    return v;
}

static long long upstream_stat(int port, const char *key)
{
    json_t *doc = ig_gwf_get_json(port, "/_control/stats");
    long long v = doc ? (long long)json_integer_value(json_object_get(doc, key)) : -1;
    json_decref(doc);
    return v;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_idle_site_follows_path(void **state)
{
    (void)state;
    char sock[128];
    snprintf(sock, sizeof(sock), "/tmp/ig-rttprobe-%d.sock", (int)getpid());
    unlink(sock);
    /* Raw requests (the probes) are served after the 2 ms delay and obey
     * a stall, as completions do (no --instant-raw). */
    ig_proc_t up, fp, g;
    assert_int_equal(ig_gwf_upstream(&up, "--delay-ms", "2", "--tokens", "2", NULL), 0);
    char target[64], control[160];
    snprintf(target, sizeof(target), "127.0.0.1:%d", up.port);
    snprintf(control, sizeof(control), "unix:%s", sock);
    const char *fargs[] = {"--quiet", "--target", target, "--control", control, NULL};
    assert_int_equal(ig_gwf_tool(&fp, "faultproxy", ig_proc_free_port(), fargs, 10000), 0);
    assert_int_equal(ig_gwf_sites_serve(&g, &fp, 1, 1, ",\"rtt_probe_ms\":200", NULL), 0);

    sleep_ms(1500);
    double rtt0 = site_num(g.port, "rtt_s");
    print_message("idle site: rtt %.1f ms before the delay\n", rtt0 * 1e3);
    assert_true(rtt0 >= 0 && rtt0 < 0.030);

    /* faultproxy adds 25 ms each way: the idle site's estimate follows. */
    char out[256];
    assert_int_equal(tu_control(sock, "delay 25", out, sizeof(out)), 0);
    double t0 = tu_now(), rtt = 0;
    while (tu_now() - t0 < 3.0) {
        rtt = site_num(g.port, "rtt_s");
        if (rtt >= 0.045)
            break;
        sleep_ms(50);
    }
    double took = tu_now() - t0;
    print_message("rtt %.1f ms %.2f s after faultproxy added 50 ms\n", rtt * 1e3, took);
    assert_true(rtt >= 0.045 && rtt < 0.2);

    /* Bounded: in 3 idle seconds at most one RTT probe per 200 ms, and
     * nothing else reaches the upstream but the 1 s liveness cycle (GET
     * /health and GET /v1/models). */
    double p0 = site_num(g.port, "rtt_probes");
    long long r0 = upstream_stat(up.port, "raw");
    sleep_ms(3000);
    double p1 = site_num(g.port, "rtt_probes");
    long long r1 = upstream_stat(up.port, "raw");
    print_message("3 idle s: %.0f RTT probes, %lld probe requests in all\n", p1 - p0, r1 - r0);
    assert_true(p1 - p0 >= 3 && p1 - p0 <= 3000 / 200 + 1);
    assert_true(r1 - r0 <= (long long)(p1 - p0) + 2 * 4);

    /* One probe in flight at most: while the upstream stalls, the one it
     * holds is all that arrives. */
    assert_int_equal(ig_gwf_control(up.port, "stall?ms=1500"), 200);
    long long s0 = upstream_stat(up.port, "raw");
    sleep_ms(1200);
    long long s1 = upstream_stat(up.port, "raw");
    print_message("1.2 s of a stall: %lld probe requests arrived\n", s1 - s0);
    assert_true(s1 - s0 <= 1);
    sleep_ms(1500);

    /* A site that carries traffic gets no RTT probe. */
    double q0 = site_num(g.port, "rtt_probes");
    const char *body = "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":2}";
    int n = 0;
    double t1 = tu_now();
    while (tu_now() - t1 < 2.0) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", body, &r, 10000), 0);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
        n++;
    }
    double q1 = site_num(g.port, "rtt_probes");
    print_message("%d requests in 2 s of traffic: %.0f RTT probes\n", n, q1 - q0);
    assert_true(q1 - q0 <= 1);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&fp, SIGKILL, 5000);
    ig_proc_stop(&up, SIGKILL, 5000);
    unlink(sock);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_due_rules),
        cmocka_unit_test(test_idle_site_follows_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
