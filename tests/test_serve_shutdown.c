/*
 * Graceful shutdown of `infergate serve`: SIGTERM or SIGINT exits 0 once
 * idle connections are closed; a second signal during the drain exits at
 * once (status 1).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"

static const char *config_path;

static int setup(void **state)
{
    /* A long drain, so that only the second signal can end it early, and a
     * short grace (the default 5 s would only slow the test down). */
    config_path = ig_proc_temp_file("{\"listen\": \"127.0.0.1:0\","
                                    " \"limits\": {\"drain_timeout_ms\": 20000,"
                                    " \"drain_grace_ms\": 200}}",
                                    ".json");
    return config_path == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    unlink(config_path);
    return 0;
}

static void start(ig_proc_t *p)
{
    const char *args[] = {"serve", "--config", config_path, NULL};
    assert_int_equal(ig_proc_start_bin(p, "infergate", args, IG_PROC_PIPES), 0);
    if (ig_proc_wait_announce(p, 1, 10000) != 0)
        fail_msg("serve did not start:\n%s", p->err);
}

static void test_sigterm_idle_exits_0(void **state)
{
    ig_proc_t p;
    ig_tc_response_t r;
    start(&p);
    /* An idle keep-alive connection must not hold the drain. */
    int idle = ig_proc_connect(p.port);
    assert_true(idle >= 0);
    assert_int_equal(ig_gwf_get(p.port, "/health", &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    long long t0 = ig_tc_now_ms();
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 0);
    assert_true(ig_tc_now_ms() - t0 < 5000);
    assert_non_null(strstr(p.err, "SIGTERM: draining"));
    assert_non_null(strstr(p.err, "drained; exiting"));
    /* Nothing listens any more. */
    assert_int_equal(ig_proc_connect(p.port), -1);
    close(idle);
    ig_proc_dispose(&p);
}

static void test_sigint_exits_0(void **state)
{
    ig_proc_t p;
    start(&p);
    kill(p.pid, SIGINT);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 0);
    assert_non_null(strstr(p.err, "SIGINT: draining"));
    ig_proc_dispose(&p);
}

static void test_second_signal_exits_at_once(void **state)
{
    ig_proc_t p;
    start(&p);
    /* A request still arriving keeps the drain going (the server gives it
     * the chance to finish), so the process is draining when the second
     * signal comes. */
    int fd = ig_proc_connect(p.port);
    assert_true(fd >= 0);
    const char *part = "GET /health HTTP/1.1\r\nHost: x\r\n";
    assert_int_equal(write(fd, part, strlen(part)), (ssize_t)strlen(part));
    assert_int_equal(ig_proc_wait_log(&p, "GET", 200) == 0 ? 1 : 0, 0); /* not dispatched */
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_log(&p, "SIGTERM: draining", 5000), 0);
    if (ig_proc_wait_exit(&p, 150) >= 0) {
        close(fd);
        ig_proc_dispose(&p);
        skip(); /* the HTTP server ended the drain at once: nothing to interrupt */
    }
    long long t0 = ig_tc_now_ms();
    kill(p.pid, SIGINT);
    assert_int_equal(ig_proc_wait_exit(&p, 5000), 1);
    assert_true(ig_tc_now_ms() - t0 < 1000);
    assert_non_null(strstr(p.err, "SIGINT again: exiting without waiting"));
    close(fd);
    ig_proc_dispose(&p);
}

int main(void)
{
    setenv("INFERGATE_CACHE_DIR", "/tmp/infergate-test-cache", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_idle_exits_0),
        cmocka_unit_test(test_sigint_exits_0),
        cmocka_unit_test(test_second_signal_exits_at_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
