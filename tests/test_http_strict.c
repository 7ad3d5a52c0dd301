/* Strict parsing: every malformed or ambiguous framing case gets a 400 (or
 * the stated status) in the OpenAI error shape, and the connection closes.
 * Several cases are ones llhttp 8.1 itself accepts (obs-fold, a space before
 * a header name after another header, NUL in a value, no CRLF after chunk
 * data); the server's own checks must catch them. The cases are data:
 * tests/cases/http_strict/<case>/input (the raw bytes) and expect (the
 * status); cve_2024_27982_* put a space before a header name right after
 * the request line, and after another header, where it would hide
 * Content-Length (CVE-2024-27982). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "cases.h"
#include "files.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

/* Why r is not in the OpenAI error shape,
 * {"error":{"message","type","param","code"}}, or NULL when it is. */
static const char *error_shape_wrong(const ig_tc_response_t *r)
{
    const char *ct = ig_tc_header(r, "content-type");
    if (ct == NULL || strcmp(ct, "application/json") != 0)
        return "content-type is not application/json";
    json_error_t err;
    json_t *o = json_loads(r->body, 0, &err);
    if (o == NULL)
        return "body is not JSON";
    json_t *e = json_object_get(o, "error");
    json_t *msg = json_object_get(e, "message");
    const char *why = NULL;
    if (!json_is_object(e))
        why = "no error object";
    else if (!json_is_string(msg) || strlen(json_string_value(msg)) == 0)
        why = "error.message is not a non-empty string";
    else if (!json_is_string(json_object_get(e, "type")))
        why = "error.type is not a string";
    else if (json_object_get(e, "param") == NULL || json_object_get(e, "code") == NULL)
        why = "error.param or error.code is missing";
    json_decref(o);
    return why;
}

/* One case of tests/cases/http_strict/<case>/: input is sent as it is on a
 * fresh connection; expect holds the status. The answer must be in the
 * error shape with "Connection: close", and the connection must close. */
static int run_case(const char *name, const char *dir, void *data)
{
    (void)data;
    char path[1024];
    snprintf(path, sizeof(path), "%s/input", dir);
    size_t len;
    char *raw = ig_tf_read(path, &len);
    char *expect = ig_case_expect(dir);
    if (raw == NULL || expect == NULL) {
        print_error("case %s: no input or expect file\n", name);
        free(raw);
        free(expect);
        return 1;
    }
    int status = atoi(expect), failed = 1;
    free(expect);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ig_ts_echo_server));
    ig_tc_response_t r;
    int rc = -1;
    if (tc == NULL || ig_tc_send(tc, raw, len) != 0) {
        print_error("case %s: cannot send\n", name);
    } else if ((rc = ig_tc_read_response(tc, &r, TMO)) != 0 || r.status != status) {
        print_error("case %s: rc %d status %d, want %d\n", name, rc, rc == 0 ? r.status : 0,
                    status);
    } else {
        const char *conn = ig_tc_header(&r, "connection");
        const char *why = error_shape_wrong(&r);
        if (conn == NULL || strcmp(conn, "close") != 0)
            print_error("case %s: no Connection: close\n", name);
        else if (why != NULL)
            print_error("case %s: %s\n", name, why);
        else if (ig_tc_wait_closed(tc, TMO) != 1)
            print_error("case %s: connection not closed\n", name);
        else
            failed = 0;
    }
    if (rc == 0)
        ig_tc_response_free(&r);
    if (tc != NULL)
        ig_tc_close(tc);
    free(raw);
    return failed;
}

static void test_bad_requests(void **state)
{
    int n;
    assert_int_equal(ig_cases_foreach("http_strict", run_case, NULL, &n), 0);
    assert_int_equal(n, 52); /* the suite must not silently shrink */
}

/* A strict server must still accept what is valid. */
static void test_valid_edge_cases(void **state)
{
    static const char *ok[] = {
        "GET / HTTP/1.1\r\nHost: t\r\nX-A: \t a b \t\r\n\r\n",          /* OWS, inner SP */
        "GET / HTTP/1.1\r\nHost: t\r\nX-A: caf\xc3\xa9\r\n\r\n",        /* obs-text */
        "GET / HTTP/1.1\r\nhOsT: t\r\nX-A:\r\n\r\n",                    /* empty value */
        "\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n",                        /* leading CRLF */
        "GET http://example/a/b?q=1 HTTP/1.1\r\nHost: example\r\n\r\n", /* absolute-form */
        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 000\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        /* no upgrade here: answered as a plain request */
        "GET / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
        "HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: x\r\n"
        "Content-Length: 2\r\n\r\nab",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_tc_request(ig_ts_port(ig_ts_echo_server), ok[i], &r, TMO), 0);
        if (r.status != 200)
            fail_msg("valid case %zu got %d: %s", i, r.status, r.body);
        ig_tc_response_free(&r);
    }
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(ig_ts_port(ig_ts_echo_server),
                                   "GET http://example/a/b?q=1 HTTP/1.1\r\nHost: example\r\n\r\n",
                                   &r, TMO),
                     0);
    assert_string_equal(r.body, "GET /a/b?q=1 0\n");
    ig_tc_response_free(&r);
}

/* The same malformed bytes split at every position still fail the same way,
 * so that the pre-scan cannot be bypassed by packet boundaries. */
static void test_split_delivery(void **state)
{
    const char *raw = "POST / HTTP/1.1\r\nHost: t\r\n Content-Length: 5\r\n\r\nhello";
    size_t len = strlen(raw);
    for (size_t cut = 1; cut < len; cut += 3) {
        ig_tc_t *tc = ig_tc_connect(ig_ts_port(ig_ts_echo_server));
        assert_int_equal(ig_tc_send(tc, raw, cut), 0);
        usleep(2000);
        assert_int_equal(ig_tc_send(tc, raw + cut, len - cut), 0);
        ig_tc_response_t r;
        assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
        assert_int_equal(r.status, 400);
        ig_tc_response_free(&r);
        assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
        ig_tc_close(tc);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_valid_edge_cases),
        cmocka_unit_test(test_split_delivery),
    };
    return cmocka_run_group_tests(tests, ig_ts_echo_group_setup, ig_ts_echo_group_teardown);
}
