/* Size and count limits: 414, 431, 413 (from Content-Length before the body
 * is read, and by counting chunked bytes), and the connection cap (503). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "testclient.h"
#include "testserver.h"

#define TMO 5000

/* Sends raw and expects status; closed: the server must close after it. */
static void expect_status(ig_ts_t *ts, const char *raw, size_t len, int status, int closed)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_non_null(tc);
    assert_int_equal(ig_tc_send(tc, raw, len), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    if (r.status != status)
        fail_msg("got %d want %d: %s", r.status, status, r.body);
    if (closed) {
        assert_string_equal(ig_tc_header(&r, "connection"), "close");
        assert_non_null(strstr(r.body, "\"error\""));
        assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
    }
    ig_tc_response_free(&r);
    ig_tc_close(tc);
}

static void test_defaults(void **state)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    assert_int_equal(l.max_request_line, 8192);
    assert_int_equal(l.max_header_bytes, 65536);
    assert_int_equal(l.max_headers, 100);
    assert_int_equal(l.max_body_bytes, 4 << 20);
    assert_int_equal(l.header_timeout_ms, 10000);
    assert_int_equal(l.max_connections, 10000);
    assert_int_equal(l.max_pipeline, 16);
    assert_int_equal(l.write_buffer_bytes, 256 * 1024);
}

static char *request_with_line(size_t line_len)
{
    /* "GET /aaaa... HTTP/1.1" of exactly line_len bytes */
    char *buf = malloc(line_len + 64);
    size_t path = line_len - strlen("GET  HTTP/1.1");
    memcpy(buf, "GET /", 5);
    memset(buf + 5, 'a', path - 1);
    strcpy(buf + 4 + path, " HTTP/1.1\r\nHost: t\r\n\r\n");
    return buf;
}

static void test_request_line(void **state)
{
    char *ok = request_with_line(8192);
    expect_status(ig_ts_echo_server, ok, strlen(ok), 200, 0);
    free(ok);
    char *bad = request_with_line(8193);
    expect_status(ig_ts_echo_server, bad, strlen(bad), 414, 1);
    free(bad);
    /* decided without waiting for the end of the line */
    char *huge = malloc(20000);
    memcpy(huge, "GET /", 5);
    memset(huge + 5, 'b', 20000 - 5);
    expect_status(ig_ts_echo_server, huge, 20000, 414, 1);
    free(huge);
}

static char *request_with_headers(unsigned n, size_t value_len)
{
    size_t cap = 64 + n * (value_len + 32);
    char *buf = malloc(cap);
    size_t o = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nHost: t\r\n");
    for (unsigned i = 1; i < n; i++) {
        o += (size_t)sprintf(buf + o, "X-H%u: ", i);
        memset(buf + o, 'v', value_len);
        o += value_len;
        o += (size_t)sprintf(buf + o, "\r\n");
    }
    strcpy(buf + o, "\r\n");
    return buf;
}

static void test_header_count(void **state)
{
    char *ok = request_with_headers(100, 4);
    expect_status(ig_ts_echo_server, ok, strlen(ok), 200, 0);
    free(ok);
    char *bad = request_with_headers(101, 4);
    expect_status(ig_ts_echo_server, bad, strlen(bad), 431, 1);
    free(bad);
}

static void test_header_bytes(void **state)
{
    /* about 60 KiB in 60 headers: fine */
    char *ok = request_with_headers(60, 1000);
    assert_true(strlen(ok) < 65536);
    expect_status(ig_ts_echo_server, ok, strlen(ok), 200, 0);
    free(ok);
    /* about 70 KiB: too large */
    char *bad = request_with_headers(70, 1000);
    expect_status(ig_ts_echo_server, bad, strlen(bad), 431, 1);
    free(bad);
    /* one huge header, never finished */
    char *one = malloc(80000);
    size_t o = (size_t)sprintf(one, "GET / HTTP/1.1\r\nHost: t\r\nX-Big: ");
    memset(one + o, 'z', 80000 - o);
    expect_status(ig_ts_echo_server, one, 80000, 431, 1);
    free(one);
}

static void test_body_content_length(void **state)
{
    /* Over the limit: 413 before any body byte is sent. */
    char head[160];
    snprintf(head, sizeof(head), "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n",
             (4 << 20) + 1);
    expect_status(ig_ts_echo_server, head, strlen(head), 413, 1);
    /* At the limit: accepted whole. */
    size_t n = 4 << 20;
    char *req = malloc(n + 200);
    int h = snprintf(req, 200, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", n);
    memset(req + h, 'x', n);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ig_ts_echo_server));
    assert_int_equal(ig_tc_send(tc, req, (size_t)h + n), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, strlen("POST / 4194304\n") + n);
    ig_tc_response_free(&r);
    ig_tc_close(tc);
    free(req);
}

/* An echo server on listen with the default limits but for the body and
 * connection caps given (0: the default's). */
static ig_ts_t *start_echo(const char *listen, size_t max_body_bytes, unsigned max_connections)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    if (max_body_bytes != 0)
        l.max_body_bytes = max_body_bytes;
    if (max_connections != 0)
        l.max_connections = max_connections;
    ig_ts_t *ts = ig_ts_start(listen, &l, ig_ts_echo_handler, NULL);
    assert_non_null(ts);
    return ts;
}

/* A chunked POST / of two chunks, of a and b bytes ('c', a and b < 700),
 * into req; its length. */
static int two_chunks(char *req, int a, int b)
{
    char chunk[700];
    memset(chunk, 'c', sizeof(chunk));
    int o =
        sprintf(req, "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", a);
    memcpy(req + o, chunk, (size_t)a);
    o += a;
    o += sprintf(req + o, "\r\n%x\r\n", b);
    memcpy(req + o, chunk, (size_t)b);
    o += b;
    o += sprintf(req + o, "\r\n0\r\n\r\n");
    return o;
}

static void test_body_chunked(void **state)
{
    ig_ts_t *ts = start_echo("127.0.0.1:0", 1000, 0);
    /* 600 + 400 = exactly 1000: accepted */
    char req[2000];
    int o = two_chunks(req, 600, 400);
    expect_status(ts, req, (size_t)o, 200, 0);
    /* 600 + 401: over by one byte */
    o = two_chunks(req, 600, 401);
    expect_status(ts, req, (size_t)o, 413, 1);
    /* a chunk size alone that announces too much */
    const char *big = "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "100000\r\nabc";
    expect_status(ts, big, strlen(big), 413, 1);
    ig_ts_stop(ts);
}

static int conns_are_one(void *arg)
{
    return ig_ts_connections(arg) == 1;
}

static void test_connection_cap(void **state)
{
    ig_ts_t *ts = start_echo("127.0.0.1:0", 0, 2);
    ig_tc_t *a = ig_tc_connect(ig_ts_port(ts));
    ig_tc_t *b = ig_tc_connect(ig_ts_port(ts));
    ig_tc_response_t r;
    /* both are served (so both are accepted) */
    assert_int_equal(ig_tc_sends(a, "GET /a HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    assert_int_equal(ig_tc_read_response(a, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    assert_int_equal(ig_tc_sends(b, "GET /b HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    assert_int_equal(ig_tc_read_response(b, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    /* the third gets 503 and a close */
    ig_tc_t *c = ig_tc_connect(ig_ts_port(ts));
    assert_non_null(c);
    assert_int_equal(ig_tc_read_response(c, &r, TMO), 0);
    assert_int_equal(r.status, 503);
    assert_string_equal(ig_tc_header(&r, "connection"), "close");
    assert_non_null(strstr(r.body, "\"unavailable_error\""));
    ig_tc_response_free(&r);
    assert_int_equal(ig_tc_wait_closed(c, TMO), 1);
    ig_tc_close(c);
    assert_int_equal(ig_ts_connections(ts), 2);
    /* a slot frees up: a new connection is served again */
    ig_tc_close(a);
    assert_true(ig_ts_wait(conns_are_one, ts, TMO));
    c = ig_tc_connect(ig_ts_port(ts));
    assert_int_equal(ig_tc_sends(c, "GET /c HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    assert_int_equal(ig_tc_read_response(c, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    ig_tc_close(c);
    ig_tc_close(b);
    ig_ts_stop(ts);
}

static void test_connection_cap_unix(void **state)
{
    char path[128], listen[160];
    snprintf(path, sizeof(path), "/tmp/ig-http-cap-%d.sock", (int)getpid());
    snprintf(listen, sizeof(listen), "unix:%s", path);
    ig_ts_t *ts = start_echo(listen, 0, 1);
    ig_tc_t *a = ig_tc_connect_unix(path);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_sends(a, "GET /a HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    assert_int_equal(ig_tc_read_response(a, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "GET /a 0\n");
    ig_tc_response_free(&r);
    ig_tc_t *b = ig_tc_connect_unix(path);
    assert_non_null(b);
    assert_int_equal(ig_tc_read_response(b, &r, TMO), 0);
    assert_int_equal(r.status, 503);
    ig_tc_response_free(&r);
    assert_int_equal(ig_tc_wait_closed(b, TMO), 1);
    ig_tc_close(b);
    ig_tc_close(a);
    ig_ts_stop(ts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_request_line),
        cmocka_unit_test(test_header_count),
        cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_body_content_length),
        cmocka_unit_test(test_body_chunked),
        cmocka_unit_test(test_connection_cap),
        cmocka_unit_test(test_connection_cap_unix),
    };
    return cmocka_run_group_tests(tests, ig_ts_echo_group_setup, ig_ts_echo_group_teardown);
}
