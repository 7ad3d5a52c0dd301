/* The route table (include/infergate/http_route.h) over real sockets: exact
 * and prefix rows, first match wins, GET rows answer HEAD, 404 for unknown
 * paths (counted as "unmatched"), 405 with an Allow header computed from the
 * rows, and the metrics route label taken from the row, never the client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "infergate/http_route.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

/* Each handler answers its own name, so the test sees which row ran. */
static void answer(ig_http_req_t *req, const char *name)
{
    ig_http_respond(req, 200, "text/plain", name, strlen(name));
}
static void h_get_item(ig_http_req_t *req, void *data)
{
    answer(req, "get-item");
}
static void h_post_item(ig_http_req_t *req, void *data)
{
    answer(req, "post-item");
}
static void h_put_item(ig_http_req_t *req, void *data)
{
    answer(req, "put-item");
}
static void h_special(ig_http_req_t *req, void *data)
{
    answer(req, "special");
}
static void h_prefix(ig_http_req_t *req, void *data)
{
    answer(req, "prefix");
}
static void h_data(ig_http_req_t *req, void *data)
{
    answer(req, (const char *)data);
}

static const ig_http_route_t routes[] = {
    {"GET", "/item", h_get_item, 0},   {"POST", "/item", h_post_item, 0},
    {"GET", "/item", h_put_item, 0}, /* shadowed: the first GET row wins */
    {"PUT", "/item", h_put_item, 0},   {"DELETE", "/files/special", h_special, 0},
    {"POST", "/files/*", h_prefix, 0}, {"GET", "/data", h_data, 0},
};

static void on_request(ig_http_req_t *req, void *data)
{
    ig_http_route_dispatch(routes, sizeof(routes) / sizeof(routes[0]), req, data);
}

static ig_ts_t *ts;

static int setup(void **state)
{
    ts = ig_ts_start("127.0.0.1:0", NULL, on_request, "owner-data");
    return ts ? 0 : -1;
}

static int teardown(void **state)
{
    ig_ts_stop(ts);
    return 0;
}

static void request(const char *method, const char *path, ig_tc_response_t *r)
{
    char raw[512];
    snprintf(raw, sizeof(raw), "%s %s HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n", method,
             path);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_non_null(tc);
    assert_int_equal(ig_tc_sends(tc, raw), 0);
    assert_int_equal(ig_tc_read_response_ex(tc, r, TMO, strcmp(method, "HEAD") == 0, 0), 0);
    ig_tc_close(tc);
}

static void expect_body(const char *method, const char *path, const char *body)
{
    ig_tc_response_t r;
    request(method, path, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, body);
    ig_tc_response_free(&r);
}

static void test_rows(void **state)
{
    expect_body("GET", "/item", "get-item");
    expect_body("POST", "/item", "post-item");
    expect_body("PUT", "/item", "put-item");
    /* An exact row before a prefix row of the same path; a prefix row takes
     * any path under it, the query aside. */
    expect_body("DELETE", "/files/special", "special");
    expect_body("POST", "/files/special", "prefix");
    expect_body("POST", "/files/a/b?x=1", "prefix");
    /* The table owner's data reaches the handler. */
    expect_body("GET", "/data", "owner-data");
}

static void test_head_on_get_rows(void **state)
{
    ig_tc_response_t r;
    request("HEAD", "/item", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 0);
    assert_string_equal(ig_tc_header(&r, "Content-Length"), "8"); /* "get-item" */
    ig_tc_response_free(&r);
    /* No GET row: HEAD is a method like any other. */
    request("HEAD", "/files/x", &r);
    assert_int_equal(r.status, 405);
    assert_string_equal(ig_tc_header(&r, "Allow"), "POST");
    ig_tc_response_free(&r);
}

static void expect_error(const ig_tc_response_t *r, const char *type, const char *needle)
{
    json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    if (strstr(msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", msg, needle);
    json_decref(j);
}

static void test_not_found(void **state)
{
    static const char *const paths[] = {"/nothing", "/items", "/ite", "/files", "/data/x"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        ig_tc_response_t r;
        request("GET", paths[i], &r);
        assert_int_equal(r.status, 404);
        assert_null(ig_tc_header(&r, "Allow"));
        expect_error(&r, "not_found_error", paths[i]);
        ig_tc_response_free(&r);
    }
}

static void test_method_not_allowed(void **state)
{
    /* Allow lists each method of the path once, in table order, with HEAD
     * after GET; the shadowed GET row adds nothing. */
    static const char *const cases[][3] = {
        {"PATCH", "/item", "GET, HEAD, POST, PUT"},
        {"GET", "/files/special", "DELETE, POST"},
        {"GET", "/files/other", "POST"},
        {"POST", "/data", "GET, HEAD"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_tc_response_t r;
        request(cases[i][0], cases[i][1], &r);
        assert_int_equal(r.status, 405);
        assert_non_null(ig_tc_header(&r, "Allow"));
        assert_string_equal(ig_tc_header(&r, "Allow"), cases[i][2]);
        expect_error(&r, "invalid_request_error", cases[i][0]);
        ig_tc_response_free(&r);
    }
}

/* The value of the exposition line `series`, or 0 when absent. */
static double metric(const char *series)
{
    return ig_ts_metric(series, 0);
}

static void expect_at_least(const char *series, double want)
{
    ig_ts_expect_metric(series, want, 1, TMO);
}

static void test_route_labels(void **state)
{
    const char *prefix = "infergate_http_requests_total{route=\"/files/*\",status=\"200\"}";
    const char *wrong = "infergate_http_requests_total{route=\"/item\",status=\"405\"}";
    const char *lost = "infergate_http_requests_total{route=\"unmatched\",status=\"404\"}";
    double p0 = metric(prefix), w0 = metric(wrong), l0 = metric(lost);
    expect_body("POST", "/files/one", "prefix");
    expect_body("POST", "/files/two", "prefix");
    ig_tc_response_t r;
    request("PATCH", "/item", &r);
    ig_tc_response_free(&r);
    request("GET", "/client/chosen/path", &r);
    ig_tc_response_free(&r);
    /* Rows label their requests; client paths never become labels. */
    expect_at_least(prefix, p0 + 2);
    expect_at_least(wrong, w0 + 1);
    expect_at_least(lost, l0 + 1);
    char *text = ig_ts_metrics();
    assert_null(strstr(text, "/files/one"));
    assert_null(strstr(text, "/client/chosen/path"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),         cmocka_unit_test(test_head_on_get_rows),
        cmocka_unit_test(test_not_found),    cmocka_unit_test(test_method_not_allowed),
        cmocka_unit_test(test_route_labels),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
