/* Deadlines, with small configured values so that the tests run fast:
 * header timeout (408 + close, counted from the first byte, not reset by a
 * slow drip), body stall timeout (408 + close), keep-alive idle close, and
 * no deadline while the handler works. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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
#define T_HEADER 300
#define T_BODY 300
#define T_IDLE 300

static ig_ts_t *server;

static void on_delay(uv_timer_t *t)
{
    ig_ts_echo_handler(t->data, NULL);
    ig_ts_timer_close(t);
}

/* /slow answers after 2 * T_HEADER; everything else at once. */
static void handler(ig_http_req_t *req, void *data)
{
    if (strcmp(ig_http_req_path(req), "/slow") == 0) {
        ig_ts_timer_start(on_delay, req, 2 * T_HEADER, 0);
        return;
    }
    ig_ts_echo_handler(req, NULL);
}

static int group_setup(void **state)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    l.header_timeout_ms = T_HEADER;
    l.body_timeout_ms = T_BODY;
    l.idle_timeout_ms = T_IDLE;
    server = ig_ts_start("127.0.0.1:0", &l, handler, NULL);
    return server == NULL ? -1 : 0;
}

static int group_teardown(void **state)
{
    ig_ts_stop(server);
    return 0;
}

/* Reads a 408 that must come between min_ms and TMO after t0, then the
 * close. */
static void expect_408(ig_tc_t *tc, long long t0, long long min_ms)
{
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    long long dt = ig_tc_now_ms() - t0;
    assert_int_equal(r.status, 408);
    assert_string_equal(ig_tc_header(&r, "connection"), "close");
    assert_non_null(strstr(r.body, "\"timeout_error\""));
    ig_tc_response_free(&r);
    if (dt < min_ms)
        fail_msg("408 after %lld ms, expected at least %lld", dt, min_ms);
    assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
}

static void test_no_bytes(void **state)
{
    long long t0 = ig_tc_now_ms();
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    expect_408(tc, t0, T_HEADER - 50);
    ig_tc_close(tc);
}

static void test_partial_header(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_tc_sends(tc, "GET / HTTP/1.1\r\nHost: t\r\n"), 0);
    expect_408(tc, t0, T_HEADER - 50);
    ig_tc_close(tc);
}

/* A byte every 50 ms does not extend the header deadline (slowloris). */
static void test_slow_drip_header(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    long long t0 = ig_tc_now_ms();
    const char *req = "GET / HTTP/1.1\r\nHost: t\r\nX-Long-Header-Name: aaaaaaaaaaaaaa\r\n\r\n";
    int got = 0;
    for (const char *p = req; *p && ig_tc_now_ms() - t0 < 3 * T_HEADER; p++) {
        if (ig_tc_send(tc, p, 1) < 0)
            break;
        usleep(50000);
        if (ig_tc_wait_closed(tc, 0) != 0) { /* bytes or close arrived */
            got = 1;
            break;
        }
    }
    assert_true(got);
    expect_408(tc, t0, T_HEADER - 50);
    assert_true(ig_tc_now_ms() - t0 < 3 * T_HEADER);
    ig_tc_close(tc);
}

static void test_body_stall(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    assert_int_equal(ig_tc_sends(tc, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"),
                     0);
    long long t0 = ig_tc_now_ms();
    expect_408(tc, t0, T_BODY - 50);
    ig_tc_close(tc);
}

/* Body bytes that keep coming reset the stall deadline. */
static void test_body_progress(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    assert_int_equal(ig_tc_sends(tc, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n"), 0);
    for (int i = 0; i < 8; i++) {
        usleep(T_BODY * 1000 / 3);
        assert_int_equal(ig_tc_send(tc, "b", 1), 0);
    }
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST / 8\nbbbbbbbb");
    ig_tc_response_free(&r);
    ig_tc_close(tc);
}

static void test_idle_close(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    ig_tc_expect(tc, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 200, NULL, TMO);
    long long t0 = ig_tc_now_ms();
    /* silently closed: no 408 bytes on an idle keep-alive connection */
    assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
    long long dt = ig_tc_now_ms() - t0;
    assert_true(dt >= T_IDLE - 50);
    ig_tc_close(tc);
}

/* The header deadline does not run while the handler works. */
static void test_no_deadline_while_handling(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    ig_tc_expect(tc, "GET /slow HTTP/1.1\r\nHost: t\r\n\r\n", 200, "GET /slow 0\n", TMO);
    ig_tc_close(tc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_bytes),
        cmocka_unit_test(test_partial_header),
        cmocka_unit_test(test_slow_drip_header),
        cmocka_unit_test(test_body_stall),
        cmocka_unit_test(test_body_progress),
        cmocka_unit_test(test_idle_close),
        cmocka_unit_test(test_no_deadline_while_handling),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
