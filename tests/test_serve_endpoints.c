/*
 * `infergate serve` on loopback, through the real binary: /health, /ready
 * (503 with the reason while nothing can serve), /metrics, the gateway's
 * routes, API keys, 404, and 405 with Allow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/load.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"

#include <jansson.h>

static ig_proc_t proc;
static const char *config_path;

static int start_server(void **state)
{
    /* A config of our own: the region label proves it was read, and with no
     * pools nothing can serve, so /ready must say so. */
    config_path = ig_proc_temp_file("{\"region\": \"test-region\", \"listen\": \"127.0.0.1:0\","
                                    " \"api_keys\": [\"sk-test-1\", \"sk-test-2\"],"
                                    " \"limits\": {\"drain_grace_ms\": 0}}",
                                    ".json");
    if (config_path == NULL)
        return -1;
    const char *args[] = {"serve", "--config", config_path, NULL};
    if (ig_proc_start_bin(&proc, "infergate", args, IG_PROC_PIPES) != 0 ||
        ig_proc_wait_announce(&proc, 1, 10000) != 0) {
        fprintf(stderr, "serve did not start:\n%s\n", proc.err);
        return -1;
    }
    return 0;
}

static int stop_server(void **state)
{
    kill(proc.pid, SIGTERM);
    int rc = ig_proc_wait_exit(&proc, 10000);
    if (rc != 0)
        fprintf(stderr, "serve exited %d:\n%s\n", rc, proc.err);
    ig_proc_dispose(&proc);
    unlink(config_path);
    return rc == 0 ? 0 : -1;
}

/* GET/POST path with optional extra header lines; the caller frees r. */
static void request(const char *method, const char *path, const char *headers, ig_tc_response_t *r)
{
    char raw[1024];
    snprintf(raw, sizeof(raw), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s\r\n",
             method, path, headers ? headers : "",
             strcmp(method, "POST") == 0 ? "Content-Length: 0\r\n" : "");
    memset(r, 0, sizeof(*r));
    assert_int_equal(ig_tc_request(proc.port, raw, r, 5000), 0);
}

/* Checks an OpenAI-style error body: its type and part of its message. */
static void expect_error(const ig_tc_response_t *r, const char *type, const char *message_part)
{
    json_error_t e;
    json_t *doc = json_loads(r->body, 0, &e);
    assert_non_null(doc);
    json_t *err = json_object_get(doc, "error");
    assert_true(json_is_object(err));
    assert_string_equal(json_string_value(json_object_get(err, "type")), type);
    const char *msg = json_string_value(json_object_get(err, "message"));
    assert_non_null(msg);
    if (strstr(msg, message_part) == NULL)
        fail_msg("message '%s' lacks '%s'", msg, message_part);
    assert_non_null(json_object_get(err, "param"));
    assert_non_null(json_object_get(err, "code"));
    json_decref(doc);
}

static void test_health(void **state)
{
    ig_tc_response_t r;
    request("GET", "/health", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}");
    assert_string_equal(ig_tc_header(&r, "Content-Type"), "application/json");
    ig_tc_response_free(&r);
}

static void test_ready_without_upstreams(void **state)
{
    ig_tc_response_t r;
    request("GET", "/ready", NULL, &r);
    assert_int_equal(r.status, 503);
    expect_error(&r, "unavailable_error", "not ready: no pools and no sites are configured");
    ig_tc_response_free(&r);
}

static void test_metrics(void **state)
{
    ig_tc_response_t r;
    /* One /health first: its route label must show up below. */
    request("GET", "/health", NULL, &r);
    ig_tc_response_free(&r);
    request("GET", "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "Content-Type"), "text/plain; version=0.0.4");
    assert_non_null(strstr(r.body, "# TYPE infergate_ready gauge\ninfergate_ready 0\n"));
    assert_non_null(strstr(r.body, "# HELP infergate_build_info "));
    assert_non_null(strstr(r.body, "region=\"test-region\"} 1\n"));
    assert_non_null(strstr(r.body, "route=\"/health\""));
    ig_tc_response_free(&r);
    /* Client paths never become labels. */
    request("GET", "/no/such/path", NULL, &r);
    ig_tc_response_free(&r);
    request("GET", "/metrics", NULL, &r);
    assert_null(strstr(r.body, "/no/such/path"));
    ig_tc_response_free(&r);
}

static void test_gateway_routes(void **state)
{
    ig_tc_response_t r;
    request("GET", "/load", NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *doc = json_loads(r.body, 0, NULL);
    assert_true(json_is_object(doc));
    json_decref(doc);
    /* What a peer's site probe reads: every field a gateway sends. */
    ig_load_t l;
    ig_load_init(&l);
    assert_int_equal(ig_load_decode(r.body, r.body_len, &l, NULL, 0), 0);
    assert_int_equal(l.has, IG_LOAD_GATEWAY_FIELDS);
    assert_int_equal(l.ready_instances, 0);
    ig_load_dispose(&l);
    ig_tc_response_free(&r);

    request("GET", "/status", NULL, &r);
    assert_int_equal(r.status, 200);
    doc = json_loads(r.body, 0, NULL);
    assert_true(json_is_object(doc));
    json_decref(doc);
    ig_tc_response_free(&r);

    request("GET", "/v1/models", "Authorization: Bearer sk-test-2\r\n", &r);
    assert_int_equal(r.status, 200);
    doc = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(doc, "object")), "list");
    assert_int_equal(json_array_size(json_object_get(doc, "data")), 0);
    json_decref(doc);
    ig_tc_response_free(&r);
}

static void test_api_keys(void **state)
{
    static const char *const bad[] = {NULL, "Authorization: Bearer sk-test-3\r\n",
                                      "Authorization: Bearer sk-test-\r\n",
                                      "Authorization: Basic sk-test-1\r\n"};
    ig_tc_response_t r;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        request("POST", "/v1/completions", bad[i], &r);
        assert_int_equal(r.status, 401);
        assert_string_equal(ig_tc_header(&r, "WWW-Authenticate"), "Bearer");
        expect_error(&r, "invalid_request_error", "API key");
        ig_tc_response_free(&r);
    }
    /* With a key the request reaches the api module, which rejects the empty body. */
    request("POST", "/v1/completions", "Authorization: Bearer sk-test-1\r\n", &r);
    assert_int_equal(r.status, 400);
    ig_tc_response_free(&r);
    /* Probes need no key. */
    request("GET", "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
}

static void test_not_found(void **state)
{
    ig_tc_response_t r;
    request("GET", "/v0/nothing?x=1", NULL, &r);
    assert_int_equal(r.status, 404);
    expect_error(&r, "not_found_error", "/v0/nothing");
    ig_tc_response_free(&r);
    /* Exact paths: a suffix is another path. */
    request("GET", "/healthz", NULL, &r);
    assert_int_equal(r.status, 404);
    ig_tc_response_free(&r);
}

static void test_method_not_allowed(void **state)
{
    /* A GET route also answers HEAD, so Allow names both. */
    static const char *const cases[][3] = {{"POST", "/health", "GET, HEAD"},
                                           {"DELETE", "/ready", "GET, HEAD"},
                                           {"PUT", "/metrics", "GET, HEAD"},
                                           {"GET", "/v1/completions", "POST"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_tc_response_t r;
        request(cases[i][0], cases[i][1], NULL, &r);
        assert_int_equal(r.status, 405);
        assert_non_null(ig_tc_header(&r, "Allow"));
        assert_string_equal(ig_tc_header(&r, "Allow"), cases[i][2]);
        expect_error(&r, "invalid_request_error", cases[i][0]);
        ig_tc_response_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_ready_without_upstreams),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_gateway_routes),
        cmocka_unit_test(test_api_keys),
        cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_method_not_allowed),
    };
    return cmocka_run_group_tests(tests, start_server, stop_server);
}
