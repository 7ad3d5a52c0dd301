/* Pipelining: responses in request order, one request in the handler at a
 * time, bounded read-ahead (reading stops while max_pipeline parsed requests
 * wait), and errors / Connection: close in the middle of a pipeline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../gateway/http/http_internal.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

static atomic_int in_handler;     /* requests dispatched, not finished */
static atomic_int max_in_handler; /* the most ever at once */
static atomic_int dispatched;
static atomic_int hold;           /* 1: keep requests instead of answering */
static ig_http_req_t *held[1024]; /* loop thread only */
static int nheld;

static void answer(ig_http_req_t *req)
{
    atomic_fetch_sub(&in_handler, 1);
    ig_ts_echo_handler(req, NULL);
}

static void on_delay(uv_timer_t *t)
{
    answer(t->data);
    ig_ts_timer_close(t);
}

/* Answers at once, after a delay taken from the path (/d/<ms>/...), or
 * holds the request while `hold` is set. */
static void handler(ig_http_req_t *req, void *data)
{
    int n = atomic_fetch_add(&in_handler, 1) + 1;
    if (n > atomic_load(&max_in_handler))
        atomic_store(&max_in_handler, n);
    atomic_fetch_add(&dispatched, 1);
    if (atomic_load(&hold)) {
        held[nheld++] = req;
        return;
    }
    int ms = 0;
    if (sscanf(ig_http_req_path(req), "/d/%d", &ms) == 1 && ms > 0) {
        ig_ts_timer_start(on_delay, req, (uint64_t)ms, 0);
        return;
    }
    answer(req);
}

static ig_ts_t *start(unsigned max_pipeline)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    l.max_pipeline = max_pipeline;
    atomic_store(&in_handler, 0);
    atomic_store(&max_in_handler, 0);
    atomic_store(&dispatched, 0);
    atomic_store(&hold, 0);
    nheld = 0;
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", &l, handler, NULL);
    assert_non_null(ts);
    return ts;
}

static void read_in_order(ig_tc_t *tc, const char *fmt, int from, int n)
{
    for (int i = from; i < from + n; i++) {
        ig_tc_response_t r;
        char want[64];
        assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
        assert_int_equal(r.status, 200);
        snprintf(want, sizeof(want), fmt, i);
        assert_string_equal(r.body, want);
        ig_tc_response_free(&r);
    }
}

static void test_in_order(void **state)
{
    ig_ts_t *ts = start(16);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    char buf[8192];
    size_t o = 0;
    for (int i = 0; i < 40; i++)
        o += (size_t)sprintf(buf + o, "GET /p/%d HTTP/1.1\r\nHost: t\r\n\r\n", i);
    assert_int_equal(ig_tc_send(tc, buf, o), 0); /* one write */
    read_in_order(tc, "GET /p/%d 0\n", 0, 40);
    assert_int_equal(atomic_load(&max_in_handler), 1);
    ig_tc_close(tc);
    ig_ts_stop(ts);
}

/* Earlier requests take longer than later ones; the order still holds and
 * the handler never sees two at once. Bodies are pipelined too. */
static void test_in_order_async(void **state)
{
    ig_ts_t *ts = start(16);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    char buf[8192];
    size_t o = 0;
    for (int i = 0; i < 10; i++)
        o += (size_t)sprintf(buf + o,
                             "POST /d/%d/%d HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n%02d",
                             (10 - i) * 3, i, i);
    assert_int_equal(ig_tc_send(tc, buf, o), 0);
    for (int i = 0; i < 10; i++) {
        ig_tc_response_t r;
        char want[64];
        assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
        snprintf(want, sizeof(want), "POST /d/%d/%d 2\n%02d", (10 - i) * 3, i, i);
        assert_string_equal(r.body, want);
        ig_tc_response_free(&r);
    }
    assert_int_equal(atomic_load(&max_in_handler), 1);
    ig_tc_close(tc);
    ig_ts_stop(ts);
}

typedef struct {
    unsigned queued, reading, inflight;
    size_t buffered;
} snap_t;

static void do_snap(ig_ts_t *ts, void *arg)
{
    snap_t *s = arg;
    s->queued = ig__http_server_queued(ig_ts_server(ts));
    s->reading = ig__http_server_reading(ig_ts_server(ts));
    s->buffered = ig__http_server_buffered(ig_ts_server(ts));
    s->inflight = ig_http_server_inflight(ig_ts_server(ts));
}

static ig_ts_t *cur;

static int queue_full(void *arg)
{
    snap_t s;
    ig_ts_call(cur, do_snap, &s);
    return s.queued == 4 && s.reading == 0;
}

static void release(ig_ts_t *ts, void *arg)
{
    atomic_store(&hold, 0);
    /* only the first is dispatched; answering it lets the rest flow */
    for (int i = 0; i < nheld; i++)
        answer(held[i]);
    nheld = 0;
}

static void test_bounded_read_ahead(void **state)
{
    ig_ts_t *ts = start(4);
    cur = ts;
    atomic_store(&hold, 1);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    static char buf[200 * 64];
    size_t o = 0;
    for (int i = 0; i < 200; i++)
        o += (size_t)sprintf(buf + o, "GET /q/%d HTTP/1.1\r\nHost: t\r\n\r\n", i);
    assert_int_equal(ig_tc_send(tc, buf, o), 0);
    /* One in the handler, four parsed and waiting, reading stopped, the
     * rest left unparsed. */
    assert_true(ig_ts_wait(queue_full, NULL, TMO));
    snap_t s;
    ig_ts_call(ts, do_snap, &s);
    assert_int_equal(s.queued, 4);
    assert_int_equal(s.reading, 0);
    assert_int_equal(s.inflight, 1);
    assert_true(s.buffered > 0);
    assert_int_equal(atomic_load(&dispatched), 1);
    ig_ts_call(ts, release, NULL);
    read_in_order(tc, "GET /q/%d 0\n", 0, 200);
    assert_int_equal(atomic_load(&max_in_handler), 1);
    assert_int_equal(atomic_load(&dispatched), 200);
    ig_tc_close(tc);
    ig_ts_stop(ts);
}

static void test_error_after_good_requests(void **state)
{
    ig_ts_t *ts = start(16);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_int_equal(ig_tc_sends(tc, "GET /p/0 HTTP/1.1\r\nHost: t\r\n\r\n"
                                     "GET /p/1 HTTP/1.1\r\nHost: t\r\n\r\n"
                                     "GET /p/2 HTTP/1.1\r\nHost : t\r\n\r\n"
                                     "GET /p/3 HTTP/1.1\r\nHost: t\r\n\r\n"),
                     0);
    read_in_order(tc, "GET /p/%d 0\n", 0, 2);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    assert_int_equal(r.status, 400);
    ig_tc_response_free(&r);
    assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
    assert_int_equal(atomic_load(&dispatched), 2);
    ig_tc_close(tc);
    ig_ts_stop(ts);
}

static void test_close_in_the_middle(void **state)
{
    ig_ts_t *ts = start(16);
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    assert_int_equal(ig_tc_sends(tc, "GET /p/0 HTTP/1.1\r\nHost: t\r\n\r\n"
                                     "GET /p/1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                                     "GET /p/2 HTTP/1.1\r\nHost: t\r\n\r\n"),
                     0);
    read_in_order(tc, "GET /p/%d 0\n", 0, 2);
    assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
    assert_int_equal(atomic_load(&dispatched), 2);
    ig_tc_close(tc);
    ig_ts_stop(ts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order),
        cmocka_unit_test(test_in_order_async),
        cmocka_unit_test(test_bounded_read_ahead),
        cmocka_unit_test(test_error_after_good_requests),
        cmocka_unit_test(test_close_in_the_middle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
