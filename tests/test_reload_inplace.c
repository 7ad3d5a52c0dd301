/*
 * What a reload changes in place, on a running gateway with a real worker:
 * an HTTP limit (a body the old limit took is now 413, and back), the
 * routing policy, and a site added then removed, all without the pool's
 * worker being restarted (same pid) and with "no pool changes" said.
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

#include "files.h"
#include "gwfixture.h"

static char path[1024];
static int port;

static void write_config(const char *extra)
{
    const char *tmp = ig_gwf_pool_config("r1", port, ig_gwf_model_dir, 1, 1, 1, 4, NULL, extra);
    assert_non_null(tmp);
    assert_int_equal(ig_tf_replace_from(path, tmp), 0);
}

static void reload_ok(void)
{
    double before = ig_gwf_reloads(port, "applied");
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    if (r.status != 200)
        fprintf(stderr, "reload: %d %s\n", r.status, r.body);
    assert_int_equal(r.status, 200);
    assert_null(strstr(r.body, "replacing pool"));
    ig_tc_response_free(&r);
    assert_int_equal(ig_gwf_wait_reloads(port, "applied", before + 1, 10000), 0);
}

static json_t *status(void)
{
    json_t *st = ig_gwf_get_json(port, "/status");
    assert_non_null(st);
    return st;
}

static int worker_pid(void)
{
    json_t *st = status();
    json_t *in = json_array_get(
        json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances"), 0);
    int pid = (int)json_integer_value(json_object_get(in, "pid"));
    json_decref(st);
    return pid;
}

/* A completion whose body is padded past 400 bytes. */
static int big_completion(void)
{
    char body[1024];
    char pad[600];
    memset(pad, 'a', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';
    snprintf(body, sizeof(body),
             "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":1,\"user\":\"%s\"}", pad);
    ig_tc_response_t r;
    if (ig_gwf_post(port, "/v1/completions", body, &r, 30000) != 0)
        return -1;
    int st = r.status;
    ig_tc_response_free(&r);
    return st;
}

static void test_limits_routing_sites_in_place(void **state)
{
    (void)state;
    port = ig_proc_free_port();
    const char *tmp = ig_gwf_pool_config("r1", port, ig_gwf_model_dir, 1, 1, 1, 4, NULL, NULL);
    assert_non_null(tmp);
    snprintf(path, sizeof(path), "%s", tmp);
    ig_proc_t gw;
    assert_int_equal(ig_gwf_serve(&gw, path, port, "warn", 0, 20000, 60000), 0);
    int pid = worker_pid();
    assert_true(pid > 0);
    assert_int_equal(big_completion(), 200);

    /* A smaller body limit, another policy, a site. */
    write_config(",\"limits\":{\"drain_grace_ms\":0,\"max_body_bytes\":400},"
                 "\"routing\":{\"policy\":\"round_robin\"},"
                 "\"sites\":[{\"name\":\"far\",\"url\":\"http://127.0.0.1:1\","
                 "\"models\":[\"tiny\"]}]");
    reload_ok();
    assert_int_equal(big_completion(), 413);
    json_t *st = status();
    assert_string_equal(json_string_value(json_object_get(st, "policy")), "round_robin");
    assert_int_equal(json_array_size(json_object_get(st, "sites")), 1);
    json_decref(st);
    assert_int_equal(worker_pid(), pid);

    /* Back: the limit, the policy, and the site drains away. */
    write_config(NULL);
    reload_ok();
    assert_int_equal(big_completion(), 200);
    st = status();
    assert_string_equal(json_string_value(json_object_get(st, "policy")), "latency");
    json_decref(st);
    long long end = ig_tc_now_ms() + 5000;
    size_t nsites = 1;
    while (ig_tc_now_ms() < end && nsites != 0) {
        st = status();
        nsites = json_array_size(json_object_get(st, "sites"));
        json_decref(st);
        usleep(50 * 1000);
    }
    assert_int_equal(nsites, 0);
    assert_int_equal(worker_pid(), pid);

    assert_int_equal(ig_proc_stop(&gw, SIGTERM, 30000), 0);
    ig_proc_dispose(&gw);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_routing_sites_in_place),
    };
    return cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
}
