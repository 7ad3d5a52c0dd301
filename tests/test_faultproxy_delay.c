/*
 * faultproxy's added delay, measured end to end with igbench: the round trip
 * through the proxy minus the round trip through a second faultproxy with no
 * delay equals the setting within 2 ms (see SLACK for sanitizer builds). The
 * proxy's own relaying cancels out that way, in any build. Medians of
 * several samples keep one hiccup of the shared machine out.
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>

#define SAMPLES 3

/* Sanitizer builds run several times slower, and the proxy's timer wakes
 * late by their overhead (ASan on a Xeon VM: 2-3.6 ms over the setting);
 * there the delay is checked for shape, within a quarter of the setting
 * more. The 2 ms bound is the optimized build's. */
#ifdef IG_SANITIZED
#define SLACK 0.25
#else
#define SLACK 0.0
#endif

/* p50 round trip (ms) of a raw GET to port. */
static double rtt(int port, const char *path)
{
    json_t *r =
        tu_igbench("--target 127.0.0.1:%d --concurrency 1 --requests 30 --raw GET %s", port, path);
    assert_non_null(r);
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
    double v = TU_NUM(r, "latency_ms", "e2e", "p50");
    json_decref(r);
    return v;
}

/* Median over SAMPLES of (through the delaying proxy - through the plain one). */
static double added_delay(int plain, int proxied, const char *path)
{
    double d[SAMPLES];
    for (int i = 0; i < SAMPLES; i++)
        d[i] = rtt(proxied, path) - rtt(plain, path);
    return tu_median(d, SAMPLES);
}

static void check_added(const char *proxy_args, const char *path, double expect_ms, double tol_ms)
{
    ig_proc_t up, fp0, fp;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet"), 0);
    assert_int_equal(tu_start(&fp0, "faultproxy", "--quiet --target 127.0.0.1:%d", up.port), 0);
    assert_int_equal(
        tu_start(&fp, "faultproxy", "--quiet --target 127.0.0.1:%d %s", up.port, proxy_args), 0);
    double added = added_delay(fp0.port, fp.port, path);
    tu_stop(&fp);
    tu_stop(&fp0);
    tu_stop(&up);
    print_message("%s: added %.3f ms, setting %.1f ms, ratio %.3f\n", proxy_args, added, expect_ms,
                  added / expect_ms);
    assert_true(fabs(added - expect_ms) <= tol_ms + SLACK * expect_ms);
}

static void test_one_way_s2c(void **state)
{
    check_added("--s2c-delay-ms 30", "/health", 30.0, 2.0);
}

static void test_one_way_c2s(void **state)
{
    check_added("--c2s-delay-ms 15", "/health", 15.0, 2.0);
}

static void test_both_ways(void **state)
{
    /* --delay-ms applies to each direction: a round trip gains twice. */
    check_added("--delay-ms 10", "/health", 20.0, 2.0);
}

/* Jitter varies each chunk's delay but never reorders bytes: a stream of 60
 * SSE events through +-8 ms of jitter arrives whole and parses. */
static void test_jitter_keeps_order(void **state)
{
    ig_proc_t up, fp;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --itl-ms 1"), 0);
    assert_int_equal(tu_start(&fp, "faultproxy",
                              "--quiet --target 127.0.0.1:%d --delay-ms 10 --jitter-ms 8", up.port),
                     0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 4 --requests 20 --stream "
                           "--max-tokens 60",
                           fp.port);
    tu_stop(&fp);
    tu_stop(&up);
    assert_non_null(r);
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
    assert_int_equal((int)TU_NUM(r, "output_tokens"), 20 * 60);
    /* The gaps between tokens now spread over the jitter range. */
    assert_true(TU_NUM(r, "latency_ms", "itl", "max") > 3.0);
    json_decref(r);
}

/* 200 kB at 1 MB/s takes ~200 ms. */
static void test_bandwidth(void **state)
{
    ig_proc_t up, fp;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet"), 0);
    assert_int_equal(
        tu_start(&fp, "faultproxy", "--quiet --target 127.0.0.1:%d --bandwidth 1000000", up.port),
        0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 1 --requests 5 --raw GET "
                           "/bytes/200000",
                           fp.port);
    tu_stop(&fp);
    tu_stop(&up);
    assert_non_null(r);
    assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
    double p50 = TU_NUM(r, "latency_ms", "e2e", "p50");
    print_message("200 kB at 1 MB/s: %.1f ms\n", p50);
    assert_true(p50 >= 190.0 && p50 <= 240.0);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_way_s2c), cmocka_unit_test(test_one_way_c2s),
        cmocka_unit_test(test_both_ways),   cmocka_unit_test(test_jitter_keeps_order),
        cmocka_unit_test(test_bandwidth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
