/* Keep-alive, Connection: close, HTTP/1.0, HEAD, request bodies (length and
 * chunked), Expect: 100-continue, and the Unix-socket listener. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tc_expect.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

static int setup(void **state)
{
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", NULL, ig_ts_echo_handler, NULL);
    assert_non_null(ts);
    *state = ts;
    return 0;
}

static int teardown(void **state)
{
    ig_ts_stop(*state);
    return 0;
}

static void test_many_requests_one_connection(void **state)
{
    ig_ts_t *ts = *state;
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_non_null(tc);
    for (int i = 0; i < 50; i++) {
        char req[128], want[64];
        snprintf(req, sizeof(req), "GET /r/%d?x=%d HTTP/1.1\r\nHost: t\r\nX-Echo: e%d\r\n\r\n", i,
                 i, i);
        assert_int_equal(ig_tc_sends(tc, req), 0);
        ig_tc_response_t r;
        assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
        assert_int_equal(r.status, 200);
        snprintf(want, sizeof(want), "GET /r/%d?x=%d 0\n", i, i);
        assert_string_equal(r.body, want);
        snprintf(want, sizeof(want), "e%d", i);
        assert_string_equal(ig_tc_header(&r, "x-echo"), want);
        assert_null(ig_tc_header(&r, "connection"));
        assert_non_null(ig_tc_header(&r, "date"));
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_tc_wait_closed(tc, 100), 0);
    ig_tc_close(tc);
}

static void test_connection_close_honoured(void **state)
{
    ig_ts_t *ts = *state;
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    ig_tc_response_t r;
    ig_tc_exchange(tc, "GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &r, TMO);
    ig_tc_expect_closed(tc, &r, 200, NULL, TMO);
}

static void test_http10(void **state)
{
    ig_ts_t *ts = *state;
    /* 1.0 without keep-alive: answered, then closed; no Host needed. */
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    ig_tc_response_t r;
    ig_tc_exchange(tc, "GET /old HTTP/1.0\r\n\r\n", &r, TMO);
    ig_tc_expect_closed(tc, &r, 200, "GET /old 0\n", TMO);

    /* 1.0 with keep-alive: stays open. */
    tc = ig_tc_connect(ig_ts_port(ts));
    for (int i = 0; i < 3; i++) {
        ig_tc_exchange(tc, "GET /ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r, TMO);
        assert_int_equal(r.status, 200);
        assert_string_equal(ig_tc_header(&r, "connection"), "keep-alive");
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_tc_wait_closed(tc, 100), 0);
    ig_tc_close(tc);
}

static void test_head_has_no_body(void **state)
{
    ig_ts_t *ts = *state;
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_int_equal(ig_tc_sends(tc, "HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response_ex(tc, &r, TMO, 1, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "content-length"), "10");
    ig_tc_response_free(&r);
    /* The next response must start right away: no body bytes in between. */
    ig_tc_expect(tc, "GET /g HTTP/1.1\r\nHost: t\r\n\r\n", 0, "GET /g 0\n", TMO);
    ig_tc_close(tc);
}

static void test_bodies(void **state)
{
    ig_ts_t *ts = *state;
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    ig_tc_response_t r;
    assert_int_equal(
        ig_tc_sends(tc, "POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"), 0);
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    assert_string_equal(r.body, "POST /p 5\nhello");
    ig_tc_response_free(&r);

    /* chunked, split across writes, with an extension and a trailer */
    assert_int_equal(ig_tc_sends(tc, "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked"
                                     "\r\n\r\n3;ext=1\r\nabc\r\n"),
                     0);
    usleep(20000);
    ig_tc_expect(tc, "A\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n", 0, "POST /c 13\nabc0123456789", TMO);

    /* a body one byte per write */
    const char *req = "POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nwxyz";
    for (const char *p = req; *p; p++)
        assert_int_equal(ig_tc_send(tc, p, 1), 0);
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    assert_string_equal(r.body, "POST /b 4\nwxyz");
    ig_tc_response_free(&r);

    /* a large body */
    size_t n = 1 << 20;
    char *big = malloc(n);
    memset(big, 'q', n);
    char head[128];
    snprintf(head, sizeof(head), "PUT /big HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", n);
    assert_int_equal(ig_tc_sends(tc, head), 0);
    assert_int_equal(ig_tc_send(tc, big, n), 0);
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    assert_int_equal(r.body_len, strlen("PUT /big 1048576\n") + n);
    ig_tc_response_free(&r);
    free(big);
    ig_tc_close(tc);
}

static void test_expect_continue(void **state)
{
    ig_ts_t *ts = *state;
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_int_equal(ig_tc_sends(tc, "POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                                     "Expect: 100-continue\r\n\r\n"),
                     0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response_ex(tc, &r, TMO, 0, 1), 0);
    assert_int_equal(r.status, 100);
    ig_tc_response_free(&r);
    ig_tc_expect(tc, "ok", 200, "POST /e 2\nok", TMO);
    ig_tc_close(tc);
}

static void test_unix_socket(void **state)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/ig-http-test-%d.sock", (int)getpid());
    char listen[160];
    snprintf(listen, sizeof(listen), "unix:%s", path);
    ig_ts_t *ts = ig_ts_start(listen, NULL, ig_ts_echo_handler, NULL);
    assert_non_null(ts);
    assert_int_equal(ig_ts_port(ts), 0);
    ig_tc_t *tc = ig_tc_connect_unix(path);
    assert_non_null(tc);
    ig_tc_expect(tc, "GET /u HTTP/1.1\r\nHost: t\r\n\r\n", 0, "GET /u 0\n", TMO);
    ig_tc_close(tc);
    ig_ts_stop(ts);
    assert_int_equal(access(path, F_OK), -1); /* removed at close */
}

static void test_bad_listen(void **state)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    ig_http_server_t *s;
    assert_int_not_equal(
        ig_http_server_start(&s, &loop, "nonsense", NULL, ig_ts_echo_handler, NULL), 0);
    assert_int_not_equal(
        ig_http_server_start(&s, &loop, "1.2.3:80", NULL, ig_ts_echo_handler, NULL), 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_many_requests_one_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connection_close_honoured, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http10, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_has_no_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bodies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expect_continue, setup, teardown),
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_bad_listen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
