/* ig_api_respond_json / ig_api_respond_error, the one way the gateway and the
 * worker answer JSON and errors, over a real socket: the OpenAI error shape,
 * Retry-After on 429 and 503 (the error's own value, else 1 s, never below
 * 1), none on other errors, and out of memory as 503 + Retry-After. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "infergate/api.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

static void on_request(ig_http_req_t *req, void *data)
{
    const char *p = ig_http_req_path(req);
    ig_api_error_t e;
    if (strcmp(p, "/json") == 0) {
        ig_api_respond_json(req, 201, json_pack("{s:i}", "x", 7));
    } else if (strcmp(p, "/null") == 0) {
        /* A builder that ran out of memory hands over NULL. */
        ig_api_respond_json(req, 200, NULL);
    } else if (strcmp(p, "/oom") == 0) {
        ig_api_error_oom(&e);
        ig_api_respond_error(req, &e);
    } else if (strcmp(p, "/respond-oom") == 0) {
        ig_api_respond_oom(req);
    } else if (strcmp(p, "/400") == 0) {
        ig_api_error(&e, 400, "temperature", "'temperature' must be a number");
        ig_api_respond_error(req, &e);
    } else if (strcmp(p, "/404") == 0) {
        ig_api_error(&e, 404, "model", "no such model");
        e.code = "model_not_found";
        ig_api_respond_error(req, &e);
    } else if (strcmp(p, "/429") == 0) {
        ig_api_error(&e, 429, NULL, "queue full");
        ig_api_respond_error(req, &e);
    } else if (strcmp(p, "/429-7") == 0) {
        ig_api_error(&e, 429, NULL, "queue full");
        e.retry_after_s = 7;
        ig_api_respond_error(req, &e);
    } else if (strcmp(p, "/503-neg") == 0) {
        ig_api_error(&e, 503, NULL, "draining");
        e.retry_after_s = -3;
        ig_api_respond_error(req, &e);
    } else {
        ig_api_error(&e, 500, NULL, "generation failed");
        ig_api_respond_error(req, &e);
    }
}

static ig_ts_t *ts;

static int setup(void **state)
{
    ts = ig_ts_start("127.0.0.1:0", NULL, on_request, NULL);
    return ts ? 0 : -1;
}

static int teardown(void **state)
{
    ig_ts_stop(ts);
    return 0;
}

/* GETs path; returns the parsed body (the caller frees both). */
static json_t *get(const char *path, ig_tc_response_t *r)
{
    char raw[256];
    snprintf(raw, sizeof(raw), "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
    assert_int_equal(ig_tc_request(ig_ts_port(ts), raw, r, TMO), 0);
    assert_string_equal(ig_tc_header(r, "Content-Type"), "application/json");
    json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
    assert_non_null(j);
    return j;
}

/* Asserts the OpenAI error shape and its fields. */
static void expect_error(json_t *j, const char *type, const char *param, const char *message)
{
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    assert_string_equal(json_string_value(json_object_get(e, "message")), message);
    json_t *p = json_object_get(e, "param");
    if (param == NULL)
        assert_true(json_is_null(p));
    else
        assert_string_equal(json_string_value(p), param);
    assert_non_null(json_object_get(e, "code"));
}

static void test_json(void **state)
{
    ig_tc_response_t r;
    json_t *j = get("/json", &r);
    assert_int_equal(r.status, 201);
    assert_int_equal(json_integer_value(json_object_get(j, "x")), 7);
    assert_null(ig_tc_header(&r, "Retry-After"));
    json_decref(j);
    ig_tc_response_free(&r);
}

/* Out of memory is a transient server condition: 503, retry after 1 s,
 * whether a builder failed (NULL doc) or a caller said so. */
static void test_out_of_memory(void **state)
{
    static const char *const paths[] = {"/null", "/oom", "/respond-oom"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        ig_tc_response_t r;
        json_t *j = get(paths[i], &r);
        assert_int_equal(r.status, 503);
        assert_non_null(ig_tc_header(&r, "Retry-After"));
        assert_string_equal(ig_tc_header(&r, "Retry-After"), "1");
        expect_error(j, "unavailable_error", NULL, "out of memory");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "code")),
                         503);
        json_decref(j);
        ig_tc_response_free(&r);
    }
}

static void test_client_errors_have_no_retry_after(void **state)
{
    ig_tc_response_t r;
    json_t *j = get("/400", &r);
    assert_int_equal(r.status, 400);
    assert_null(ig_tc_header(&r, "Retry-After"));
    expect_error(j, "invalid_request_error", "temperature", "'temperature' must be a number");
    json_decref(j);
    ig_tc_response_free(&r);

    j = get("/404", &r);
    assert_int_equal(r.status, 404);
    assert_null(ig_tc_header(&r, "Retry-After"));
    expect_error(j, "not_found_error", "model", "no such model");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "model_not_found");
    json_decref(j);
    ig_tc_response_free(&r);

    j = get("/500", &r);
    assert_int_equal(r.status, 500);
    assert_null(ig_tc_header(&r, "Retry-After"));
    expect_error(j, "server_error", NULL, "generation failed");
    json_decref(j);
    ig_tc_response_free(&r);
}

static void test_retry_after(void **state)
{
    static const struct {
        const char *path;
        int status;
        const char *retry_after, *type;
    } cases[] = {
        {"/429", 429, "1", "rate_limit_error"},
        {"/429-7", 429, "7", "rate_limit_error"},
        {"/503-neg", 503, "1", "unavailable_error"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_tc_response_t r;
        json_t *j = get(cases[i].path, &r);
        assert_int_equal(r.status, cases[i].status);
        assert_non_null(ig_tc_header(&r, "Retry-After"));
        assert_string_equal(ig_tc_header(&r, "Retry-After"), cases[i].retry_after);
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                            cases[i].type);
        json_decref(j);
        ig_tc_response_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_client_errors_have_no_retry_after),
        cmocka_unit_test(test_retry_after),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
