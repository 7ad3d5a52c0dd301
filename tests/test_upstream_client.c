/*
 * The upstream client (include/infergate/upstream.h) on its own loop in
 * this process, against the support test server (an ig_http_server on its
 * own thread, tests/support/testserver) over loopback TCP: keep-alive reuse
 * of one pooled connection, Content-Length and chunked bodies delivered
 * whole, a closed port failing with IG_ECONNECT from the loop (never inside
 * the call), the first-byte deadline, a cancel in the middle of a body (the
 * server sees the connection go), and pause/resume (nothing is read while
 * paused, the idle deadline does not run, and the body then completes).
 *
 * Close-delimited bodies, and cancel or close from inside the request's own
 * callbacks, are test_gateway_closedelim's (against python3's http.server).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <uv.h>

#include "infergate/error.h"
#include "infergate/http.h"
#include "infergate/log.h"
#include "infergate/upstream.h"
#include "proc.h"
#include "testclient.h"
#include "testserver.h"

#define CL_BYTES 100000   /* /cl: one Content-Length body over many reads */
#define CHUNKED_PIECES 50 /* /chunked: pieces written 1 ms apart */
#define STREAM_PIECES 20  /* /stream: pieces written STREAM_TICK_MS apart */
#define STREAM_TICK_MS 20
#define SLOW_MS 3000 /* /slow answers this late (or when abandoned) */

/* ---- the server side (runs on the test server's loop thread) ------------ */

static ig_ts_t *ts;
static _Atomic(uv_loop_t *) ts_loop;
static atomic_int aborts; /* requests whose client went away */

/* A response written piece by piece from a timer: "p00 p01 ...". */
typedef struct {
    ig_http_req_t *req;
    uv_timer_t timer;
    int next, count;
    int aborted;
    int slow; /* /slow: one whole answer when the timer fires */
} pending_t;

static void on_pending_closed(uv_handle_t *h)
{
    free(h->data);
}

static void pending_finish(pending_t *p)
{
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, on_pending_closed);
}

static void on_tick(uv_timer_t *t)
{
    pending_t *p = t->data;
    if (p->slow) {
        ig_http_respond(p->req, 200, "text/plain", "late", 4);
        pending_finish(p);
        return;
    }
    if (!p->aborted && p->next < p->count) {
        char piece[8];
        int n = snprintf(piece, sizeof(piece), "p%02d ", p->next++);
        if (ig_http_stream_write(p->req, piece, (size_t)n) == IG_ECLOSED)
            p->aborted = 1;
    }
    if (p->aborted || p->next == p->count) {
        ig_http_stream_end(p->req);
        pending_finish(p);
    }
}

static void on_abort(ig_http_req_t *req, void *data)
{
    pending_t *p = data;
    atomic_fetch_add(&aborts, 1);
    p->aborted = 1;
    if (p->slow) { /* finish it now rather than answer a gone client later */
        ig_http_respond(p->req, 200, "text/plain", "late", 4);
        pending_finish(p);
    }
}

static void start_pending(ig_http_req_t *req, int count, uint64_t tick_ms, int slow)
{
    pending_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    p->req = req;
    p->count = count;
    p->slow = slow;
    uv_timer_init(atomic_load(&ts_loop), &p->timer);
    p->timer.data = p;
    ig_http_req_on_abort(req, on_abort, p);
    if (!slow && ig_http_stream_start(req, 200, "text/plain") != 0) {
        ig_http_respond_error(req, 500, NULL, NULL, NULL, "cannot stream");
        uv_close((uv_handle_t *)&p->timer, on_pending_closed);
        return;
    }
    uv_timer_start(&p->timer, on_tick, slow ? SLOW_MS : tick_ms, slow ? 0 : tick_ms);
}

static void handler(ig_http_req_t *req, void *data)
{
    const char *path = ig_http_req_path(req);
    if (strcmp(path, "/small") == 0) {
        ig_http_respond(req, 200, "text/plain", "hello", 5);
    } else if (strcmp(path, "/cl") == 0) {
        char *body = ig_http_req_alloc(req, CL_BYTES);
        if (body == NULL) {
            ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
            return;
        }
        for (int i = 0; i < CL_BYTES; i++)
            body[i] = (char)('a' + i % 26);
        ig_http_respond(req, 200, "text/plain", body, CL_BYTES);
    } else if (strcmp(path, "/chunked") == 0) {
        start_pending(req, CHUNKED_PIECES, 1, 0);
    } else if (strcmp(path, "/stream") == 0) {
        start_pending(req, STREAM_PIECES, STREAM_TICK_MS, 0);
    } else if (strcmp(path, "/slow") == 0) {
        start_pending(req, 0, 0, 1);
    } else {
        ig_http_respond_error(req, 404, NULL, NULL, NULL, "no %s here", path);
    }
}

static int group_setup(void **state)
{
    (void)state;
    ts = ig_ts_start("127.0.0.1:0", NULL, handler, NULL);
    if (ts == NULL)
        return -1;
    atomic_store(&ts_loop, ig_ts_loop(ts)); /* before anyone knows the port */
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    ig_ts_stop(ts);
    return 0;
}

/* ---- the client side (this thread's loop) ------------------------------- */

typedef struct {
    int status;
    int ndone, err;
    int nbody;
    char *body; /* everything received, NUL-terminated */
    size_t len;
    int content_length, chunked; /* framing headers seen */
    double connect_time;         /* of the request's connection, at on_done */
} result_t;

static void on_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                       const char *const *values, void *data)
{
    result_t *res = data;
    (void)r;
    res->status = status;
    for (int i = 0; i < n; i++) {
        res->content_length |= strcasecmp(names[i], "content-length") == 0;
        res->chunked |=
            strcasecmp(names[i], "transfer-encoding") == 0 && strcasecmp(values[i], "chunked") == 0;
    }
}

static void on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    result_t *res = data;
    (void)r;
    char *grown = realloc(res->body, res->len + len + 1);
    assert_non_null(grown);
    res->body = grown;
    memcpy(res->body + res->len, buf, len);
    res->len += len;
    res->body[res->len] = '\0';
    res->nbody++;
}

static void on_done(ig_upstream_req_t *r, int err, void *data)
{
    result_t *res = data;
    res->ndone++;
    res->err = err;
    res->connect_time = ig_upstream_req_connect_time(r);
}

static const ig_upstream_cbs_t cbs = {on_headers, on_body, on_done};

static void result_free(result_t *res)
{
    free(res->body);
    memset(res, 0, sizeof(*res));
}

/* Runs the loop until *value >= want or ms pass. */
static void run_until(uv_loop_t *loop, const int *value, int want, int ms)
{
    long long end = ig_tc_now_ms() + ms;
    while (*value < want && ig_tc_now_ms() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

/* Runs the loop for ms: a late callback would show in this time. */
static void run_for(uv_loop_t *loop, int ms)
{
    int never = 0;
    run_until(loop, &never, 1, ms);
}

static void on_up_closed(void *data)
{
    *(int *)data = 1;
}

static ig_upstream_t *open_upstream(uv_loop_t *loop, int port, const ig_upstream_opts_t *opts)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    ig_upstream_t *u = NULL;
    assert_int_equal(uv_loop_init(loop), 0);
    assert_int_equal(ig_upstream_start(&u, loop, "t", addr, opts), 0);
    return u;
}

/* Closes u, and the loop once everything of u is gone. */
static void close_upstream(uv_loop_t *loop, ig_upstream_t *u)
{
    int closed = 0;
    ig_upstream_close(u, on_up_closed, &closed);
    run_until(loop, &closed, 1, 5000);
    assert_true(closed);
    assert_int_equal(uv_loop_close(loop), 0);
}

static int no_connections(void *arg)
{
    (void)arg;
    return ig_ts_connections(ts) == 0;
}

static int one_abort_more(void *arg)
{
    return atomic_load(&aborts) > *(int *)arg;
}

/* Sends GET path; res collects what the callbacks bring. */
static void get(ig_upstream_t *u, const char *path, result_t *res, ig_upstream_req_t **req)
{
    memset(res, 0, sizeof(*res));
    assert_int_equal(ig_upstream_request(u, "GET", path, NULL, NULL, 0, &cbs, res, req), 0);
}

/* ---- the tests ----------------------------------------------------------- */

/* Three requests in a row go over one pooled connection: the server sees
 * one, the client keeps it open between them, and the later requests do
 * not connect again. */
static void test_keepalive_reuse(void **state)
{
    (void)state;
    assert_true(ig_ts_wait(no_connections, NULL, 5000));
    uv_loop_t loop;
    ig_upstream_t *u = open_upstream(&loop, ig_ts_port(ts), NULL);
    for (int i = 0; i < 3; i++) {
        result_t res;
        ig_upstream_req_t *req = NULL;
        get(u, "/small", &res, &req);
        run_until(&loop, &res.ndone, 1, 10000);
        assert_int_equal(res.ndone, 1);
        assert_int_equal(res.err, 0);
        assert_int_equal(res.status, 200);
        assert_string_equal(res.body, "hello");
        assert_int_equal(ig_upstream_open_connections(u), 1); /* kept for the next */
        if (i > 0)
            assert_true(res.connect_time == 0); /* reused: no connect */
        result_free(&res);
    }
    assert_int_equal(ig_ts_connections(ts), 1);
    close_upstream(&loop, u);
    assert_true(ig_ts_wait(no_connections, NULL, 5000));
}

/* A Content-Length body of many reads, then a chunked one of many chunks:
 * each arrives whole and in order, de-chunked, and the connection stays
 * reusable after both. */
static void test_content_length_and_chunked_bodies(void **state)
{
    (void)state;
    assert_true(ig_ts_wait(no_connections, NULL, 5000));
    uv_loop_t loop;
    ig_upstream_t *u = open_upstream(&loop, ig_ts_port(ts), NULL);

    result_t res;
    get(u, "/cl", &res, NULL);
    run_until(&loop, &res.ndone, 1, 10000);
    assert_int_equal(res.ndone, 1);
    assert_int_equal(res.err, 0);
    assert_true(res.content_length);
    assert_false(res.chunked);
    assert_int_equal(res.len, CL_BYTES);
    for (int i = 0; i < CL_BYTES; i++)
        if (res.body[i] != (char)('a' + i % 26))
            fail_msg("byte %d is %c", i, res.body[i]);
    assert_true(res.nbody > 1); /* delivered as it came, not buffered whole */
    assert_int_equal(ig_upstream_open_connections(u), 1);
    result_free(&res);

    get(u, "/chunked", &res, NULL);
    run_until(&loop, &res.ndone, 1, 10000);
    assert_int_equal(res.ndone, 1);
    assert_int_equal(res.err, 0);
    assert_true(res.chunked);
    assert_false(res.content_length);
    char want[CHUNKED_PIECES * 4 + 1];
    for (int i = 0; i < CHUNKED_PIECES; i++)
        snprintf(want + 4 * i, 5, "p%02d ", i);
    assert_string_equal(res.body, want); /* no chunk sizes, nothing lost */
    assert_int_equal(ig_upstream_open_connections(u), 1);
    assert_int_equal(ig_ts_connections(ts), 1); /* the same connection */
    result_free(&res);

    close_upstream(&loop, u);
}

/* Nothing listens on the port: the request is accepted, no callback fires
 * inside the call, and on_done comes from the loop with IG_ECONNECT. */
static void test_connect_refused(void **state)
{
    (void)state;
    int port = ig_proc_free_port(); /* bound and released: nobody listens */
    assert_true(port > 0);
    uv_loop_t loop;
    ig_upstream_t *u = open_upstream(&loop, port, NULL);
    for (int i = 0; i < 2; i++) { /* a second try fails the same way */
        result_t res;
        get(u, "/small", &res, NULL);
        assert_int_equal(res.ndone, 0); /* not inside ig_upstream_request */
        run_until(&loop, &res.ndone, 1, 5000);
        run_for(&loop, 50);
        assert_int_equal(res.ndone, 1);
        assert_int_equal(res.err, IG_ECONNECT);
        assert_int_equal(res.status, 0);
        assert_int_equal(res.nbody, 0);
        assert_int_equal(ig_upstream_open_connections(u), 0);
        result_free(&res);
    }
    close_upstream(&loop, u);
}

/* The server holds the answer past the first-byte deadline: IG_ETIMEDOUT
 * near the deadline, the connection is closed, and the server sees the
 * client go. */
static void test_first_byte_timeout(void **state)
{
    (void)state;
    ig_upstream_opts_t opts;
    ig_upstream_opts_default(&opts);
    opts.first_byte_timeout_ms = 200;
    uv_loop_t loop;
    ig_upstream_t *u = open_upstream(&loop, ig_ts_port(ts), &opts);
    int aborts0 = atomic_load(&aborts);
    result_t res;
    long long t0 = ig_tc_now_ms();
    get(u, "/slow", &res, NULL);
    run_until(&loop, &res.ndone, 1, 10000);
    long long took = ig_tc_now_ms() - t0;
    assert_int_equal(res.ndone, 1);
    assert_int_equal(res.err, IG_ETIMEDOUT);
    assert_int_equal(res.status, 0);
    print_message("first-byte timeout after %lld ms (deadline 200, answer at %d)\n", took, SLOW_MS);
    assert_true(took >= 190);
    assert_true(took < SLOW_MS / 2);
    assert_int_equal(ig_upstream_open_connections(u), 0);
    assert_true(ig_ts_wait(one_abort_more, &aborts0, 5000));
    run_for(&loop, 50);
    assert_int_equal(res.ndone, 1);
    result_free(&res);
    close_upstream(&loop, u);
}

/* A cancel between two pieces of a chunked body: no callback after it, the
 * connection is closed (not pooled with half a body on it), and the server
 * sees its client go before the stream would have ended. */
static void test_cancel_mid_body(void **state)
{
    (void)state;
    uv_loop_t loop;
    ig_upstream_t *u = open_upstream(&loop, ig_ts_port(ts), NULL);
    int aborts0 = atomic_load(&aborts);
    result_t res;
    ig_upstream_req_t *req = NULL;
    get(u, "/stream", &res, &req);
    assert_non_null(req);
    run_until(&loop, &res.nbody, 3, 10000);
    assert_true(res.nbody >= 3);
    int pieces = res.nbody;
    long long t0 = ig_tc_now_ms();
    ig_upstream_cancel(req);
    run_for(&loop, 5 * STREAM_TICK_MS);
    assert_int_equal(res.ndone, 0); /* no callback at all after a cancel */
    assert_int_equal(res.nbody, pieces);
    assert_int_equal(ig_upstream_open_connections(u), 0);
    assert_true(ig_ts_wait(one_abort_more, &aborts0, 5000));
    long long seen = ig_tc_now_ms() - t0;
    assert_true(seen < STREAM_PIECES * STREAM_TICK_MS); /* before the stream's end */
    result_free(&res);
    close_upstream(&loop, u);
}

/* Paused after the first piece: nothing more arrives while paused, even
 * past the idle deadline (100 ms, paused 4x as long), and nothing times
 * out; after resume the rest comes, whole and in order. */
static void test_pause_resume(void **state)
{
    (void)state;
    ig_upstream_opts_t opts;
    ig_upstream_opts_default(&opts);
    opts.idle_timeout_ms = 100;
    uv_loop_t loop;
    ig_upstream_t *u = open_upstream(&loop, ig_ts_port(ts), &opts);
    result_t res;
    ig_upstream_req_t *req = NULL;
    get(u, "/stream", &res, &req);
    run_until(&loop, &res.nbody, 1, 10000);
    assert_true(res.nbody >= 1);
    ig_upstream_pause(req);
    size_t len = res.len;
    int pieces = res.nbody;
    run_for(&loop, 400);
    assert_int_equal(res.nbody, pieces); /* nothing read while paused */
    assert_int_equal(res.len, len);
    assert_int_equal(res.ndone, 0); /* and the idle deadline did not run */
    ig_upstream_resume(req);
    run_until(&loop, &res.ndone, 1, 10000);
    assert_int_equal(res.ndone, 1);
    assert_int_equal(res.err, 0);
    char want[STREAM_PIECES * 4 + 1];
    for (int i = 0; i < STREAM_PIECES; i++)
        snprintf(want + 4 * i, 5, "p%02d ", i);
    assert_string_equal(res.body, want);
    assert_int_equal(ig_upstream_open_connections(u), 1); /* reusable after it */
    result_free(&res);
    close_upstream(&loop, u);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    ig_log_setup(IG_LOG_WARN, IG_LOG_TEXT); /* the test server's access lines */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keepalive_reuse),
        cmocka_unit_test(test_content_length_and_chunked_bodies),
        cmocka_unit_test(test_connect_refused),
        cmocka_unit_test(test_first_byte_timeout),
        cmocka_unit_test(test_cancel_mid_body),
        cmocka_unit_test(test_pause_resume),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
