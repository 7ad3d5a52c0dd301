#ifndef IG_TESTSERVER_H
#define IG_TESTSERVER_H

/*
 * Runs an ig_http_server on its own loop in a background thread, for tests
 * that drive it with the blocking test client. The handler runs on the loop
 * thread; ig_ts_call runs any function there and waits for it.
 */

#include <stdatomic.h>

#include "infergate/http.h"

typedef struct ig_ts_s ig_ts_t;

/* Starts the server ("127.0.0.1:0" picks a port). NULL on failure. */
ig_ts_t *ig_ts_start(const char *listen, const ig_http_limits_t *limits, ig_http_handler_cb handler,
                     void *data);
int ig_ts_port(const ig_ts_t *ts);
ig_http_server_t *ig_ts_server(ig_ts_t *ts);
uv_loop_t *ig_ts_loop(ig_ts_t *ts);

/* Runs fn(ts, arg) on the loop thread and waits until it returned. */
void ig_ts_call(ig_ts_t *ts, void (*fn)(ig_ts_t *ts, void *arg), void *arg);

/* Starts ig_http_server_close(drain_ms) from the loop thread and returns at
 * once; ig_ts_closed() says whether its callback has fired. */
void ig_ts_begin_close(ig_ts_t *ts, uint64_t drain_ms);
int ig_ts_closed(ig_ts_t *ts);

/* Closes the server (if not begun), waits for the loop to end, frees. */
void ig_ts_stop(ig_ts_t *ts);

/* cmocka group setup and teardown of one echo server (ig_ts_echo_handler,
 * default limits, 127.0.0.1:0) for a whole test program: the server is in
 * ig_ts_echo_server while the group runs. */
extern ig_ts_t *ig_ts_echo_server;
int ig_ts_echo_group_setup(void **state);
int ig_ts_echo_group_teardown(void **state);

/* On a test server's loop thread (in a handler or a callback there): a
 * malloc'ed timer on that loop with t->data = data, started with
 * timeout_ms and repeat_ms. NULL when out of memory or called on another
 * thread. ig_ts_timer_close closes and frees it. */
uv_timer_t *ig_ts_timer_start(uv_timer_cb cb, void *data, uint64_t timeout_ms, uint64_t repeat_ms);
void ig_ts_timer_close(uv_timer_t *t);

/* Polls cond(arg) every millisecond until it is true or timeout_ms pass;
 * returns its last value. For waiting on server state from the test thread. */
int ig_ts_wait(int (*cond)(void *arg), void *arg, int timeout_ms);

/* Server counters read on the loop thread. */
unsigned ig_ts_connections(ig_ts_t *ts);
unsigned ig_ts_inflight(ig_ts_t *ts);

/* A handler that answers 200 text/plain "METHOD PATH?QUERY BODYLEN\n" then
 * the body, with the request's X-Echo header (if any) as X-Echo. */
void ig_ts_echo_handler(ig_http_req_t *req, void *data);
/* A slow OpenAI-style site for gateway tests: GET /load answers at once
 * (model "tiny", one ready instance, nothing waiting), POST /v1/completions
 * answers a one-token text_completion after delay_ms, any other path 404.
 * The struct is the caller's and must outlive the server. */
typedef struct {
    int delay_ms;
    atomic_int completions; /* completion requests received so far */
} ig_ts_site_t;

/* Starts the site on 127.0.0.1:0 with default limits; NULL on failure. */
ig_ts_t *ig_ts_site_start(ig_ts_site_t *site, int delay_ms);

/* Waits up to timeout_ms until the site has received at least n completion
 * requests; 1 when it has, else 0. */
int ig_ts_site_wait(ig_ts_site_t *site, int n, int timeout_ms);

/* The metrics exposition text (ig_metrics_render); the caller frees it. */
char *ig_ts_metrics(void);

/* The value on the exposition line "SERIES VALUE" (series with its labels),
 * or absent when there is none; fails the cmocka test when the render does. */
double ig_ts_metric(const char *series, double absent);

/* Waits up to timeout_ms until series reads want (at_least: want or more;
 * an absent series reads 0), else fails the cmocka test with what it read.
 * The server accounts a request right after writing its response, on its
 * own thread: a test that has its answer waits for the registry. */
void ig_ts_expect_metric(const char *series, double want, int at_least, int timeout_ms);

#endif
