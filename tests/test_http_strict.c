/* Strict parsing: every malformed or ambiguous framing case gets a 400 (or
 * the stated status) in the OpenAI error shape, and the connection closes.
 * Several cases are ones llhttp 8.1 itself accepts (obs-fold, a space before
 * a header name after another header, NUL in a value, no CRLF after chunk
 * data); the server's own checks must catch them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "testclient.h"
#include "testserver.h"

#define TMO 5000

typedef struct {
    const char *name;
    const char *raw;
    size_t len; /* 0: strlen(raw) */
    int status;
} strict_case_t;

#define H "Host: t\r\n"
/* a case with NUL bytes inside: its length from the literal */
#define BIN(name, lit, status)                                                                     \
    {                                                                                              \
        name, lit, sizeof(lit) - 1, status                                                         \
    }

static const strict_case_t bad_cases[] = {
    {"cl_with_te",
     "POST / HTTP/1.1\r\n" H "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     "0\r\n\r\n",
     0, 400},
    {"te_with_cl",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
     "0\r\n\r\n",
     0, 400},
    {"duplicate_cl", "POST / HTTP/1.1\r\n" H "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
     0, 400},
    {"duplicate_cl_same",
     "POST / HTTP/1.1\r\n" H "Content-Length: 5\r\nContent-Length: 5\r\n\r\n"
     "hello",
     0, 400},
    {"list_cl", "POST / HTTP/1.1\r\n" H "Content-Length: 5, 5\r\n\r\nhello", 0, 400},
    {"plus_cl", "POST / HTTP/1.1\r\n" H "Content-Length: +5\r\n\r\nhello", 0, 400},
    {"minus_cl", "POST / HTTP/1.1\r\n" H "Content-Length: -5\r\n\r\nhello", 0, 400},
    {"hex_cl", "POST / HTTP/1.1\r\n" H "Content-Length: 0x5\r\n\r\nhello", 0, 400},
    {"empty_cl", "POST / HTTP/1.1\r\n" H "Content-Length:\r\n\r\n", 0, 400},
    {"huge_cl", "POST / HTTP/1.1\r\n" H "Content-Length: 99999999999999999999999\r\n\r\n", 0, 400},
    {"te_chunked_then_gzip",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked, gzip\r\n\r\n"
     "0\r\n\r\n",
     0, 400},
    {"te_gzip", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip\r\n\r\n0\r\n\r\n", 0, 400},
    {"te_identity", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: identity\r\n\r\n", 0, 400},
    {"te_twice",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked"
     "\r\n\r\n0\r\n\r\n",
     0, 400},
    {"te_on_http10", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 0, 400},
    {"space_before_colon", "GET / HTTP/1.1\r\nHost : t\r\n\r\n", 0, 400},
    {"tab_before_colon", "GET / HTTP/1.1\r\n" H "X-A\t: 1\r\n\r\n", 0, 400},
    {"obs_fold_space", "GET / HTTP/1.1\r\n" H "X-A: 1\r\n 2\r\n\r\n", 0, 400},
    {"obs_fold_tab", "GET / HTTP/1.1\r\n" H "X-A: 1\r\n\t2\r\n\r\n", 0, 400},
    /* CVE-2024-27982: a space before a header name right after the request
     * line, and after another header, where it would hide Content-Length. */
    {"cve_2024_27982_first_line", "POST / HTTP/1.1\r\n Content-Length: 5\r\n" H "\r\nhello", 0,
     400},
    {"cve_2024_27982_after_header", "POST / HTTP/1.1\r\n" H " Content-Length: 5\r\n\r\nhello", 0,
     400},
    {"bare_cr_header_end", "GET / HTTP/1.1\r\nHost: t\rX-A: 1\r\n\r\n", 0, 400},
    {"bare_cr_request_line", "GET / HTTP/1.1\r" H "\r\n", 0, 400},
    {"bare_lf_request_line", "GET / HTTP/1.1\n" H "\r\n", 0, 400},
    {"bare_lf_header", "GET / HTTP/1.1\r\nHost: t\nX-A: 1\r\n\r\n", 0, 400},
    {"bare_lf_block_end", "GET / HTTP/1.1\r\n" H "\n", 0, 400},
    {"all_bare_lf", "GET / HTTP/1.1\nHost: t\n\n", 0, 400},
    {"missing_host", "GET / HTTP/1.1\r\nX-A: 1\r\n\r\n", 0, 400},
    {"two_hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 0, 400},
    {"two_hosts_http10", "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 0, 400},
    BIN("nul_in_value", "GET / HTTP/1.1\r\n" H "X-A: a\0b\r\n\r\n", 400),
    BIN("nul_in_name", "GET / HTTP/1.1\r\n" H "X-\0A: ab\r\n\r\n", 400),
    {"cr_in_value", "GET / HTTP/1.1\r\n" H "X-A: a\rb\r\n\r\n", 0, 400},
    {"lf_in_value", "GET / HTTP/1.1\r\n" H "X-A: a\nb\r\n\r\n", 0, 400},
    {"ctl_in_value",
     "GET / HTTP/1.1\r\n" H "X-A: a\x01"
     "b\r\n\r\n",
     0, 400},
    {"bad_name_char", "GET / HTTP/1.1\r\n" H "X@A: 1\r\n\r\n", 0, 400},
    {"empty_name", "GET / HTTP/1.1\r\n" H ": 1\r\n\r\n", 0, 400},
    {"no_colon", "GET / HTTP/1.1\r\n" H "X-A\r\n\r\n", 0, 400},
    {"chunk_size_overflow",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
     "fffffffffffffffff\r\n",
     0, 400},
    {"chunk_size_overflow_64",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
     "10000000000000001\r\nx",
     0, 400},
    {"chunk_bad_size", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 0, 400},
    {"chunk_no_crlf_after_data",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
     "3\r\nabcXX0\r\n\r\n",
     0, 400},
    {"chunk_bare_lf", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n", 0,
     400},
    {"chunk_trailer_fold",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n0\r\nA: 1\r\n"
     " 2\r\n\r\n",
     0, 400},
    {"bad_method", "G@T / HTTP/1.1\r\n" H "\r\n", 0, 400},
    {"bad_target", "GET nothing HTTP/1.1\r\n" H "\r\n", 0, 400},
    {"bad_version", "GET / HTTP/1.2\r\n" H "\r\n", 0, 505},
    {"http2_version", "GET / HTTP/2.0\r\n" H "\r\n", 0, 505},
    BIN("tls_hello", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    {"garbage", "\x7f\x01 / HTTP/1.1\r\n\r\n", 0, 400},
    {"connect", "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 0, 405},
    {"expect_other", "POST / HTTP/1.1\r\n" H "Expect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 0,
     417},
};

/* Asserts the OpenAI error shape: {"error":{"message","type","param","code"}}. */
static void assert_error_shape(const ig_tc_response_t *r)
{
    assert_string_equal(ig_tc_header(r, "content-type"), "application/json");
    json_error_t err;
    json_t *o = json_loads(r->body, 0, &err);
    assert_non_null(o);
    json_t *e = json_object_get(o, "error");
    assert_true(json_is_object(e));
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 0);
    assert_true(json_is_string(json_object_get(e, "type")));
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
    json_decref(o);
}

static void run_case(const strict_case_t *c)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ig_ts_echo_server));
    assert_non_null(tc);
    size_t len = c->len ? c->len : strlen(c->raw);
    assert_int_equal(ig_tc_send(tc, c->raw, len), 0);
    ig_tc_response_t r;
    int rc = ig_tc_read_response(tc, &r, TMO);
    if (rc != 0 || r.status != c->status)
        fail_msg("case %s: rc %d status %d, want %d", c->name, rc, r.status, c->status);
    assert_string_equal(ig_tc_header(&r, "connection"), "close");
    assert_error_shape(&r);
    ig_tc_response_free(&r);
    if (ig_tc_wait_closed(tc, TMO) != 1)
        fail_msg("case %s: connection not closed", c->name);
    ig_tc_close(tc);
}

static void test_bad_requests(void **state)
{
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++)
        run_case(&bad_cases[i]);
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
