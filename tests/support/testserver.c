#include "testserver.h"
#include "testclient.h"

#include "infergate/metrics.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

typedef struct {
    void (*fn)(ig_ts_t *ts, void *arg);
    void *arg;
    atomic_int done;
} ts_call_t;

struct ig_ts_s {
    uv_loop_t loop;
    uv_async_t async;
    pthread_t thread;
    pthread_mutex_t mu;
    ts_call_t *pending; /* one call at a time */
    ig_http_server_t *server;
    atomic_int closed;
    int close_begun;
    int stopping;
};

static void on_async(uv_async_t *a)
{
    ig_ts_t *ts = a->data;
    pthread_mutex_lock(&ts->mu);
    ts_call_t *c = ts->pending;
    ts->pending = NULL;
    pthread_mutex_unlock(&ts->mu);
    if (c != NULL) {
        c->fn(ts, c->arg);
        atomic_store(&c->done, 1);
    }
}

/* The loop of the server whose thread this is (NULL on other threads). */
static _Thread_local uv_loop_t *thread_loop;

static void *loop_main(void *arg)
{
    ig_ts_t *ts = arg;
    thread_loop = &ts->loop;
    uv_run(&ts->loop, UV_RUN_DEFAULT);
    return NULL;
}

ig_ts_t *ig_ts_start(const char *listen, const ig_http_limits_t *limits, ig_http_handler_cb handler,
                     void *data)
{
    ig_ts_t *ts = calloc(1, sizeof(*ts));
    if (ts == NULL)
        return NULL;
    uv_loop_init(&ts->loop);
    pthread_mutex_init(&ts->mu, NULL);
    if (ig_http_server_start(&ts->server, &ts->loop, listen, limits, handler, data) < 0) {
        uv_run(&ts->loop, UV_RUN_DEFAULT);
        uv_loop_close(&ts->loop);
        free(ts);
        return NULL;
    }
    uv_async_init(&ts->loop, &ts->async, on_async);
    ts->async.data = ts;
    pthread_create(&ts->thread, NULL, loop_main, ts);
    return ts;
}

int ig_ts_port(const ig_ts_t *ts)
{
    return ig_http_server_port(ts->server);
}

ig_http_server_t *ig_ts_server(ig_ts_t *ts)
{
    return ts->server;
}

uv_loop_t *ig_ts_loop(ig_ts_t *ts)
{
    return &ts->loop;
}

void ig_ts_call(ig_ts_t *ts, void (*fn)(ig_ts_t *ts, void *arg), void *arg)
{
    ts_call_t c = {.fn = fn, .arg = arg};
    atomic_init(&c.done, 0);
    for (;;) {
        pthread_mutex_lock(&ts->mu);
        int free_slot = ts->pending == NULL;
        if (free_slot)
            ts->pending = &c;
        pthread_mutex_unlock(&ts->mu);
        if (free_slot)
            break;
        struct timespec d = {0, 1000000};
        nanosleep(&d, NULL);
    }
    uv_async_send(&ts->async);
    while (!atomic_load(&c.done)) {
        struct timespec d = {0, 200000};
        nanosleep(&d, NULL);
    }
}

static void on_server_closed(ig_http_server_t *s, void *data)
{
    ig_ts_t *ts = data;
    ts->server = NULL;
    atomic_store(&ts->closed, 1);
    if (ts->stopping)
        uv_close((uv_handle_t *)&ts->async, NULL);
}

typedef struct {
    uint64_t drain_ms;
} close_arg_t;

static void do_close(ig_ts_t *ts, void *arg)
{
    close_arg_t *a = arg;
    if (!ts->close_begun) {
        ts->close_begun = 1;
        ig_http_server_close(ts->server, a->drain_ms, on_server_closed, ts);
    }
}

void ig_ts_begin_close(ig_ts_t *ts, uint64_t drain_ms)
{
    close_arg_t a = {drain_ms};
    ig_ts_call(ts, do_close, &a);
}

int ig_ts_closed(ig_ts_t *ts)
{
    return atomic_load(&ts->closed);
}

static void do_stop(ig_ts_t *ts, void *arg)
{
    ts->stopping = 1;
    if (!ts->close_begun) {
        ts->close_begun = 1;
        ig_http_server_close(ts->server, 2000, on_server_closed, ts);
    } else if (atomic_load(&ts->closed)) {
        uv_close((uv_handle_t *)&ts->async, NULL);
    }
}

void ig_ts_stop(ig_ts_t *ts)
{
    if (ts == NULL)
        return;
    ig_ts_call(ts, do_stop, NULL);
    pthread_join(ts->thread, NULL);
    uv_loop_close(&ts->loop);
    pthread_mutex_destroy(&ts->mu);
    free(ts);
}

ig_ts_t *ig_ts_echo_server;

int ig_ts_echo_group_setup(void **state)
{
    (void)state;
    ig_ts_echo_server = ig_ts_start("127.0.0.1:0", NULL, ig_ts_echo_handler, NULL);
    return ig_ts_echo_server == NULL ? -1 : 0;
}

int ig_ts_echo_group_teardown(void **state)
{
    (void)state;
    ig_ts_stop(ig_ts_echo_server);
    ig_ts_echo_server = NULL;
    return 0;
}

int ig_ts_wait(int (*cond)(void *arg), void *arg, int timeout_ms)
{
    long long deadline = ig_tc_now_ms() + timeout_ms;
    int v;
    while (!(v = cond(arg)) && ig_tc_now_ms() < deadline) {
        struct timespec d = {0, 1000000};
        nanosleep(&d, NULL);
    }
    return v;
}

typedef struct {
    unsigned conns, inflight;
} counts_t;

static void do_counts(ig_ts_t *ts, void *arg)
{
    counts_t *c = arg;
    c->conns = ts->server ? ig_http_server_connections(ts->server) : 0;
    c->inflight = ts->server ? ig_http_server_inflight(ts->server) : 0;
}

unsigned ig_ts_connections(ig_ts_t *ts)
{
    counts_t c;
    ig_ts_call(ts, do_counts, &c);
    return c.conns;
}

unsigned ig_ts_inflight(ig_ts_t *ts)
{
    counts_t c;
    ig_ts_call(ts, do_counts, &c);
    return c.inflight;
}

void ig_ts_echo_handler(ig_http_req_t *req, void *data)
{
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    const char *q = ig_http_req_query(req);
    char head[512];
    int n = snprintf(head, sizeof(head), "%s %s%s%s %zu\n", ig_http_req_method(req),
                     ig_http_req_path(req), q[0] ? "?" : "", q, len);
    if (n < 0 || (size_t)n >= sizeof(head))
        n = 0;
    char *out = ig_http_req_alloc(req, (size_t)n + len + 1);
    if (out == NULL) {
        ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    memcpy(out, head, (size_t)n);
    memcpy(out + n, body, len);
    const char *echo = ig_http_req_header(req, "x-echo");
    if (echo != NULL)
        ig_http_add_header(req, "X-Echo", echo);
    ig_http_req_set_route(req, "/echo");
    ig_http_respond(req, 200, "text/plain", out, (size_t)n + len);
}

static void on_timer_closed(uv_handle_t *h)
{
    free(h);
}

uv_timer_t *ig_ts_timer_start(uv_timer_cb cb, void *data, uint64_t timeout_ms, uint64_t repeat_ms)
{
    if (thread_loop == NULL)
        return NULL;
    uv_timer_t *t = malloc(sizeof(*t));
    if (t == NULL)
        return NULL;
    uv_timer_init(thread_loop, t);
    t->data = data;
    uv_timer_start(t, cb, timeout_ms, repeat_ms);
    return t;
}

void ig_ts_timer_close(uv_timer_t *t)
{
    uv_close((uv_handle_t *)t, on_timer_closed);
}

static void site_answer(uv_timer_t *t)
{
    static const char body[] =
        "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"tiny\","
        "\"choices\":[{\"index\":0,\"text\":\" ok\",\"finish_reason\":\"length\"}],"
        "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}";
    ig_http_respond(t->data, 200, "application/json", body, sizeof(body) - 1);
    ig_ts_timer_close(t);
}

static void site_handler(ig_http_req_t *req, void *data)
{
    ig_ts_site_t *site = data;
    const char *path = ig_http_req_path(req);
    if (strcmp(path, "/load") == 0) {
        static const char load[] = "{\"models\":[{\"id\":\"tiny\"}],\"ready_instances\":1,"
                                   "\"waiting\":0,\"est_wait_s\":0}";
        ig_http_respond(req, 200, "application/json", load, sizeof(load) - 1);
    } else if (strcmp(path, "/v1/completions") == 0) {
        if (ig_ts_timer_start(site_answer, req, (uint64_t)site->delay_ms, 0) == NULL) {
            ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
            return;
        }
        atomic_fetch_add(&site->completions, 1);
    } else {
        ig_http_respond_error(req, 404, NULL, NULL, NULL, "no %s here", path);
    }
}

ig_ts_t *ig_ts_site_start(ig_ts_site_t *site, int delay_ms)
{
    ig_http_limits_t limits;
    ig_http_limits_default(&limits);
    site->delay_ms = delay_ms;
    atomic_init(&site->completions, 0);
    return ig_ts_start("127.0.0.1:0", &limits, site_handler, site);
}

typedef struct {
    ig_ts_site_t *site;
    int n;
} site_wait_t;

static int site_has(void *arg)
{
    site_wait_t *w = arg;
    return atomic_load(&w->site->completions) >= w->n;
}

int ig_ts_site_wait(ig_ts_site_t *site, int n, int timeout_ms)
{
    site_wait_t w = {site, n};
    return ig_ts_wait(site_has, &w, timeout_ms);
}

char *ig_ts_metrics(void)
{
    return ig_metrics_render(NULL);
}

double ig_ts_metric(const char *series, double absent)
{
    char *text = ig_ts_metrics();
    assert_non_null(text);
    double v = absent;
    size_t n = strlen(series);
    for (char *line = text; line != NULL && *line;) {
        char *nl = strchr(line, '\n');
        if (strncmp(line, series, n) == 0 && line[n] == ' ') {
            v = strtod(line + n + 1, NULL);
            break;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(text);
    return v;
}

typedef struct {
    const char *series;
    double want;
    int at_least;
} metric_expect_t;

static int metric_reached(void *arg)
{
    const metric_expect_t *e = arg;
    double v = ig_ts_metric(e->series, 0);
    return e->at_least ? v >= e->want : v == e->want;
}

void ig_ts_expect_metric(const char *series, double want, int at_least, int timeout_ms)
{
    metric_expect_t e = {series, want, at_least};
    if (!ig_ts_wait(metric_reached, &e, timeout_ms))
        fail_msg("%s is %g, want %s%g", series, ig_ts_metric(series, 0), at_least ? ">= " : "",
                 want);
}
