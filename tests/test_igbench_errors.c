/*
 * igbench counts failures by kind and computes goodput under SLOs; it
 * refuses non-loopback targets unless told otherwise.
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>

static void test_http_errors_by_status(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --error-rate 0.5 --error-status 503"),
                     0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 2 --requests 200", up.port);
    tu_stop(&up);
    assert_non_null(r);
    double e503 = TU_NUM(r, "errors", "http_503");
    print_message("http_503: %.0f of 200\n", e503);
    assert_true(e503 >= 70 && e503 <= 130);
    assert_int_equal((int)(e503 + TU_NUM(r, "requests", "ok")), 200);
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), (int)e503);
    json_decref(r);
}

static void test_broken_stream(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --fail-after-tokens 3 --fail-rate 1"),
                     0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 1 --requests 20 --stream "
                           "--max-tokens 10",
                           up.port);
    tu_stop(&up);
    assert_non_null(r);
    assert_int_equal((int)TU_NUM(r, "errors", "broken_stream"), 20);
    assert_int_equal((int)TU_NUM(r, "requests", "ok"), 0);
    json_decref(r);
}

static void test_connect_errors(void **state)
{
    /* A port that was just free: bind, learn, close. */
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet"), 0);
    int port = up.port;
    tu_stop(&up);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --rate 50 --requests 10", port);
    assert_non_null(r);
    assert_int_equal((int)TU_NUM(r, "errors", "connect"), 10);
    json_decref(r);
}

static void test_timeouts(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --delay-ms 400"), 0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --rate 20 --requests 10 --timeout 0.1", up.port);
    tu_stop(&up);
    assert_non_null(r);
    assert_int_equal((int)TU_NUM(r, "errors", "timeout"), 10);
    json_decref(r);
}

/* 60% of requests take 10 ms and 40% take 40 ms: under an e2e SLO of 25 ms
 * goodput is ~60% of throughput; the count of good requests is exact. */
static void test_goodput(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --delay-dist choice:10@0.6,40@0.4"), 0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --rate 50 --requests 150 --slo e2e=25", up.port);
    tu_stop(&up);
    assert_non_null(r);
    double ok = TU_NUM(r, "requests", "ok"), good = TU_NUM(r, "requests", "good");
    double ratio = TU_NUM(r, "goodput_rps") / TU_NUM(r, "throughput_rps");
    print_message("good %.0f of %.0f, goodput/throughput %.3f\n", good, ok, ratio);
    assert_int_equal((int)ok, 150);
    assert_true(good >= 0.45 * ok && good <= 0.75 * ok);
    assert_true(fabs(ratio - good / ok) < 1e-6);
    json_decref(r);
}

/* A server that closes idle keep-alive connections (here after 10 ms, as
 * requests come every 20 ms: every connection is closed under igbench, also
 * in a slow sanitizer build) must not cost a request: a send that loses the
 * race with the close never reached the server and is resent, and a close
 * seen while idle just means a new connection. */
static void test_idle_close_is_not_an_error(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --delay-ms 1 --idle-timeout-ms 10"), 0);
    json_t *r =
        tu_igbench("--target 127.0.0.1:%d --rate 50 --arrival constant --requests 100", up.port);
    tu_stop(&up);
    assert_non_null(r);
    print_message("%d connections, %d resent\n", (int)TU_NUM(r, "connections", "opened"),
                  (int)TU_NUM(r, "connections", "resent_after_idle_close"));
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
    assert_int_equal((int)TU_NUM(r, "requests", "ok"), 100);
    assert_true(TU_NUM(r, "connections", "opened") > 1);
    json_decref(r);
}

/* Runs igbench to its exit; its exit status, or -1. The bound only keeps
 * a hung igbench inside ctest's 300 s limit. */
static int run_status(const char *args)
{
    ig_proc_t p;
    if (tu_spawn(&p, 0, "igbench", "--quiet %s", args) != 0)
        return -1;
    int rc = ig_proc_wait_exit(&p, 280000);
    ig_proc_dispose(&p);
    return rc;
}

static void test_remote_refused(void **state)
{
    assert_int_equal(run_status("--target 192.0.2.1:80 --rate 1 --requests 1"), 2);
    assert_int_equal(run_status("--target http://10.1.2.3:8080/v1 --rate 1 --requests 1"), 2);
    assert_int_equal(run_status("--target 127.0.0.1:1 --rate 1 --concurrency 1"), 2);
    assert_int_equal(run_status("--target 127.0.0.1:1 --rate 1 --max-tokens bogus:1"), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_errors_by_status),
        cmocka_unit_test(test_broken_stream),
        cmocka_unit_test(test_connect_errors),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_goodput),
        cmocka_unit_test(test_remote_refused),
        cmocka_unit_test(test_idle_close_is_not_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
