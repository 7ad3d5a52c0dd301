/*
 * The drain grace of `infergate serve` (limits.drain_grace_ms): after
 * SIGTERM, /ready answers 503 at once while new connections are still
 * accepted and served (a readiness probe can see the 503 before anything
 * is refused); after the grace the listener is closed, and a request in
 * flight all along still gets its whole answer before the process exits 0.
 *
 * Timing: it checks that the listener stays open for the grace (GRACE_MS)
 * and closes within a bounded time after it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"
#include "testserver.h"

#include "infergate/log.h"

#include <stdatomic.h>

#define GRACE_MS 1500
#define UPSTREAM_DELAY_MS 3000

static ig_ts_site_t site;

static int get_status(int port, const char *path)
{
    ig_tc_response_t r;
    int st = ig_gwf_get(port, path, &r) == 0 ? r.status : -1;
    ig_tc_response_free(&r);
    return st;
}

static void test_grace_then_close(void **state)
{
    ig_proc_t gw;
    ig_ts_t *ts = ig_ts_site_start(&site, UPSTREAM_DELAY_MS);
    assert_non_null(ts);
    char limits[128];
    snprintf(limits, sizeof(limits), "{\"drain_timeout_ms\": 20000, \"drain_grace_ms\": %d}",
             GRACE_MS);
    assert_int_equal(ig_gwf_serve_site(&gw, ig_ts_port(ts), limits), 0);

    /* A request in flight across the whole shutdown. */
    ig_tc_t *tc = ig_gwf_inflight(gw.port, &site, 1);
    assert_non_null(tc);

    long long t0 = ig_tc_now_ms();
    kill(gw.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_log(&gw, "SIGTERM: draining (1 requests in flight", 5000), 0);

    /* The grace: /ready says 503 on a new connection, /health is served. */
    assert_int_equal(get_status(gw.port, "/ready"), 503);
    assert_int_equal(get_status(gw.port, "/health"), 200);
    int probes = 0;
    while (ig_tc_now_ms() - t0 < GRACE_MS - 400) {
        assert_int_equal(get_status(gw.port, "/ready"), 503);
        probes++;
        poll(NULL, 0, 100);
    }
    long long during = ig_tc_now_ms() - t0;
    assert_true(probes >= 1);
    assert_true(during < GRACE_MS); /* all of the above within the grace */

    /* After the grace: refused. */
    long long refused = -1;
    while (ig_tc_now_ms() - t0 < GRACE_MS + 3000) {
        int fd = ig_proc_connect(gw.port);
        if (fd < 0) {
            refused = ig_tc_now_ms() - t0;
            break;
        }
        close(fd);
        poll(NULL, 0, 20);
    }
    if (refused < 0)
        fail_msg("still accepting %d ms after SIGTERM:\n%s", GRACE_MS + 3000, gw.err);
    assert_true(refused >= GRACE_MS - 100);
    assert_int_equal(ig_proc_wait_log(&gw, "closing the listener: 1 requests in flight", 2000), 0);

    /* The request in flight gets its whole answer, then the process exits 0. */
    ig_tc_response_t r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(ig_tc_read_response(tc, &r, 10000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"text_completion\""));
    ig_tc_response_free(&r);
    assert_int_equal(ig_proc_wait_exit(&gw, 10000), 0);
    assert_non_null(strstr(gw.err, "drained; exiting"));

    ig_tc_close(tc);
    ig_proc_dispose(&gw);
    ig_ts_stop(ts);
}

/* A second signal during the grace exits at once with status 1. */
static void test_second_signal_in_grace(void **state)
{
    ig_proc_t p;
    const char *config = ig_proc_temp_file(
        "{\"listen\": \"127.0.0.1:0\", \"limits\": {\"drain_grace_ms\": 20000}}", ".json");
    assert_non_null(config);
    const char *args[] = {"serve", "--config", config, NULL};
    assert_int_equal(ig_proc_start_bin(&p, "infergate", args, IG_PROC_PIPES), 0);
    if (ig_proc_wait_announce(&p, 1, 10000) != 0)
        fail_msg("serve did not start:\n%s", p.err);
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_log(&p, "SIGTERM: draining", 5000), 0);
    assert_int_equal(get_status(p.port, "/health"), 200); /* in the grace */
    long long t0 = ig_tc_now_ms();
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_exit(&p, 5000), 1);
    assert_true(ig_tc_now_ms() - t0 < 2000);
    assert_non_null(strstr(p.err, "SIGTERM again: exiting without waiting"));
    ig_proc_dispose(&p);
    unlink(config);
}

int main(void)
{
    ig_log_setup(IG_LOG_WARN, IG_LOG_TEXT); /* the in-process upstream's access lines */
    setenv("INFERGATE_CACHE_DIR", "/tmp/infergate-test-cache", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grace_then_close),
        cmocka_unit_test(test_second_signal_in_grace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
