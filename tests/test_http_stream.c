/* Streaming responses: SSE over chunked encoding, HTTP/1.0 close-delimited
 * streams, backpressure against a client that stops reading (the queued
 * bytes stay bounded, the producer sees IG_EBUSY and resumes on drain), and
 * the abort callback when the client goes away mid-stream. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "tc_expect.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 10000
#define WBUF (64 * 1024)
#define CHUNK (16 * 1024)
#define TOTAL (48u << 20)

static ig_ts_t *server;

/* flood state (loop thread writes, test thread reads) */
static atomic_size_t written;
static atomic_size_t max_queued;
static atomic_int busy_count, drain_count, waiting_drain, flood_done;
static atomic_llong waiting_since;

/* Checks on the loop thread must not longjmp out of it: they record the
 * failing line, and the test thread asserts that none failed. */
static atomic_int loop_failed_line;
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            atomic_store(&loop_failed_line, __LINE__);                                             \
    } while (0)

/* abort state */
static atomic_int aborted, forever_finished, write_after_abort;

static void flood(ig_http_req_t *req)
{
    static char chunk[CHUNK];
    while (atomic_load(&written) < TOTAL) {
        size_t off = atomic_load(&written);
        for (size_t i = 0; i < CHUNK; i++)
            chunk[i] = (char)('a' + (off + i) % 26);
        int rc = ig_http_stream_write(req, chunk, CHUNK);
        atomic_fetch_add(&written, CHUNK);
        size_t q = ig_http_req_write_queued(req);
        if (q > atomic_load(&max_queued))
            atomic_store(&max_queued, q);
        if (rc == IG_EBUSY) {
            atomic_fetch_add(&busy_count, 1);
            atomic_store(&waiting_since, ig_tc_now_ms());
            atomic_store(&waiting_drain, 1);
            return; /* wait for the drain callback */
        }
        CHECK((rc) == 0);
    }
    ig_http_stream_end(req);
    atomic_store(&flood_done, 1);
}

static void on_drain(ig_http_req_t *req, void *data)
{
    atomic_fetch_add(&drain_count, 1);
    atomic_store(&waiting_drain, 0);
    /* drained below the mark */
    CHECK(ig_http_req_write_queued(req) < WBUF);
    flood(req);
}

static void on_abort(ig_http_req_t *req, void *data)
{
    atomic_store(&aborted, 1);
}

static void on_tick(uv_timer_t *t)
{
    ig_http_req_t *req = t->data;
    if (ig_http_req_aborted(req)) {
        if (ig_http_stream_write(req, "data: late\n\n", 12) == IG_ECLOSED)
            atomic_store(&write_after_abort, 1);
        ig_http_stream_end(req);
        atomic_store(&forever_finished, 1);
        ig_ts_timer_close(t);
        return;
    }
    ig_http_stream_write(req, "data: tick\n\n", 12);
}

static void handler(ig_http_req_t *req, void *data)
{
    const char *path = ig_http_req_path(req);
    if (strcmp(path, "/sse") == 0) {
        ig_http_req_set_route(req, "/sse");
        CHECK((ig_http_add_header(req, "X-Stream", "1")) == 0);
        CHECK((ig_http_stream_start(req, 200, "text/event-stream")) == 0);
        CHECK((ig_http_add_header(req, "X-Late", "1")) == IG_ESTATE);
        for (int i = 0; i < 5; i++) {
            char ev[64];
            int n = snprintf(ev, sizeof(ev), "data: {\"i\":%d}\n\n", i);
            CHECK((ig_http_stream_write(req, ev, (size_t)n)) == 0);
        }
        CHECK((ig_http_stream_end(req)) == 0);
    } else if (strcmp(path, "/flood") == 0) {
        ig_http_req_on_drain(req, on_drain, NULL);
        CHECK((ig_http_stream_start(req, 200, "application/octet-stream")) == 0);
        flood(req);
    } else if (strcmp(path, "/forever") == 0) {
        ig_http_req_on_abort(req, on_abort, NULL);
        ig_http_stream_start(req, 200, "text/event-stream");
        ig_ts_timer_start(on_tick, req, 5, 5);
    } else {
        ig_ts_echo_handler(req, NULL);
    }
}

static int group_setup(void **state)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    l.write_buffer_bytes = WBUF;
    server = ig_ts_start("127.0.0.1:0", &l, handler, NULL);
    return server == NULL ? -1 : 0;
}

static int group_teardown(void **state)
{
    ig_ts_stop(server);
    if (atomic_load(&loop_failed_line) != 0) {
        fprintf(stderr, "a check on the loop thread failed at line %d\n",
                atomic_load(&loop_failed_line));
        return -1;
    }
    return 0;
}

/* Sends req on a new connection to the server and reads a 200 into r; the
 * connection. */
static ig_tc_t *get_ok(const char *req, ig_tc_response_t *r)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    ig_tc_exchange(tc, req, r, TMO);
    assert_int_equal(r->status, 200);
    return tc;
}

static void test_sse(void **state)
{
    ig_tc_response_t r;
    ig_tc_t *tc = get_ok("GET /sse HTTP/1.1\r\nHost: t\r\n\r\n", &r);
    assert_true(r.chunked);
    assert_int_equal(r.nchunks, 5);
    assert_string_equal(ig_tc_header(&r, "content-type"), "text/event-stream");
    assert_string_equal(ig_tc_header(&r, "cache-control"), "no-cache");
    assert_string_equal(ig_tc_header(&r, "x-stream"), "1");
    assert_null(ig_tc_header(&r, "x-late"));
    assert_null(ig_tc_header(&r, "content-length"));
    assert_string_equal(r.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\n"
                                "data: {\"i\":3}\n\ndata: {\"i\":4}\n\n");
    ig_tc_response_free(&r);
    /* the connection is still usable */
    ig_tc_expect(tc, "GET /after HTTP/1.1\r\nHost: t\r\n\r\n", 0, "GET /after 0\n", TMO);
    ig_tc_close(tc);
    assert_int_equal(atomic_load(&loop_failed_line), 0);
}

static void test_sse_http10(void **state)
{
    ig_tc_response_t r;
    ig_tc_t *tc = get_ok("GET /sse HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r);
    assert_false(r.chunked);
    assert_string_equal(ig_tc_header(&r, "connection"), "close");
    assert_true(strncmp(r.body, "data: {\"i\":0}\n\n", 15) == 0);
    assert_int_equal(r.body_len, 5 * strlen("data: {\"i\":0}\n\n"));
    ig_tc_response_free(&r);
    ig_tc_close(tc);
}

/* True once the producer has been waiting for a drain for 300 ms: the
 * kernel buffers are full and nothing moves while the client does not
 * read. */
static int stalled(void *arg)
{
    return atomic_load(&waiting_drain) && ig_tc_now_ms() - atomic_load(&waiting_since) > 300;
}

static void test_slow_reader_backpressure(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    assert_int_equal(ig_tc_sends(tc, "GET /flood HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    assert_true(ig_ts_wait(stalled, NULL, TMO));
    /* The producer is paused well short of the total, and what the server
     * holds is bounded by the mark plus one write. */
    assert_true(atomic_load(&written) < TOTAL);
    assert_true(atomic_load(&busy_count) >= 1);
    size_t bound = WBUF + CHUNK + 64;
    if (atomic_load(&max_queued) > bound)
        fail_msg("queued %zu > %zu", atomic_load(&max_queued), bound);
    /* Now read everything: drains resume the producer to the end. */
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, 30000), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, TOTAL);
    for (size_t i = 0; i < TOTAL; i += 4099)
        assert_int_equal(r.body[i], (char)('a' + i % 26));
    ig_tc_response_free(&r);
    assert_true(atomic_load(&drain_count) >= 1);
    assert_true(atomic_load(&flood_done));
    assert_true(atomic_load(&max_queued) <= bound);
    ig_tc_close(tc);
    assert_int_equal(atomic_load(&loop_failed_line), 0);
}

static int forever_done(void *arg)
{
    return atomic_load(&forever_finished);
}

static void test_abort_mid_stream(void **state)
{
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    assert_int_equal(ig_tc_sends(tc, "GET /forever HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    char buf[256];
    assert_true(ig_tc_read_raw(tc, buf, 200, TMO) > 0);
    ig_tc_close(tc);
    assert_true(ig_ts_wait(forever_done, NULL, TMO));
    assert_true(atomic_load(&aborted));
    assert_true(atomic_load(&write_after_abort));
    assert_int_equal(ig_ts_inflight(server), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_sse_http10),
        cmocka_unit_test(test_slow_reader_backpressure),
        cmocka_unit_test(test_abort_mid_stream),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
