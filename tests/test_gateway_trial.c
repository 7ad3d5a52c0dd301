/*
 * A half-open trial ends only on evidence. An ejected site whose trial
 * request is abandoned by its client stays ejected, and its trial slot is
 * free again: the next request is its next trial (and, failing, ejects it
 * at once). Real processes on loopback: `infergate serve` in front of two
 * test upstreams.
 *
 * Timing: waits out a 0.5 s ejection.
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

static long long completions_of(int port)
{
    json_t *st = ig_gwf_get_json(port, "/_control/stats");
    assert_non_null(st);
    long long n = json_integer_value(json_object_get(st, "completions"));
    json_decref(st);
    return n;
}

static const char *plain = "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":2}";

static void post_ok(int port)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/v1/completions", plain, &r, 20000), 0);
    if (r.status != 200)
        print_message("%d %s\n", r.status, r.body);
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "s1");
    ig_tc_response_free(&r);
}

static void test_client_abort_keeps_the_trial_pending(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    /* s0 is preferred (instant probes, fast answers); s1 is far slower. */
    assert_int_equal(ig_gwf_upstream(&ups[0], "--instant-raw", "--delay-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "100", NULL), 0);
    ig_proc_t g;
    assert_int_equal(
        ig_gwf_sites_serve(&g, ups, 2, 2,
                           ",\"eject\":{\"consecutive_failures\":3,\"base_ejection_s\":0.5}", NULL),
        0);
    const char *ejections = "infergate_upstream_ejections_total{upstream=\"s0\"} ";

    /* Three failures in a row eject s0; each request is retried on s1. */
    assert_int_equal(ig_gwf_control(ups[0].port, "error-rate?p=1"), 200);
    for (int i = 0; i < 3; i++)
        post_ok(g.port);
    assert_true(ig_gwf_metric(g.port, ejections) == 1);

    /* The ejection is over: the next request on s0 is its trial. s0 now
     * answers slowly, and the trial's client gives up first. */
    usleep(700 * 1000);
    assert_int_equal(ig_gwf_control(ups[0].port, "error-rate?p=0"), 200);
    assert_int_equal(ig_gwf_control(ups[0].port, "delay?ms=2000"), 200);
    long long before = completions_of(ups[0].port);
    ig_tc_t *tc = ig_tc_connect(g.port);
    assert_non_null(tc);
    assert_int_equal(ig_tc_send_post(tc, "/v1/completions", plain), 0);
    usleep(300 * 1000);
    assert_int_equal(completions_of(ups[0].port), before + 1); /* the trial reached s0 */
    ig_tc_close(tc);
    usleep(100 * 1000);

    /* s0 is still broken. The abandoned trial proved nothing: s0 is still
     * ejected, its trial slot is free, and this request is the next trial,
     * whose failure ejects it again at once (a cleared ejection would need
     * three failures). */
    assert_int_equal(ig_gwf_control(ups[0].port, "delay?ms=1"), 200);
    assert_int_equal(ig_gwf_control(ups[0].port, "error-rate?p=1"), 200);
    post_ok(g.port);
    assert_int_equal(completions_of(ups[0].port), before + 2);
    double n = ig_gwf_metric(g.port, ejections);
    print_message("ejections of s0: %g\n", n);
    assert_true(n == 2);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_abort_keeps_the_trial_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
