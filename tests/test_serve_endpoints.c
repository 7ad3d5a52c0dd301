/*
 * `infergate serve` on loopback: /health, /ready (503 until a backend is
 * attached), /metrics, 404 and 405 with Allow, through the real binary.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "serve_proc.h"

#include <jansson.h>

static sp_proc_t proc;
static char *config_path;

static int start_server(void **state)
{
    /* A config of our own, so that the region label proves it was read. */
    config_path = sp_write_temp("{\"region\": \"test-region\", \"listen\": \"127.0.0.1:0\","
                                " \"models\": [{\"name\": \"tiny\", \"path\": \"/nonexistent\"}],"
                                " \"pools\": [{\"name\": \"p\", \"model\": \"tiny\"}]}");
    if (config_path == NULL)
        return -1;
    const char *args[] = {"serve", "--config", config_path, NULL};
    if (sp_start(&proc, args) != 0 || sp_wait_listening(&proc, 10000) != 0) {
        fprintf(stderr, "serve did not start:\n%s\n", proc.err);
        return -1;
    }
    return 0;
}

static int stop_server(void **state)
{
    kill(proc.pid, SIGTERM);
    int rc = sp_wait_exit(&proc, 10000);
    sp_stop(&proc);
    unlink(config_path);
    free(config_path);
    return rc == 0 ? 0 : -1;
}

/* Parses an OpenAI-style error body and checks its type. */
static void expect_error(const sp_resp_t *r, const char *type, const char *message_part)
{
    json_error_t e;
    json_t *doc = json_loads(r->body, 0, &e);
    assert_non_null(doc);
    json_t *err = json_object_get(doc, "error");
    assert_true(json_is_object(err));
    assert_string_equal(json_string_value(json_object_get(err, "type")), type);
    const char *msg = json_string_value(json_object_get(err, "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, message_part));
    assert_non_null(json_object_get(err, "param"));
    assert_non_null(json_object_get(err, "code"));
    json_decref(doc);
}

static void test_health(void **state)
{
    sp_resp_t r;
    char ct[128];
    assert_int_equal(sp_request(proc.port, "GET", "/health", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}");
    assert_int_equal(sp_header(&r, "Content-Type", ct, sizeof(ct)), 0);
    assert_string_equal(ct, "application/json");
}

static void test_ready_until_backend(void **state)
{
    sp_resp_t r;
    assert_int_equal(sp_request(proc.port, "GET", "/ready", &r), 0);
    assert_int_equal(r.status, 503);
    expect_error(&r, "unavailable_error", "not ready: ");
}

static void test_metrics(void **state)
{
    sp_resp_t r;
    char ct[128];
    /* One /health first: its route label must show up below. */
    assert_int_equal(sp_request(proc.port, "GET", "/health", &r), 0);
    assert_int_equal(sp_request(proc.port, "GET", "/metrics", &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(sp_header(&r, "Content-Type", ct, sizeof(ct)), 0);
    assert_string_equal(ct, "text/plain; version=0.0.4");
    assert_non_null(strstr(r.body, "# TYPE infergate_ready gauge\ninfergate_ready 0\n"));
    assert_non_null(strstr(r.body, "# HELP infergate_build_info "));
    assert_non_null(strstr(r.body, "region=\"test-region\"} 1\n"));
    assert_non_null(strstr(r.body, "route=\"/health\""));
    /* Client paths never become labels. */
    assert_int_equal(sp_request(proc.port, "GET", "/no/such/path", &r), 0);
    assert_int_equal(sp_request(proc.port, "GET", "/metrics", &r), 0);
    assert_null(strstr(r.body, "/no/such/path"));
}

static void test_not_found(void **state)
{
    sp_resp_t r;
    assert_int_equal(sp_request(proc.port, "GET", "/v0/nothing?x=1", &r), 0);
    assert_int_equal(r.status, 404);
    expect_error(&r, "not_found_error", "/v0/nothing");
    /* Exact paths: a suffix is another path. */
    assert_int_equal(sp_request(proc.port, "GET", "/healthz", &r), 0);
    assert_int_equal(r.status, 404);
}

static void test_method_not_allowed(void **state)
{
    static const char *const cases[][2] = {
        {"POST", "/health"}, {"DELETE", "/ready"}, {"PUT", "/metrics"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sp_resp_t r;
        char allow[64];
        assert_int_equal(sp_request(proc.port, cases[i][0], cases[i][1], &r), 0);
        assert_int_equal(r.status, 405);
        assert_int_equal(sp_header(&r, "Allow", allow, sizeof(allow)), 0);
        assert_string_equal(allow, "GET");
        expect_error(&r, "invalid_request_error", cases[i][0]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_ready_until_backend),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_method_not_allowed),
    };
    return cmocka_run_group_tests(tests, start_server, stop_server);
}
