/* Graceful close: the listener stops at once, idle connections close, a
 * request in flight finishes (with Connection: close) before the close
 * callback fires; after the drain timeout what is left is force-closed, the
 * handler hears of it through the abort callback and may still finish. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tc_expect.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

static ig_http_req_t *held; /* loop thread only */
static atomic_int nheld, naborted, dispatched;

static void on_abort(ig_http_req_t *req, void *data)
{
    atomic_fetch_add(&naborted, 1);
}

static void handler(ig_http_req_t *req, void *data)
{
    atomic_fetch_add(&dispatched, 1);
    if (strcmp(ig_http_req_path(req), "/hold") == 0) {
        ig_http_req_on_abort(req, on_abort, NULL);
        held = req;
        atomic_fetch_add(&nheld, 1);
        return;
    }
    ig_ts_echo_handler(req, NULL);
}

static int respond_rc = 99;

static void release(ig_ts_t *ts, void *arg)
{
    ig_http_req_t *r = held;
    held = NULL;
    respond_rc = ig_http_respond(r, 200, "text/plain", "done", 4);
}

static int one_held(void *arg)
{
    return atomic_load(&nheld) == 1;
}

static int closed(void *arg)
{
    return ig_ts_closed(arg);
}

static int aborted(void *arg)
{
    return atomic_load(&naborted) == 1;
}

static ig_ts_t *start(void)
{
    held = NULL;
    atomic_store(&nheld, 0);
    atomic_store(&naborted, 0);
    atomic_store(&dispatched, 0);
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", NULL, handler, NULL);
    assert_non_null(ts);
    return ts;
}

static void test_inflight_finishes(void **state)
{
    ig_ts_t *ts = start();
    int port = ig_ts_port(ts);
    /* an idle keep-alive connection */
    ig_tc_t *idle = ig_tc_connect(port);
    assert_int_equal(ig_tc_sends(idle, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(idle, &r, TMO), 0);
    ig_tc_response_free(&r);
    /* one in flight, with a pipelined request behind it */
    ig_tc_t *busy = ig_tc_connect(port);
    assert_int_equal(ig_tc_sends(busy, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"
                                       "GET /behind HTTP/1.1\r\nHost: t\r\n\r\n"),
                     0);
    assert_true(ig_ts_wait(one_held, NULL, TMO));

    ig_ts_begin_close(ts, 5000);
    /* idle connection: closed without a byte */
    assert_int_equal(ig_tc_wait_closed(idle, TMO), 1);
    ig_tc_close(idle);
    /* no new connections */
    ig_tc_t *late = ig_tc_connect(port);
    if (late != NULL) {
        assert_int_equal(ig_tc_wait_closed(late, TMO), 1);
        ig_tc_close(late);
    }
    /* still draining while the request is in flight */
    assert_false(ig_ts_closed(ts));
    assert_int_equal(ig_ts_inflight(ts), 1);

    ig_ts_call(ts, release, NULL);
    assert_int_equal(respond_rc, 0);
    assert_int_equal(ig_tc_read_response(busy, &r, TMO), 0);
    /* closed after it: the pipelined request behind it is never dispatched */
    ig_tc_expect_closed(busy, &r, 200, "done", TMO);
    assert_true(ig_ts_wait(closed, ts, TMO));
    assert_int_equal(atomic_load(&dispatched), 2);
    assert_int_equal(atomic_load(&naborted), 0);
    ig_ts_stop(ts);
}

static void test_drain_timeout(void **state)
{
    ig_ts_t *ts = start();
    ig_tc_t *busy = ig_tc_connect(ig_ts_port(ts));
    assert_int_equal(ig_tc_sends(busy, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    assert_true(ig_ts_wait(one_held, NULL, TMO));
    long long t0 = ig_tc_now_ms();
    ig_ts_begin_close(ts, 200);
    /* force-closed after the drain timeout, without a response */
    assert_int_equal(ig_tc_wait_closed(busy, TMO), 1);
    assert_true(ig_tc_now_ms() - t0 >= 150);
    ig_tc_close(busy);
    assert_true(ig_ts_wait(aborted, NULL, TMO));
    assert_true(ig_ts_wait(closed, ts, TMO));
    /* the handler still finishes its request: discarded, no crash */
    ig_ts_call(ts, release, NULL);
    assert_int_equal(respond_rc, 0);
    ig_ts_stop(ts);
}

static void test_close_without_connections(void **state)
{
    ig_ts_t *ts = start();
    ig_ts_begin_close(ts, 5000);
    assert_true(ig_ts_wait(closed, ts, TMO));
    ig_ts_stop(ts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_finishes),
        cmocka_unit_test(test_drain_timeout),
        cmocka_unit_test(test_close_without_connections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
