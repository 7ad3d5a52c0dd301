/*
 * Pool instances keep the deadlines of routing.*_timeout_ms, as sites do:
 * a real worker that stalls (SIGSTOP: it still accepts on its socket but
 * never answers) makes a request end with 504 after first_token_timeout_ms,
 * not after a built-in minute.
 *
 * Timing: it measures the time to the 504 against the configured deadline
 * (hundreds of milliseconds, with generous bounds).
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

static int worker_pid(int port)
{
    json_t *st = ig_gwf_get_json(port, "/status");
    json_t *in = json_array_get(
        json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances"), 0);
    int pid = (int)json_integer_value(json_object_get(in, "pid"));
    json_decref(st);
    return pid;
}

/* Sends one completion to a stalled worker; returns the status and the
 * milliseconds to it. */
static int stalled_request(int port, long long *ms)
{
    long long t0 = ig_tc_now_ms();
    ig_tc_response_t r;
    int status = 0;
    if (ig_gwf_post(port, "/v1/completions",
                    "{\"model\":\"tiny\",\"prompt\":\"once upon a time\",\"max_tokens\":4}", &r,
                    30000) == 0) {
        status = r.status;
        if (status == 504)
            assert_non_null(strstr(r.body, "upstream_timeout"));
        ig_tc_response_free(&r);
    }
    *ms = ig_tc_now_ms() - t0;
    return status;
}

static void test_first_token_timeout_applies_to_pools(void **state)
{
    int port = ig_proc_free_port();
    const char *path =
        ig_gwf_pool_config("solo", port, ig_gwf_model_dir, 1, 1, 1, 4, NULL,
                           ",\"routing\":{\"first_token_timeout_ms\":800,\"max_retries\":0}");
    assert_non_null(path);
    ig_proc_t g;
    assert_int_equal(ig_gwf_serve(&g, path, port, "warn", 0, 20000, 60000), 0);

    /* Healthy first: the deadline does not cut a normal answer. */
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_complete(port, 2, &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);

    int pid = worker_pid(port);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    long long ms = 0;
    int status = stalled_request(port, &ms);
    assert_int_equal(kill(pid, SIGCONT), 0);
    print_message("stalled worker: %d after %lld ms (first_token_timeout_ms 800)\n", status, ms);
    assert_int_equal(status, 504);
    assert_true(ms >= 700);
    assert_true(ms < 5000); /* the built-in default was 60 s */

    /* The worker serves again once it runs. */
    long long end = ig_tc_now_ms() + 20000;
    int ok = 0;
    while (!ok && ig_tc_now_ms() < end) {
        if (ig_gwf_complete(port, 2, &r) == 0) {
            ok = r.status == 200;
            ig_tc_response_free(&r);
        }
        if (!ok)
            usleep(200 * 1000);
    }
    assert_true(ok);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 20000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_token_timeout_applies_to_pools),
    };
    return cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
}
