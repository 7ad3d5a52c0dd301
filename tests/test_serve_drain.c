/*
 * A real drain: a completion in flight through the gateway (to a slow
 * upstream site, served in-process by the test server of tests/support) when
 * SIGTERM arrives finishes with its answer, and only then does
 * `infergate serve` exit 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>

#include "gwfixture.h"
#include "testserver.h"

#include "infergate/log.h"

#include <stdatomic.h>

#define UPSTREAM_DELAY_MS 1500

static ig_ts_site_t site;

static void test_inflight_request_finishes(void **state)
{
    ig_proc_t gw;
    ig_ts_t *ts = ig_ts_site_start(&site, UPSTREAM_DELAY_MS);
    assert_non_null(ts);
    /* Ready once the site's probe succeeded. */
    assert_int_equal(ig_gwf_serve_site(&gw, ig_ts_port(ts),
                                       "{\"drain_timeout_ms\": 20000, \"drain_grace_ms\": 0}"),
                     0);

    /* In flight: the upstream holds it for UPSTREAM_DELAY_MS. */
    ig_tc_t *tc = ig_gwf_inflight(gw.port, &site, 1);
    assert_non_null(tc);

    long long t0 = ig_tc_now_ms();
    kill(gw.pid, SIGTERM);
    /* The answer still comes, whole. */
    ig_tc_response_t r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(ig_tc_read_response(tc, &r, 10000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"text_completion\""));
    long long answered = ig_tc_now_ms() - t0;
    ig_tc_response_free(&r);
    /* After the answer the drained connection closes and the process exits 0. */
    assert_int_equal(ig_tc_wait_closed(tc, 5000), 1);
    assert_int_equal(ig_proc_wait_exit(&gw, 10000), 0);
    if (strstr(gw.err, "SIGTERM: draining (1 requests in flight") == NULL)
        fail_msg("no drain line:\n%s", gw.err);
    assert_non_null(strstr(gw.err, "drained; exiting"));
    /* It waited for the upstream rather than cutting the request short. */
    assert_true(answered >= UPSTREAM_DELAY_MS / 3);

    ig_tc_close(tc);
    ig_proc_dispose(&gw);
    ig_ts_stop(ts);
}

int main(void)
{
    ig_log_setup(IG_LOG_WARN, IG_LOG_TEXT); /* the in-process upstream's access lines */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_request_finishes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
