/*
 * Coordinated omission: a 1-second stall of the upstream must show in the
 * tail of an open-loop run (requests keep arriving on schedule and wait),
 * while a closed-loop run of the same stall hides it (its one user waits
 * once, and sends nothing meanwhile).
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define UPSTREAM "--quiet --delay-ms 10 --stall-at 1.0 --stall-for 1.0"

static void test_open_loop_shows_stall(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", UPSTREAM), 0);
    json_t *r =
        tu_igbench("--target 127.0.0.1:%d --rate 40 --arrival constant --duration 3.5", up.port);
    tu_stop(&up);
    assert_non_null(r);
    double p50 = TU_NUM(r, "latency_ms", "e2e", "p50");
    double p99 = TU_NUM(r, "latency_ms", "e2e", "p99");
    double max = TU_NUM(r, "latency_ms", "e2e", "max");
    print_message("open loop: p50 %.1f ms p99 %.1f ms max %.1f ms, %d connections at peak\n", p50,
                  p99, max, (int)TU_NUM(r, "connections", "peak_open"));
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
    /* ~40 of ~140 requests fall in the stall: the tail is the stall. */
    assert_true(p99 >= 500.0);
    assert_true(max >= 900.0 && max <= 1300.0);
    assert_true(p50 < 50.0);
    /* Requests in the stall waited on their own new connections. */
    assert_true(TU_NUM(r, "connections", "peak_open") >= 20);
    json_decref(r);
}

static void test_closed_loop_hides_stall(void **state)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", UPSTREAM), 0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 1 --duration 3.5", up.port);
    tu_stop(&up);
    assert_non_null(r);
    double p99 = TU_NUM(r, "latency_ms", "e2e", "p99");
    double max = TU_NUM(r, "latency_ms", "e2e", "max");
    double n = TU_NUM(r, "latency_ms", "e2e", "count");
    print_message("closed loop: %d requests, p99 %.1f ms max %.1f ms\n", (int)n, p99, max);
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
    /* The stall happened (one request waited through it) ... */
    assert_true(max >= 500.0);
    /* ... yet the closed loop's p99 barely moves: one slow sample in ~200. */
    assert_true(n >= 150);
    assert_true(p99 < 200.0);
    assert_true(TU_NUM(r, "latency_ms", "e2e", "p90") < 50.0);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_loop_shows_stall),
        cmocka_unit_test(test_closed_loop_hides_stall),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
