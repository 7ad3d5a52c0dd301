/*
 * The gateway's request path: admission, routing, attempts, retries,
 * hedging and streaming back (see include/infergate/proxy.h).
 *
 * One exchange per client request. It makes at most two attempts at a time
 * (the primary and a hedge). The first attempt whose answer is acceptable
 * (not a retryable failure) is committed: its bytes go to the client and
 * any other attempt is canceled. Until something is committed, failures
 * are retried on another upstream within the retry budget.
 *
 * A whole answer is committed when it is complete. A stream is committed by
 * its first content token: events before it (a chat stream's empty role
 * delta, comments) are held, bounded, and sent in order at the commit, so
 * that a stream that stalls after its role delta can still be hedged or
 * retried, and its TTFT is the first token's.
 *
 * Each attempt gathers into its own buffer: a failed attempt's partial
 * body goes with it, never into the answer of the retry.
 *
 * The HTTP server may run the abort callback inside one of our calls (a
 * write that fails at once). Such an abort is noted and handled when the
 * call returns; the request is forgotten (x->req = NULL) before every call
 * that finishes it; the exchange itself is freed only in its timers' close
 * callbacks, never on a stack that still uses it.
 */
#include "infergate/proxy.h"
#include "infergate/admit.h"
#include "infergate/api.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/usage.h"
#include "infergate/prefix.h"
#include "infergate/prefix_route.h"
#include "infergate/sse.h"
#include "infergate/strbuf.h"

#include "base/list.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_TARGETS 64
#define MAX_ATTEMPTS 2 /* at once: the primary and a hedge */

typedef struct exchange_s exchange_t;

typedef struct {
    exchange_t *x;
    ig_upstream_req_t *ureq; /* NULL once ended */
    ig_router_upstream_t *route;
    ig_upstream_t *client;
    uint64_t start_ns;
    double predicted_wait;
    int rif;        /* the upstream's attempts in flight when this one began */
    uint64_t order; /* its number in the order of the upstream's attempts */
    int status;
    char content_type[128];
    char retry_after[32];
    int is_stream;           /* the answer is text/event-stream */
    int hedge;               /* this attempt is the hedge */
    int trial;               /* it holds the upstream's half-open trial */
    int first_token;         /* a stream's first content token came */
    uint64_t ft_deadline_ns; /* no first token by then: timed out (0: none) */
    /* A whole answer, or a stream's events before its first content token. */
    char *buf;
    size_t blen, bcap;
    size_t scan;         /* stream: buf[0..scan) holds complete events without a token */
    int uncached_tokens; /* prompt tokens it prefills: what its TTFT is for */
    int to_site;         /* the upstream is a remote site */
    ig_price_t price;    /* the upstream's, when the attempt began */
} attempt_t;

typedef enum { X_QUEUED, X_TRYING, X_COMMITTED, X_DONE } xstate_t;

struct exchange_s {
    ig_proxy_t *px;
    ig_http_req_t *req;
    ig_list_t queue_node; /* in its model's queue while X_QUEUED */
    xstate_t state;
    char *model, *path, *body;
    size_t len;
    unsigned endpoint; /* IG_PROXY_EP_* of path; 0 for completions and chat */
    int stream;
    int prompt_tokens;
    int local_only;
    int priority;          /* ig_proxy_call_t.priority */
    uint64_t max_queue_ms; /* 0: the proxy's queue_timeout_ms */
    int output_tokens;     /* ig_proxy_call_t's, for the cost objective */
    double slo_ttft_s;     /* its own tighter SLO (0: the proxy's) */
    uint64_t start_ns;
    uint64_t sent_ns; /* its first attempt was sent (0: not yet) */
    uint64_t queued_ns;
    uv_timer_t timer;    /* queue hold timeout and the hedge delay */
    uv_timer_t ft_timer; /* the attempts' first-token deadlines */
    int open_handles;    /* timers not yet closed; freed at 0 */
    int in_http;         /* inside a call into the HTTP server */
    int abort_pending;   /* the client went away during that call */
    int streaming;       /* the response to the client is a stream */
    attempt_t att[MAX_ATTEMPTS];
    attempt_t *committed;
    int ntried;   /* tried[0..ntried) */
    int lacked;   /* upstreams that answered 404 for the endpoint */
    int attempts; /* started, all kinds */
    int retries;
    int hedged;
    ig_prefix_query_t prefix; /* its hashes are owned (prefix_hashes) */
    uint64_t *prefix_hashes;
    /* the last retryable failure, for the client if nothing else works */
    int last_status;
    int last_err;
    char last_retry_after[32];
    int client_paused;
    ig_usage_meter_t usage; /* the answer's tokens, for the region counters */
    double spent;           /* USD of its attempts that gave no answer (hedges, failures) */
    /* Not zeroed by ig_proxy_handle (1.2 KB of the exchange): each is
     * written before it is read. */
    ig_router_upstream_t *tried[MAX_TARGETS];
    char route_header[512];     /* "" until the first attempt */
    char forwarded_header[128]; /* extra header lines for sites */
};

typedef struct {
    char *model;
    ig_list_t waiting; /* exchange_t.queue_node, oldest first */
    int n;
    ig_list_t node; /* in px->queues */
} model_queue_t;

#define QUEUE_OF(it) IG_LIST_DATA(it, model_queue_t, node)

struct ig_proxy_s {
    uv_loop_t *loop;
    ig_proxy_opts_t opts;
    ig_router_t router;
    ig_proxy_resolve_cb resolve;
    void *resolve_data;
    ig_proxy_cost_cb on_cost;
    void *on_cost_data;
    ig_list_t queues; /* model_queue_t.node */
    int inflight;     /* exchanges past admission, not done */
    int live;         /* exchanges allocated, not yet freed */
    int queued;
    double hedge_tokens;
    int closing;
    void (*close_cb)(void *data);
    void *close_data;
    /* metrics */
    ig_metric_t *m_decisions, *m_retries, *m_hedges, *m_errors, *m_ejections, *m_explorations;
    ig_metric_t *m_ttft, *m_e2e, *m_rejected, *m_queue, *m_up_ttft;
    ig_usage_families_t m_usage;
    double ttft_sum; /* every TTFT observed, for the status page's chart */
    long long ttft_count;
    ig_prefix_index_t *prefix_index; /* where prompts went (NULL: out of memory) */
    ig_metric_t *m_limit_changes;
};

static void attempt_start(exchange_t *x, int hedge);
static void exchange_fail(exchange_t *x, int status, const char *code, const char *retry_after,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void exchange_done(exchange_t *x);
static void pump(ig_proxy_t *px, const char *model);

void ig_proxy_opts_default(ig_proxy_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    ig_router_opts_default(&o->router);
    o->queue_size = 64;
    o->queue_timeout_ms = 30000;
    o->max_inflight = 0;
    o->hedge = 0;
    o->hedge_budget = 0.05;
    o->hedge_quantile = 0.95;
    o->max_response_bytes = 16 << 20;
    o->max_held_bytes = 64 << 10;
    o->first_token_timeout_ms = 0;
}

int ig_proxy_start(ig_proxy_t **out, uv_loop_t *loop, const ig_proxy_opts_t *opts,
                   ig_proxy_resolve_cb resolve, void *data)
{
    ig_proxy_t *px = calloc(1, sizeof(*px));
    if (px == NULL)
        return IG_ENOMEM;
    ig_list_init(&px->queues);
    /* 128 Ki blocks (2 Mi tokens of prompts) over all upstreams, 4 Ki
     * sessions; without it routing ignores caches. */
    if (ig_prefix_index_create(&px->prefix_index, 1 << 17, 4096) != 0)
        px->prefix_index = NULL;
    px->loop = loop;
    if (opts != NULL)
        px->opts = *opts;
    else
        ig_proxy_opts_default(&px->opts);
    ig_router_init(&px->router, &px->opts.router);
    px->resolve = resolve;
    px->resolve_data = data;
    px->m_decisions = ig_metrics_counter("infergate_route_decisions_total",
                                         "Routing decisions by model, upstream and policy.",
                                         "model,upstream,policy");
    px->m_explorations = ig_metrics_counter(
        "infergate_route_explorations_total",
        "Requests sent to an idle upstream whose service estimate was stale, to measure it again.",
        "upstream");
    px->m_retries = ig_metrics_counter("infergate_retries_total",
                                       "Attempts retried on another upstream before the first "
                                       "byte reached the client.",
                                       "model,reason");
    px->m_hedges = ig_metrics_counter(
        "infergate_hedges_total", "Hedged attempts sent, and which attempt won.", "model,result");
    px->m_errors = ig_metrics_counter("infergate_upstream_errors_total",
                                      "Failed attempts by upstream and kind.", "upstream,kind");
    px->m_ejections = ig_metrics_counter(
        "infergate_upstream_ejections_total",
        "Outlier ejections by upstream (a failed half-open trial ejects again).", "upstream");
    px->m_ttft = ig_metrics_histogram("infergate_time_to_first_token_seconds",
                                      "Time from the request's arrival to the first content "
                                      "token of a stream, or to a whole answer.",
                                      "model", NULL, 0);
    px->m_up_ttft = ig_metrics_histogram(
        "infergate_upstream_time_to_first_token_seconds",
        "Time from sending the answering attempt to an upstream to its first content token, "
        "or to its whole answer: the upstream and the network to it, without the gateway's "
        "queue.",
        "upstream", NULL, 0);
    px->m_e2e = ig_metrics_histogram("infergate_e2e_request_latency_seconds",
                                     "Time from the request's arrival to the end of its answer.",
                                     "model", NULL, 0);
    px->m_rejected = ig_metrics_counter(
        "infergate_rejected_total", "Requests refused at admission, by reason.", "model,reason");
    px->m_queue = ig_metrics_gauge("infergate_queue_depth",
                                   "Requests held because every upstream was saturated.", "model");
    ig_usage_families_register(&px->m_usage);
    px->m_limit_changes = ig_metrics_counter(
        "infergate_upstream_concurrency_limit_changes_total",
        "Moves of each upstream's adaptive concurrency limit, by why it moved.", "upstream,reason");
    *out = px;
    return 0;
}

void ig_proxy_set_opts(ig_proxy_t *px, const ig_proxy_opts_t *opts)
{
    px->opts = *opts;
    px->router.opts = opts->router; /* the learned state of upstreams stays */
}

ig_router_t *ig_proxy_router(ig_proxy_t *px)
{
    return &px->router;
}

int ig_proxy_inflight(const ig_proxy_t *px)
{
    return px->inflight;
}

void ig_proxy_ttft_totals(const ig_proxy_t *px, double *sum, long long *count)
{
    *sum = px->ttft_sum;
    *count = px->ttft_count;
}

int ig_proxy_queued(const ig_proxy_t *px)
{
    return px->queued;
}

/* ---- queues ------------------------------------------------------------ */

/* The oldest exchange a non-empty queue holds. */
#define QUEUE_HEAD(q) IG_LIST_DATA(ig_list_first(&(q)->waiting), exchange_t, queue_node)

static model_queue_t *queue_of(ig_proxy_t *px, const char *model, int create)
{
    ig_list_t *it;
    IG_LIST_FOREACH(it, &px->queues)
    {
        if (strcmp(QUEUE_OF(it)->model, model) == 0)
            return QUEUE_OF(it);
    }
    if (!create)
        return NULL;
    model_queue_t *q = calloc(1, sizeof(*q));
    if (q == NULL || (q->model = strdup(model)) == NULL) {
        free(q);
        return NULL;
    }
    ig_list_init(&q->waiting);
    ig_list_push_front(&px->queues, &q->node);
    return q;
}

static void queue_remove(ig_proxy_t *px, exchange_t *x)
{
    model_queue_t *q = queue_of(px, x->model, 0);
    if (q == NULL)
        return;
    ig_list_remove(&x->queue_node);
    q->n--;
    px->queued--;
    ig_metric_set(px->m_queue, q->n, x->model);
}

/* In priority order, and by the time first queued within one priority: one
 * that pump() took out and found still saturated goes back to its place,
 * not behind those that came after it. */
static void queue_push(ig_proxy_t *px, model_queue_t *q, exchange_t *x)
{
    ig_list_t *at = q->waiting.prev;
    while (at != &q->waiting) {
        const exchange_t *o = IG_LIST_DATA(at, exchange_t, queue_node);
        if (o->priority < x->priority ||
            (o->priority == x->priority && o->queued_ns <= x->queued_ns))
            break;
        at = at->prev;
    }
    ig_list_insert_after(at, &x->queue_node);
    q->n++;
    px->queued++;
    ig_metric_set(px->m_queue, q->n, x->model);
}

int ig_proxy_queued_ahead(const ig_proxy_t *px, const char *model, int priority)
{
    model_queue_t *q = queue_of((ig_proxy_t *)px, model, 0);
    int n = 0;
    const ig_list_t *it;
    if (q == NULL)
        return 0;
    IG_LIST_FOREACH(it, &q->waiting)
    {
        if (IG_LIST_DATA(it, exchange_t, queue_node)->priority > priority)
            break;
        n++;
    }
    return n;
}

int ig_proxy_queued_model(const ig_proxy_t *px, const char *model)
{
    model_queue_t *q = queue_of((ig_proxy_t *)px, model, 0);
    return q ? q->n : 0;
}

/* ---- helpers ----------------------------------------------------------- */

/* Attempts an upstream may have in flight (include/infergate/admit.h). */
static int limit_of(const ig_proxy_t *px, const ig_router_upstream_t *u)
{
    return ig_admit_limit(&px->router, u, px->opts.max_inflight);
}

int ig_proxy_upstream_limit(const ig_proxy_t *px, const ig_router_upstream_t *u)
{
    return limit_of(px, u);
}

/* How long an upstream that answered 404 for an endpoint is not asked for
 * it again: a site upgraded meanwhile is found within this. */
#define LACKS_RECHECK_NS (60ULL * 1000000000ULL)

/* The endpoint bit of a path the proxy forwards: the optional endpoints
 * an upstream may not serve. 0 for completions and chat, which every
 * upstream of a model serves (a 404 there is the client's answer). */
static unsigned endpoint_of(const char *path)
{
    if (strcmp(path, "/v1/embeddings") == 0)
        return IG_PROXY_EP_EMBEDDINGS;
    if (strcmp(path, "/v1/responses") == 0)
        return IG_PROXY_EP_RESPONSES;
    return 0;
}

/* 1 when u answered 404 for the endpoint lately. */
static int lacks(const ig_router_upstream_t *u, unsigned endpoint, uint64_t now)
{
    return endpoint != 0 && (u->lacks & endpoint) != 0 && now < u->lacks_until_ns;
}

static int was_tried(const exchange_t *x, const ig_router_upstream_t *u)
{
    for (int i = 0; i < x->ntried; i++) {
        if (x->tried[i] == u)
            return 1;
    }
    return 0;
}

/*
 * After the router's bookkeeping of an attempt: the upstream's connections
 * follow its limit, one more kept for the prober (a site's or a pool's
 * probe is one request at a time), so that no more connections are open
 * than requests may be in flight; a move of the limit is counted by why.
 */
static void apply_limit(ig_proxy_t *px, attempt_t *a, uint64_t changes_before)
{
    ig_router_upstream_t *u = a->route;
    ig_upstream_set_max_connections(a->client, (unsigned)limit_of(px, u) + 1);
    if (u->limit_changes != changes_before && u->limit_reason != NULL) {
        ig_metric_add(px->m_limit_changes, (double)(u->limit_changes - changes_before), u->name,
                      u->limit_reason);
        IG_DEBUG("upstream %s: limit %d (%s; W %.4fs, baseline %.4fs)", u->name, limit_of(px, u),
                 u->limit_reason, u->limit_w_s, u->limit_base_s);
    }
}

static double seconds_since(uint64_t t0)
{
    return (double)(uv_hrtime() - t0) / 1e9;
}

/* The answer's first token (a whole answer: its end) came at now from a:
 * the model's and the upstream's histograms, the access log's timing. */
static void observe_ttft(ig_proxy_t *px, const exchange_t *x, const attempt_t *a, uint64_t now)
{
    double t = now > x->start_ns ? (double)(now - x->start_ns) / 1e9 : 0.0;
    double own = now > a->start_ns ? (double)(now - a->start_ns) / 1e9 : 0.0;
    ig_metric_observe(px->m_ttft, t, x->model);
    ig_metric_observe(px->m_up_ttft, own, a->route->name);
    px->ttft_sum += t;
    px->ttft_count++;
    if (x->req != NULL) {
        double queue = x->sent_ns > x->start_ns ? (double)(x->sent_ns - x->start_ns) / 1e9 : 0.0;
        ig_http_req_set_timing(x->req, queue, t, own);
    }
}

static void attempt_charge(attempt_t *a, ig_outcome_t outcome, const char *kind, uint64_t now);

/* Ends an attempt's bookkeeping with the router (once). */
static void attempt_account(attempt_t *a, ig_outcome_t outcome, const char *kind)
{
    ig_proxy_t *px = a->x->px;
    uint64_t now = uv_hrtime();
    if (outcome != IG_OUTCOME_SUCCESS)
        attempt_charge(a, outcome, kind, now); /* an answer is charged by answer_cost */
    uint64_t until_before = a->route->ejected_until_ns;
    uint64_t changes_before = a->route->limit_changes;
    ig_router_attempt_end(&px->router, a->route, outcome, a->trial, now);
    ig_router_order_end(a->route, a->order, a->rif, outcome == IG_OUTCOME_SUCCESS, now);
    apply_limit(px, a, changes_before);
    a->trial = 0;
    /* Every ejection counts, a failed trial's again-ejection too. */
    if (a->route->ejected_until_ns != until_before && a->route->ejected_until_ns > now) {
        IG_WARN("upstream %s: ejected for failing (%d in a row)", a->route->name,
                a->route->ejections);
        ig_metric_add(px->m_ejections, 1, a->route->name);
    }
    if (outcome == IG_OUTCOME_FAILURE || outcome == IG_OUTCOME_BACKPRESSURE)
        ig_metric_add(px->m_errors, 1, a->route->name, kind);
}

/* Forgets what an attempt gathered. */
static void attempt_drop_body(attempt_t *a)
{
    free(a->buf);
    a->buf = NULL;
    a->blen = a->bcap = a->scan = 0;
}

static void attempt_cancel(attempt_t *a)
{
    if (a->ureq == NULL)
        return;
    ig_upstream_cancel(a->ureq);
    a->ureq = NULL;
    attempt_drop_body(a);
    /* An abandoned attempt says nothing about the upstream's health; a
     * half-open trial it held may run again on another request. */
    attempt_account(a, IG_OUTCOME_ABANDONED, "");
}

/* Cancels every attempt but keep (NULL: all). Where keep won a stream, one
 * that had not sent its first token was slower than the time it ran, which
 * its upstream's TTFT estimate learns (ig_router_observe_ttft_above()); a
 * whole answer's time is learned as a hold, not a TTFT. */
static void cancel_others(exchange_t *x, attempt_t *keep)
{
    for (int i = 0; i < MAX_ATTEMPTS; i++) {
        attempt_t *a = &x->att[i];
        if (a == keep || a->ureq == NULL)
            continue;
        uint64_t now = keep != NULL && x->stream && !a->first_token ? uv_hrtime() : 0;
        if (now > a->start_ns)
            ig_router_observe_ttft_above(&x->px->router, a->route, a->uncached_tokens,
                                         (double)(now - a->start_ns) / 1e9, a->predicted_wait, now);
        attempt_cancel(a);
    }
}

/* Makes a the attempt whose answer the client gets: the others are
 * cancelled, a hedge that won is counted, the exchange's timer stops. */
static void commit_attempt(exchange_t *x, attempt_t *a)
{
    x->state = X_COMMITTED;
    x->committed = a;
    cancel_others(x, a);
    if (a->hedge)
        ig_metric_add(x->px->m_hedges, 1, x->model, "hedge_won");
    uv_timer_stop(&x->timer);
}

static int attempts_live(const exchange_t *x)
{
    int n = 0;
    for (int i = 0; i < MAX_ATTEMPTS; i++)
        n += x->att[i].ureq != NULL;
    return n;
}

/* ---- the client side ---------------------------------------------------- */

/*
 * Every call into the HTTP server goes through these. A call that writes
 * may detach the connection at once (EPIPE, ECONNRESET, no memory) and run
 * the abort callback inside it; the abort is then handled when the call
 * has returned. A call that finishes the request unhooks our callbacks and
 * forgets the request first: after it, x->req is NULL and nothing here
 * touches the request again.
 */
static void client_gone(exchange_t *x);

static void http_enter(exchange_t *x)
{
    x->in_http++;
}

static void http_leave(exchange_t *x)
{
    if (--x->in_http > 0 || !x->abort_pending)
        return;
    x->abort_pending = 0;
    client_gone(x);
}

/* Takes the request out of the exchange for a finishing call. */
static ig_http_req_t *req_take(exchange_t *x)
{
    ig_http_req_t *req = x->req;
    if (req != NULL) {
        ig_http_req_on_abort(req, NULL, NULL);
        ig_http_req_on_drain(req, NULL, NULL);
        x->req = NULL;
    }
    return req;
}

static int client_stream_start(exchange_t *x, int status, const char *content_type)
{
    if (x->req == NULL)
        return IG_ECLOSED;
    http_enter(x);
    int rc = ig_http_stream_start(x->req, status, content_type);
    if (rc != IG_ESTATE)
        x->streaming = 1;
    http_leave(x);
    return x->req != NULL ? rc : IG_ECLOSED;
}

static int client_stream_write(exchange_t *x, const char *buf, size_t len)
{
    if (x->req == NULL)
        return IG_ECLOSED;
    http_enter(x);
    int rc = ig_http_stream_write(x->req, buf, len);
    http_leave(x);
    return x->req != NULL ? rc : IG_ECLOSED;
}

static void client_stream_end(exchange_t *x)
{
    ig_http_req_t *req = req_take(x);
    if (req != NULL)
        ig_http_stream_end(req);
}

static void client_respond(exchange_t *x, int status, const char *content_type, const char *body,
                           size_t len)
{
    ig_http_req_t *req = req_take(x);
    if (req != NULL)
        ig_http_respond(req, status, content_type, body, len);
}

static void client_error(exchange_t *x, int status, const char *type, const char *code,
                         const char *msg)
{
    if (x->streaming) {
        client_stream_end(x);
        return;
    }
    ig_http_req_t *req = req_take(x);
    if (req != NULL)
        ig_http_respond_error(req, status, type, NULL, code, "%s", msg);
}

/* The client went away (or its connection broke under a write): cancel the
 * upstream work and finish the request; the bytes go nowhere. */
static void client_gone(exchange_t *x)
{
    if (x->state == X_DONE || x->req == NULL)
        return;
    IG_DEBUG("client of %s went away; canceling upstream work", x->path);
    if (x->state == X_QUEUED)
        queue_remove(x->px, x);
    cancel_others(x, NULL);
    client_error(x, 499, "client_closed", NULL, "client closed the request");
    exchange_done(x);
}

static void on_client_abort(ig_http_req_t *req, void *data)
{
    exchange_t *x = data;
    (void)req;
    if (x->state == X_DONE || x->req == NULL)
        return;
    if (x->in_http > 0) {
        x->abort_pending = 1; /* our call into the server is still on the stack */
        return;
    }
    client_gone(x);
}

static void on_client_drain(ig_http_req_t *req, void *data)
{
    exchange_t *x = data;
    (void)req;
    if (x->client_paused && x->committed != NULL && x->committed->ureq != NULL) {
        x->client_paused = 0;
        ig_upstream_resume(x->committed->ureq);
    }
}

static void add_route_headers(exchange_t *x, attempt_t *a)
{
    if (x->req == NULL)
        return;
    ig_http_req_set_upstream(x->req, a->route->name); /* for the access log */
    ig_http_add_header(x->req, "x-infergate-upstream", a->route->name);
    ig_http_add_header(x->req, "x-infergate-route", x->route_header);
}

/* Sends stream bytes of the committed attempt; pauses it when the client
 * is slow, ends the exchange when the client is gone. */
static void stream_out(exchange_t *x, attempt_t *a, const char *buf, size_t len)
{
    ig_usage_stream(&x->usage, &x->px->m_usage, x->model, buf, len, uv_hrtime());
    int rc = client_stream_write(x, buf, len);
    if (rc == IG_EBUSY) {
        if (!x->client_paused && a->ureq != NULL) {
            x->client_paused = 1;
            ig_upstream_pause(a->ureq);
        }
        return;
    }
    if (rc < 0) {
        if (rc != IG_ECLOSED)
            IG_WARN("stream to the client of %s failed: %s", x->path, ig_strerror(rc));
        client_gone(x);
    }
}

/* ---- the first content token of a stream ------------------------------- */

/* 1 when the event ev[0..n) (without its blank line) carries a token; an
 * event that cannot be read for want of memory counts, so that nothing is
 * held back. */
static int event_is_token(const char *ev, size_t n)
{
    char small[2048], *data;
    size_t dlen;
    if (ig_sse_event_data(ev, n, small, sizeof(small), &data, &dlen) != 0)
        return 1;
    int token = data != NULL && ig_sse_payload_is_token(data, dlen);
    if (data != small)
        free(data);
    return token;
}

/* Checks the complete events gathered since the last call; 1 when one of
 * them carries a token. */
static int stream_has_token(attempt_t *a)
{
    const char *b = a->buf;
    size_t ev = a->scan; /* start of the event being read */
    size_t ls = ev;      /* start of the line being read */
    while (ls < a->blen) {
        const char *nl = memchr(b + ls, '\n', a->blen - ls);
        if (nl == NULL)
            break;
        size_t le = (size_t)(nl - b);
        size_t ll = le - ls;
        if (ll > 0 && b[le - 1] == '\r')
            ll--;
        if (ll == 0) { /* a blank line ends the event */
            if (ls > ev && event_is_token(b + ev, ls - ev))
                return 1;
            ev = le + 1;
        }
        ls = le + 1;
    }
    a->scan = ev;
    return 0;
}

/* ---- upstream callbacks ------------------------------------------------ */

static int retryable_status(int status)
{
    return status >= 500 || status == 429;
}

/* A site that answers 401 or 403 refused the gateway's credentials
 * (sites[].api_key), not the client's: the client was admitted at this door.
 * Passing that on would tell an authenticated client it is not, so it is the
 * site's failure: retried elsewhere, counted against the site, and a 502
 * naming the site if nothing else serves. */
static int site_refused(const attempt_t *a)
{
    return a->to_site && (a->status == 401 || a->status == 403);
}

/* The answer is not the client's to see: retry or fail over. */
static int attempt_unusable(const attempt_t *a)
{
    return retryable_status(a->status) || site_refused(a);
}

/* A 404 for an optional endpoint: this upstream does not serve it. */
static int attempt_lacks_endpoint(const attempt_t *a)
{
    return a->status == 404 && a->x->endpoint != 0;
}

/* An attempt failed before anything reached the client: retry elsewhere
 * if the budget allows, else answer with what went wrong. */
static void attempt_failed(attempt_t *a, int status, int err)
{
    exchange_t *x = a->x;
    ig_proxy_t *px = x->px;
    attempt_drop_body(a); /* a partial body dies with its attempt */
    x->last_status = status;
    x->last_err = err;
    if (a->retry_after[0])
        ig_str_copy(x->last_retry_after, sizeof(x->last_retry_after), a->retry_after);
    if (x->state != X_TRYING)
        return;
    if (attempts_live(x) > 0)
        return; /* the hedge is still running: let it answer */
    uint64_t now = uv_hrtime();
    const char *reason = err == IG_ECONNECT    ? "connect"
                         : err == IG_ETIMEDOUT ? "timeout"
                         : err != 0            ? "transport"
                         : status == 429       ? "429"
                         : status == 503       ? "503"
                         : status < 500        ? "auth"
                                               : "5xx";
    if (x->retries < px->router.opts.max_retries && ig_router_budget_take(&px->router, now)) {
        x->retries++;
        ig_metric_add(px->m_retries, 1, x->model, reason);
        IG_DEBUG("retrying %s for model %s after %s on %s", x->path, x->model, reason,
                 a->route->name);
        attempt_start(x, 0);
        return;
    }
    if (err == IG_ETIMEDOUT)
        exchange_fail(x, 504, "upstream_timeout", NULL, "upstream %s timed out", a->route->name);
    else if (err != 0)
        exchange_fail(x, 502, "upstream_unreachable", NULL, "upstream %s failed: %s",
                      a->route->name, ig_strerror(err));
    else if (status == 429)
        exchange_fail(x, 429, "queue_full", x->last_retry_after[0] ? x->last_retry_after : "1",
                      "every upstream for model '%s' is saturated; retry later", x->model);
    else if (status == 503)
        exchange_fail(x, 503, "unavailable", "1", "no upstream for model '%s' can serve now",
                      x->model);
    else if (status < 500)
        exchange_fail(x, 502, "upstream_auth", NULL,
                      "site %s refused this gateway's credentials (HTTP %d): check its "
                      "sites[].api_key",
                      a->route->name, status);
    else
        exchange_fail(x, 502, "upstream_error", NULL, "upstream %s answered %d", a->route->name,
                      status);
}

static void on_up_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                          const char *const *values, void *data)
{
    attempt_t *a = data;
    (void)r;
    a->status = status;
    for (int i = 0; i < n; i++) {
        if (strcasecmp(names[i], "content-type") == 0)
            ig_str_copy(a->content_type, sizeof(a->content_type), values[i]);
        else if (strcasecmp(names[i], "retry-after") == 0)
            ig_str_copy(a->retry_after, sizeof(a->retry_after), values[i]);
    }
    a->is_stream = strncasecmp(a->content_type, "text/event-stream", 17) == 0;
    /* Nothing is committed yet: a stream is committed by its first content
     * token, so that a hedge can still win a stream that stalls after its
     * headers (or its role delta); a whole answer when it is complete. */
}

static void ft_arm(exchange_t *x);

/* Makes a's stream the answer the client gets, at its first content token:
 * measures the TTFT, cancels the others, sends the headers and the events
 * held so far. */
static void commit_stream(exchange_t *x, attempt_t *a)
{
    ig_proxy_t *px = x->px;
    uint64_t now = uv_hrtime();
    a->first_token = 1;
    ig_router_observe_ttft(&px->router, a->route, a->uncached_tokens,
                           (double)(now - a->start_ns) / 1e9, a->predicted_wait, now);
    ig_router_observe_wait(&px->router, a->route, a->rif, (double)(now - a->start_ns) / 1e9, now);
    observe_ttft(px, x, a, now);
    /* A token is proof that the upstream works: a half-open trial is won. */
    ig_router_attempt_proven(&px->router, a->route, a->trial, now);
    a->trial = 0;
    commit_attempt(x, a);
    ft_arm(x);
    add_route_headers(x, a);
    int rc = client_stream_start(x, a->status, a->content_type);
    if (rc < 0 && rc != IG_EBUSY) {
        client_gone(x);
        return;
    }
    char *held = a->buf;
    size_t n = a->blen;
    a->buf = NULL;
    a->blen = a->bcap = a->scan = 0;
    if (n > 0)
        stream_out(x, a, held, n);
    free(held);
}

/* Appends a body piece to the attempt's buffer. 0, or -1 when the attempt
 * (and the exchange) failed. */
static int gather(attempt_t *a, const char *buf, size_t len)
{
    exchange_t *x = a->x;
    ig_proxy_t *px = x->px;
    if (a->blen + len > px->opts.max_response_bytes) {
        ig_upstream_cancel(a->ureq);
        a->ureq = NULL;
        attempt_drop_body(a);
        attempt_account(a, IG_OUTCOME_FAILURE, "oversize");
        exchange_fail(x, 502, "upstream_error", NULL, "upstream %s answered more than %zu bytes",
                      a->route->name, px->opts.max_response_bytes);
        return -1;
    }
    if (a->blen + len > a->bcap) {
        size_t cap = a->bcap ? a->bcap * 2 : 1024; /* from the thread cache */
        while (cap < a->blen + len)
            cap *= 2;
        char *nb = realloc(a->buf, cap);
        if (nb == NULL) {
            attempt_cancel(a);
            exchange_fail(x, 503, "out_of_memory", "1", "out of memory gathering the answer");
            return -1;
        }
        a->buf = nb;
        a->bcap = cap;
    }
    memcpy(a->buf + a->blen, buf, len);
    a->blen += len;
    return 0;
}

static void on_up_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    attempt_t *a = data;
    exchange_t *x = a->x;
    (void)r;
    if (x->committed == a) {
        stream_out(x, a, buf, len);
        return;
    }
    if (x->state != X_TRYING || attempt_unusable(a) || attempt_lacks_endpoint(a) || len == 0)
        return; /* decided elsewhere, or an error body we do not pass on */
    if (gather(a, buf, len) != 0)
        return;
    if (a->is_stream && (stream_has_token(a) || a->blen > x->px->opts.max_held_bytes))
        commit_stream(x, a);
}

static void sse_error(exchange_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Ends a stream that broke midway with an SSE error event. */
static void sse_error(exchange_t *x, const char *fmt, ...)
{
    ig_api_error_t e = {.status = 502, .type = "server_error", .code = "upstream_stream_broken"};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof(e.message), fmt, ap);
    va_end(ap);
    size_t n;
    char *frame = ig_api_error_sse(&e, &n);
    if (frame != NULL) {
        client_stream_write(x, frame, n);
        free(frame);
    }
    client_stream_end(x);
}

/* ---- the cost of an answer ----------------------------------------------- */

void ig_proxy_on_cost(ig_proxy_t *px, ig_proxy_cost_cb cb, void *data)
{
    px->on_cost = cb;
    px->on_cost_data = data;
}

/*
 * The committed attempt's answer is complete: its cost (NAN when the
 * upstream is unpriced) from its usage (the prompt estimate and the content
 * events where the answer carried none) and the time it held the upstream,
 * metered on the upstream and reported to the gateway. Written as
 * "x-infergate-cost: USD" (or "unknown") into buf.
 */
/* It shared the upstream with the others in flight when it began, and at
 * least C share it when fewer: its part of the paid time. */
static double attempt_sharers(const attempt_t *a)
{
    double conc = a->route->slots > 0 ? a->route->slots : ig_router_concurrency(a->route);
    return a->rif + 1 > conc ? a->rif + 1 : conc;
}

static void answer_cost(exchange_t *x, attempt_t *a, double held, uint64_t now, char *buf,
                        size_t cap)
{
    const ig_usage_meter_t *u = &x->usage;
    long long prompt = u->prompt >= 0 ? u->prompt : x->prompt_tokens;
    long long completion = u->completion >= 0 ? u->completion : u->events;
    ig_router_upstream_t *r = a->route;
    double usd = ig_cost_answer(&a->price, prompt, completion, held, attempt_sharers(a));
    ig_cost_meter_answer(&r->cost, usd, completion, now);
    if (x->px->on_cost != NULL)
        x->px->on_cost(x->px->on_cost_data, x->req, r->name, x->model, usd);
    /* The request's cost: its answer and the attempts that gave none. */
    if (isnan(usd) && x->spent == 0)
        snprintf(buf, cap, "unknown");
    else
        snprintf(buf, cap, "%.6g", (isnan(usd) ? 0 : usd) + x->spent);
}

/* An attempt ended without giving the answer (docs/routing.md, "Cost per
 * answer"): what it cost is charged to its upstream and the request's key,
 * and counts in the answer's x-infergate-cost. */
static void attempt_charge(attempt_t *a, ig_outcome_t outcome, const char *kind, uint64_t now)
{
    exchange_t *x = a->x;
    int quiet = a->status == 0 && (outcome == IG_OUTCOME_ABANDONED || strcmp(kind, "timeout") == 0);
    int taken = (a->status >= 200 && a->status < 300) || quiet;
    const ig_usage_meter_t *u = &x->usage;
    long long completion = x->committed != a ? 0 : u->completion >= 0 ? u->completion : u->events;
    double usd = ig_cost_attempt(&a->price, taken, x->prompt_tokens, completion,
                                 (double)(now - a->start_ns) / 1e9, attempt_sharers(a));
    if (!(usd > 0))
        return;
    ig_cost_meter_answer(&a->route->cost, usd, completion, now);
    x->spent += usd;
    if (x->px->on_cost != NULL)
        x->px->on_cost(x->px->on_cost_data, x->req, a->route->name, x->model, usd);
}

/* The end of a stream that was going to the client: its cost as a comment
 * event after it, or an SSE error when it broke midway. */
static void stream_done(attempt_t *a, int err, double held, uint64_t now)
{
    exchange_t *x = a->x;
    if (err == 0) {
        attempt_account(a, IG_OUTCOME_SUCCESS, "");
        ig_router_observe_done(&x->px->router, a->route, a->rif, held, now);
        /* The cost is known only now: a comment event after the stream,
         * which SSE parsers skip (docs/routing.md). */
        char cost[48], line[80];
        answer_cost(x, a, held, now, cost, sizeof(cost));
        int n = snprintf(line, sizeof(line), ": x-infergate-cost: %s\n\n", cost);
        client_stream_write(x, line, (size_t)n);
        client_stream_end(x);
    } else {
        attempt_account(a, IG_OUTCOME_FAILURE, "broken_stream");
        IG_WARN("upstream %s broke a stream midway: %s", a->route->name, ig_strerror(err));
        sse_error(x, "upstream %s failed mid-stream: %s", a->route->name, ig_strerror(err));
    }
    exchange_done(x);
}

static void on_up_done(ig_upstream_req_t *r, int err, void *data)
{
    attempt_t *a = data;
    exchange_t *x = a->x;
    ig_proxy_t *px = x->px;
    (void)r;
    a->ureq = NULL;
    uint64_t now = uv_hrtime();
    double held = (double)(now - a->start_ns) / 1e9;

    if (x->committed == a) {
        stream_done(a, err, held, now);
        return;
    }
    if (x->state != X_TRYING) {
        /* Lost a race that was already decided; it was canceled. */
        attempt_drop_body(a);
        return;
    }
    ft_arm(x);
    if (err != 0) {
        attempt_account(a, IG_OUTCOME_FAILURE, err == IG_ETIMEDOUT ? "timeout" : "transport");
        attempt_failed(a, 0, err);
        return;
    }
    if (attempt_lacks_endpoint(a)) {
        /* Not a failure of the upstream, and not the client's: it serves
         * the model but not this endpoint. Ask another, without spending
         * the retry budget (each such answer removes a candidate). */
        a->route->lacks |= x->endpoint;
        a->route->lacks_until_ns = now + LACKS_RECHECK_NS;
        x->lacked++;
        attempt_account(a, IG_OUTCOME_CLIENT_ERROR, "");
        attempt_drop_body(a);
        if (attempts_live(x) == 0)
            attempt_start(x, 0);
        return;
    }
    if (attempt_unusable(a)) {
        attempt_account(
            a, a->status == 429 || a->status == 503 ? IG_OUTCOME_BACKPRESSURE : IG_OUTCOME_FAILURE,
            a->status == 429   ? "429"
            : a->status == 503 ? "503"
            : a->status < 500  ? "auth"
                               : "5xx");
        attempt_failed(a, a->status, 0);
        return;
    }
    /* A whole answer (2xx, or a 4xx that is the client's), or a stream that
     * ended before any token: commit it as it is. */
    attempt_account(a, a->status < 400 ? IG_OUTCOME_SUCCESS : IG_OUTCOME_CLIENT_ERROR, "");
    if (a->status < 400) {
        ig_router_observe_done(&px->router, a->route, a->rif, held, now);
        observe_ttft(px, x, a, now);
        if (a->buf != NULL)
            ig_usage_body(&x->usage, a->buf, a->blen);
    }
    commit_attempt(x, a);
    add_route_headers(x, a);
    if (a->status < 400) {
        char cost[48];
        answer_cost(x, a, held, now, cost, sizeof(cost));
        if (x->req != NULL)
            ig_http_add_header(x->req, "x-infergate-cost", cost);
    }
    client_respond(x, a->status, a->content_type[0] ? a->content_type : "application/json",
                   a->buf ? a->buf : "", a->blen);
    attempt_drop_body(a);
    exchange_done(x);
}

/* ---- attempts ----------------------------------------------------------- */

static void on_hedge_timer(uv_timer_t *t);
static void on_queue_timer(uv_timer_t *t);
static void on_ft_timer(uv_timer_t *t);

static attempt_t *free_attempt(exchange_t *x)
{
    for (int i = 0; i < MAX_ATTEMPTS; i++) {
        if (x->att[i].ureq == NULL)
            return &x->att[i];
    }
    return NULL;
}

/* ---- the x-infergate-route header ----------------------------------------
 * Written for every request without printf: its float formatting was a
 * twentieth of the proxy's instructions per request. */

typedef struct {
    char *b;
    size_t n, cap; /* b holds n bytes and a NUL; what does not fit is cut */
} hdr_t;

static void hdr_mem(hdr_t *h, const char *s, size_t l)
{
    if (l > h->cap - 1 - h->n)
        l = h->cap - 1 - h->n;
    memcpy(h->b + h->n, s, l);
    h->n += l;
    h->b[h->n] = '\0';
}

static void hdr_str(hdr_t *h, const char *s)
{
    hdr_mem(h, s, strlen(s));
}

/* v in decimal, at least `width` digits (zeros in front). */
static void hdr_uint(hdr_t *h, unsigned long long v, int width)
{
    char d[24], *end = d + sizeof(d), *q = end;
    do {
        *--q = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0 || end - q < width);
    hdr_mem(h, q, (size_t)(end - q));
}

/* v with `decimals` digits after the point, as printf's %.Nf writes it
 * (but for a tie in the last digit, which may round the other way). */
static void hdr_fixed(hdr_t *h, double v, int decimals)
{
    static const double scale[] = {1, 10, 100, 1000, 10000};
    if (!isfinite(v) || fabs(v) >= 1e12 || decimals < 1 || decimals > 4) {
        char tmp[64];
        snprintf(tmp, sizeof(tmp), "%.*f", decimals, v);
        hdr_str(h, tmp);
        return;
    }
    if (signbit(v))
        hdr_str(h, "-");
    unsigned long long q = (unsigned long long)llround(fabs(v) * scale[decimals]);
    unsigned long long s = (unsigned long long)scale[decimals];
    hdr_uint(h, q / s, 1);
    hdr_str(h, ".");
    hdr_uint(h, q % s, decimals);
}

/* "; <p>cost=...; <p>wait=...; <p>concurrency=...; <p>prefix_tokens=..." */
static void route_fields(hdr_t *h, const char *p, double cost, double wait, double conc,
                         int prefix_tokens)
{
    static const char *const names[] = {"cost=", "wait=", "concurrency=", "prefix_tokens="};
    double v[] = {cost, wait, conc};
    for (int i = 0; i < 4; i++) {
        hdr_str(h, "; ");
        hdr_str(h, p);
        hdr_str(h, names[i]);
        if (i < 3)
            hdr_fixed(h, v[i], i == 2 ? 1 : 4);
        else if (prefix_tokens < 0) {
            hdr_str(h, "-");
            hdr_uint(h, (unsigned long long)-(long long)prefix_tokens, 1);
        } else
            hdr_uint(h, (unsigned long long)prefix_tokens, 1);
    }
}

/* The TTFT on u that only one request in a hundred should exceed
 * (ig_cost_ttft_bound()): its predicted TTFT and wait, and the requests
 * ahead that the wait counts (ours beyond its concurrency). */
static double ttft_bound(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                         uint64_t now)
{
    double ahead = u->inflight - ig_router_concurrency(u) + 1;
    return ig_cost_ttft_bound(ig_router_cost(r, u, prompt_tokens, now), ig_router_wait(r, u, now),
                              ahead);
}

/*
 * The cost objective over the latency pick d: the cheapest candidate whose
 * TTFT meets the SLO (the tighter of the proxy's and the request's) at
 * p99 by ttft_bound() becomes d's choice, the latency pick its runner-up.
 * When none is predicted to meet it, the latency pick stands, and so does
 * its exploration of the cheapest capacity (ig_cost_keeps_exploration()).
 * Returns the chosen's marginal cost (USD), the runner-up's in *runner
 * (NAN when there is none).
 */
static double cost_objective(ig_proxy_t *px, exchange_t *x, const ig_proxy_target_t *targets,
                             ig_router_upstream_t **states, const unsigned char *exclude, int n,
                             uint64_t now, ig_route_decision_t *d, double *runner)
{
    ig_price_t prices[MAX_TARGETS];
    double ttft[MAX_TARGETS];
    for (int i = 0; i < n; i++) {
        prices[i] = targets[i].price;
        ttft[i] = exclude[i] ? INFINITY : ttft_bound(&px->router, states[i], x->prompt_tokens, now);
    }
    *runner = NAN;
    if (d->explored && ig_cost_keeps_exploration(prices, exclude, n, d->chosen, x->prompt_tokens,
                                                 x->output_tokens))
        return ig_cost_marginal(&prices[d->chosen], x->prompt_tokens, x->output_tokens);
    double slo = px->opts.slo_ttft_s;
    if (x->slo_ttft_s > 0 && (slo <= 0 || x->slo_ttft_s < slo))
        slo = x->slo_ttft_s;
    int k =
        ig_cost_pick(prices, ttft, exclude, n, x->prompt_tokens, x->output_tokens, slo, d->chosen);
    if (k >= 0 && k != d->chosen) {
        d->runner_up = d->chosen;
        d->runner_up_cost_s = d->cost_s;
        d->runner_up_wait_s = d->wait_s;
        d->runner_up_concurrency = d->concurrency;
        d->chosen = k;
        d->cost_s = ig_router_cost(&px->router, states[k], x->prompt_tokens, now);
        d->wait_s = ig_router_wait(&px->router, states[k], now);
        d->concurrency = ig_router_concurrency(states[k]);
    }
    if (d->runner_up >= 0)
        *runner = ig_cost_marginal(&prices[d->runner_up], x->prompt_tokens, x->output_tokens);
    return ig_cost_marginal(&prices[d->chosen], x->prompt_tokens, x->output_tokens);
}

/* What one pick saw and chose: the upstreams of the request's model, how
 * they stand (ig_admit_mark), and the router's decision. */
typedef struct {
    ig_proxy_target_t targets[MAX_TARGETS];
    ig_router_upstream_t *states[MAX_TARGETS];
    unsigned char exclude[MAX_TARGETS];
    int n;
    uint64_t now; /* when it was made */
    int starting; /* an instance is on its way up */
    int lacking;  /* upstreams that lack the request's endpoint */
    ig_admit_view_t view;
    ig_route_decision_t d;
    double marginal;        /* the cost objective's marginal cost (NAN: not used) */
    double marginal_runner; /* and the runner-up's (NAN: none) */
    int cached;             /* prompt tokens the chosen upstream holds */
    int cached_runner;      /* and the runner-up */
} pick_t;

/* The routing trace: with IG_ROUTE_TRACE=PATH in the environment, every
 * pick of a prompt with block hashes appends a line to PATH.<pid>: what
 * each candidate's cost was made of and which one was chosen (a debugging
 * aid for cache-aware routing; docs/routing.md). NULL when off. */
static FILE *route_trace(void)
{
    static int opened;
    static FILE *f;
    if (!opened) {
        opened = 1;
        const char *path = getenv("IG_ROUTE_TRACE");
        if (path != NULL && path[0] != '\0') {
            char name[512];
            snprintf(name, sizeof(name), "%s.%ld", path, (long)uv_os_getpid());
            f = fopen(name, "a");
        }
    }
    return f;
}

static void trace_pick(ig_proxy_t *px, exchange_t *x, const pick_t *p, int rc)
{
    FILE *f = route_trace();
    if (f == NULL || x->prefix.hashes == NULL || x->prefix.nhashes == 0)
        return;
    fprintf(f, "{\"t\":%.6f,\"head\":\"%016llx\",\"tokens\":%d,\"rc\":%d", p->now / 1e9,
            (unsigned long long)x->prefix.hashes[0], x->prompt_tokens, rc);
    if (rc == 0)
        fprintf(f, ",\"chosen\":\"%s\",\"hot\":%d,\"explored\":%d", p->states[p->d.chosen]->name,
                p->d.hot, p->d.explored);
    ig_route_peers_t peers;
    ig_router_peers(&px->router, p->states, p->n, p->exclude, p->now, &peers);
    fprintf(f, ",\"peer_step\":%.4f,\"peer_unit\":%.6f,\"ups\":[", peers.step_s, peers.svc_unit_s);
    for (int i = 0; i < p->n; i++) {
        const ig_router_upstream_t *u = p->states[i];
        ig_route_terms_t t;
        ig_router_terms(&px->router, u, x->prompt_tokens, &peers, p->now, &t);
        fprintf(f,
                "%s{\"name\":\"%s\",\"excluded\":%d,\"cached\":%d,\"inflight\":%d,"
                "\"fresh\":%d,\"age\":%.4f,\"wait\":%.4f,\"aged\":%.4f,\"waiting\":%g,"
                "\"step\":%.4f,\"queue\":%.4f,\"prefill\":%.4f,\"cost\":%.4f,"
                "\"svc\":%.4f,\"svc_tokens\":%.1f}",
                i ? "," : "", u->name, p->exclude[i], u->cached_tokens, u->inflight, t.fresh,
                t.report_age_s, t.reported_wait_s, t.aged_wait_s, t.reported_waiting, t.step_s,
                t.queue_s, t.prefill_s, t.cost_s, u->svc_s, u->svc_tokens);
    }
    fputs("]}\n", f);
    fflush(f);
}

/* Resolves the request's upstreams and picks one: 0 with the decision in
 * p->d, or IG_ENOUPSTREAM when none may take it now. */
static int pick(exchange_t *x, pick_t *p)
{
    ig_proxy_t *px = x->px;
    unsigned char tried[MAX_TARGETS];
    p->starting = 0;
    p->lacking = 0;
    p->marginal = p->marginal_runner = NAN;
    int n = px->resolve(px->resolve_data, x->model, p->targets, MAX_TARGETS, &p->starting);
    uint64_t now = uv_hrtime();
    p->now = now;
    if (x->local_only) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (!p->targets[i].is_site)
                p->targets[k++] = p->targets[i];
        }
        n = k;
    }
    p->n = n;
    for (int i = 0; i < n; i++) {
        p->states[i] = p->targets[i].route;
        /* One that lacks the endpoint counts as tried: never picked. */
        int l = lacks(p->states[i], x->endpoint, now);
        tried[i] = (unsigned char)(was_tried(x, p->states[i]) || l);
        p->lacking += l;
    }
    ig_admit_mark(&px->router, p->states, n, tried, px->opts.max_inflight,
                  ig_proxy_queued_model(px, x->model), now, p->exclude, &p->view);
    ig_prefix_route_score(px->prefix_index, p->states, n, &x->prefix);
    int rc =
        n > 0 ? ig_router_pick(&px->router, p->states, n, x->prompt_tokens, p->exclude, now, &p->d)
              : IG_ENOUPSTREAM;
    if (rc == 0 && px->opts.objective_cost)
        p->marginal = cost_objective(px, x, p->targets, p->states, p->exclude, n, now, &p->d,
                                     &p->marginal_runner);
    trace_pick(px, x, p, rc);
    p->cached = rc == 0 ? p->states[p->d.chosen]->cached_tokens : 0;
    p->cached_runner =
        rc == 0 && p->d.runner_up >= 0 ? p->states[p->d.runner_up]->cached_tokens : 0;
    for (int i = 0; i < n; i++)
        p->states[i]->cached_tokens = 0; /* this request's view only */
    return rc;
}

/* Holds the exchange in its model's queue (a full queue sheds the newest
 * of the less urgent, or refuses this one with 429). */
static void queue_hold(exchange_t *x, uint64_t now)
{
    ig_proxy_t *px = x->px;
    model_queue_t *q = queue_of(px, x->model, 1);
    if (q != NULL && q->n >= px->opts.queue_size && !ig_list_empty(&q->waiting)) {
        /* Full: the newest of the least urgent makes room for a more
         * urgent one (shed first). */
        exchange_t *last = IG_LIST_DATA(q->waiting.prev, exchange_t, queue_node);
        if (last->priority > x->priority) {
            queue_remove(px, last);
            ig_metric_add(px->m_rejected, 1, last->model, "shed");
            exchange_fail(last, 429, "shed", "1",
                          "shed for more urgent requests of model '%s'; retry later", last->model);
        }
    }
    if (q == NULL || q->n >= px->opts.queue_size) {
        ig_metric_add(px->m_rejected, 1, x->model, "queue_full");
        exchange_fail(x, 429, "queue_full", "1",
                      "every upstream for model '%s' is saturated and %d requests are waiting; "
                      "retry later",
                      x->model, px->opts.queue_size);
        return;
    }
    x->state = X_QUEUED;
    if (x->queued_ns == 0)
        x->queued_ns = now;
    queue_push(px, q, x);
    /* Held, however it got here (on arrival, after a retry found everything
     * saturated, or put back by pump): the hold counts from the first time
     * it was queued. */
    uint64_t held_ms = (now - x->queued_ns) / 1000000ULL;
    uint64_t hold = x->max_queue_ms > 0 && x->max_queue_ms < px->opts.queue_timeout_ms
                        ? x->max_queue_ms
                        : px->opts.queue_timeout_ms;
    uint64_t left = held_ms < hold ? hold - held_ms : 1;
    uv_timer_start(&x->timer, on_queue_timer, left, 0);
}

/* A request no upstream took now: answered with its last failure, refused
 * (404 when none serves its endpoint, 503 when none is healthy), or held
 * in the queue when every one is saturated or one is starting. */
static void queue_or_fail(exchange_t *x, const pick_t *p)
{
    ig_proxy_t *px = x->px;
    ig_admit_verdict_t v = ig_admit_unplaced(&p->view, x->ntried > 0 && x->last_status != 0,
                                             x->last_err != 0 || x->last_status != 0, p->starting);
    if (v == IG_ADMIT_LAST_FAILURE) {
        /* Every upstream was tried: answer with the last failure. */
        x->retries = px->router.opts.max_retries;
        attempt_failed(&x->att[0], x->last_status, x->last_err);
        return;
    }
    if (p->view.eligible == 0 && (p->lacking > 0 || x->lacked > 0)) {
        ig_metric_add(px->m_rejected, 1, x->model, "endpoint_not_served");
        exchange_fail(x, 404, "endpoint_not_served", NULL, "no upstream for model '%s' serves %s",
                      x->model, x->path);
        return;
    }
    if (v == IG_ADMIT_QUEUE) {
        queue_hold(x, p->now);
        return;
    }
    ig_metric_add(px->m_rejected, 1, x->model, "no_upstream");
    exchange_fail(x, 503, "no_healthy_upstream", "1", "no healthy upstream serves model '%s' now",
                  x->model);
}

/* The x-infergate-route header of the primary attempt: the policy, the
 * decision's figures, the runner-up's, exploration and the cost objective. */
static void route_header(exchange_t *x, const pick_t *p)
{
    const ig_route_decision_t *d = &p->d;
    hdr_t h = {x->route_header, 0, sizeof(x->route_header)};
    hdr_str(&h, "policy=");
    hdr_str(&h, ig_route_policy_name(x->px->router.opts.policy));
    route_fields(&h, "", d->cost_s, d->wait_s, d->concurrency, p->cached);
    if (d->runner_up >= 0) {
        hdr_str(&h, "; runner_up=");
        hdr_str(&h, p->states[d->runner_up]->name);
        route_fields(&h, "runner_up_", d->runner_up_cost_s, d->runner_up_wait_s,
                     d->runner_up_concurrency, p->cached_runner);
    }
    if (d->explored)
        hdr_str(&h, "; explored=1");
    if (!isnan(p->marginal)) {
        char m[96];
        int k = snprintf(m, sizeof(m), "; objective=cost; marginal_usd=%.6g", p->marginal);
        if (d->runner_up >= 0 && !isnan(p->marginal_runner))
            snprintf(m + k, sizeof(m) - (size_t)k, "; runner_up_marginal_usd=%.6g",
                     p->marginal_runner);
        hdr_str(&h, m);
    }
}

/* Starts an attempt on the picked upstream: its state, the route header,
 * the decision's metrics, the router's accounting, the upstream request,
 * then its first-token deadline and the hedge timer. */
static void launch(exchange_t *x, int hedge, const pick_t *p)
{
    ig_proxy_t *px = x->px;
    uint64_t now = p->now;
    const ig_route_decision_t *d = &p->d;
    attempt_t *a = free_attempt(x);
    if (a == NULL)
        return;
    attempt_drop_body(a);
    memset(a, 0, sizeof(*a));
    a->x = x;
    a->hedge = hedge;
    a->route = p->targets[d->chosen].route;
    a->client = p->targets[d->chosen].client;
    int to_site = p->targets[d->chosen].is_site;
    a->to_site = to_site;
    a->price = p->targets[d->chosen].price;
    a->start_ns = now;
    a->predicted_wait = ig_router_wait(&px->router, a->route, now);
    a->uncached_tokens = x->prompt_tokens > p->cached ? x->prompt_tokens - p->cached : 1;
    ig_prefix_route_record(px->prefix_index, a->route, &x->prefix);
    if (x->ntried < MAX_TARGETS)
        x->tried[x->ntried++] = a->route;
    if (x->attempts++ == 0)
        x->sent_ns = now;
    x->state = X_TRYING;
    if (!hedge)
        route_header(x, p);
    IG_DEBUG("route %s model=%s prompt_tokens=%d -> %s (cost %.4fs%s%s) %s%s", x->path, x->model,
             x->prompt_tokens, a->route->name, d->cost_s, d->runner_up >= 0 ? ", runner-up " : "",
             d->runner_up >= 0 ? p->states[d->runner_up]->name : "", hedge ? "hedge" : "",
             d->hot ? " all hot" : "");
    ig_metric_add(px->m_decisions, 1, x->model, a->route->name,
                  ig_route_policy_name(px->router.opts.policy));
    if (d->explored)
        ig_metric_add(px->m_explorations, 1, a->route->name);
    a->rif = a->route->inflight;
    a->order = ig_router_order_begin(a->route, now);
    uint64_t changes_before = a->route->limit_changes;
    a->trial = ig_router_attempt_begin(&px->router, a->route, now);
    apply_limit(px, a, changes_before);

    static const ig_upstream_cbs_t cbs = {on_up_headers, on_up_body, on_up_done};
    int rc =
        ig_upstream_request(a->client, "POST", x->path,
                            to_site ? x->forwarded_header : "Content-Type: application/json\r\n",
                            x->body, x->len, &cbs, a, &a->ureq);
    if (rc != 0) {
        a->ureq = NULL;
        attempt_account(a, IG_OUTCOME_FAILURE, "transport");
        attempt_failed(a, 0, IG_ECONNECT);
        return;
    }
    if (x->stream && px->opts.first_token_timeout_ms > 0) {
        a->ft_deadline_ns = now + px->opts.first_token_timeout_ms * 1000000ULL;
        ft_arm(x);
    }
    if (!hedge && px->opts.hedge && x->stream && d->runner_up >= 0) {
        double delay = ig_router_hedge_delay(&px->router, a->route, x->prompt_tokens,
                                             px->opts.hedge_quantile, now);
        uv_timer_start(&x->timer, on_hedge_timer, (uint64_t)(delay * 1000) + 1, 0);
    }
}

/*
 * Picks an upstream and starts an attempt. When every candidate is
 * saturated the exchange is queued; when none is eligible it fails (or is
 * held while an instance starts). A hedge that finds no second upstream
 * does nothing.
 */
static void attempt_start(exchange_t *x, int hedge)
{
    pick_t p;
    if (pick(x, &p) == 0)
        launch(x, hedge, &p);
    else if (!hedge)
        queue_or_fail(x, &p);
}

static void on_hedge_timer(uv_timer_t *t)
{
    exchange_t *x = t->data;
    ig_proxy_t *px = x->px;
    /* Its first content token would have committed the stream. */
    if (x->state != X_TRYING || x->hedged || attempts_live(x) != 1)
        return;
    if (px->hedge_tokens < 1.0)
        return;
    px->hedge_tokens -= 1.0;
    x->hedged = 1;
    ig_metric_add(px->m_hedges, 1, x->model, "sent");
    attempt_start(x, 1);
}

/* Arms the first-token timer for the earliest deadline of the attempts
 * still waiting for their first token. */
static void ft_arm(exchange_t *x)
{
    uint64_t next = 0;
    for (int i = 0; i < MAX_ATTEMPTS; i++) {
        const attempt_t *a = &x->att[i];
        if (a->ureq != NULL && !a->first_token && a->ft_deadline_ns != 0 &&
            (next == 0 || a->ft_deadline_ns < next))
            next = a->ft_deadline_ns;
    }
    if (next == 0 || x->state == X_DONE) {
        uv_timer_stop(&x->ft_timer);
        return;
    }
    uint64_t now = uv_hrtime();
    uint64_t ms = next > now ? (next - now + 999999) / 1000000 : 0;
    uv_timer_start(&x->ft_timer, on_ft_timer, ms, 0);
}

/* An attempt whose first content token is later than first_token_timeout_ms
 * (its headers or a role delta may have come) fails with a timeout, which
 * is retried like any failure before the commit. */
static void on_ft_timer(uv_timer_t *t)
{
    exchange_t *x = t->data;
    uint64_t now = uv_hrtime();
    for (int i = 0; i < MAX_ATTEMPTS && x->state == X_TRYING; i++) {
        attempt_t *a = &x->att[i];
        if (a->ureq == NULL || a->first_token || a->ft_deadline_ns == 0 || a->ft_deadline_ns > now)
            continue;
        IG_WARN("upstream %s: no first token within %llu ms", a->route->name,
                (unsigned long long)x->px->opts.first_token_timeout_ms);
        ig_upstream_cancel(a->ureq);
        a->ureq = NULL;
        attempt_account(a, IG_OUTCOME_FAILURE, "timeout");
        attempt_failed(a, 0, IG_ETIMEDOUT);
    }
    if (x->state == X_TRYING)
        ft_arm(x);
}

static void on_queue_timer(uv_timer_t *t)
{
    exchange_t *x = t->data;
    if (x->state != X_QUEUED)
        return;
    queue_remove(x->px, x);
    ig_metric_add(x->px->m_rejected, 1, x->model, "queue_timeout");
    exchange_fail(
        x, 503, "queue_timeout", "1",
        "no upstream for model '%s' could take the request within %llu ms", x->model,
        (unsigned long long)(x->max_queue_ms > 0 && x->max_queue_ms < x->px->opts.queue_timeout_ms
                                 ? x->max_queue_ms
                                 : x->px->opts.queue_timeout_ms));
}

/* Takes held requests of a model off its queue while upstreams have room. */
static void pump(ig_proxy_t *px, const char *model)
{
    model_queue_t *q = queue_of(px, model, 0);
    int guard = q ? q->n : 0;
    while (q != NULL && !ig_list_empty(&q->waiting) && guard-- > 0) {
        exchange_t *x = QUEUE_HEAD(q);
        queue_remove(px, x);
        x->state = X_TRYING;
        attempt_start(x, 0);
        if (x->state == X_QUEUED)
            break; /* still saturated: it went back to the tail; stop here */
    }
}

void ig_proxy_kick(ig_proxy_t *px, const char *model)
{
    pump(px, model);
}

/* ---- the exchange ------------------------------------------------------- */

static void proxy_maybe_free(ig_proxy_t *px)
{
    if (!px->closing || px->live > 0)
        return;
    void (*cb)(void *) = px->close_cb;
    void *data = px->close_data;
    ig_list_t *it, *tmp;
    IG_LIST_FOREACH_SAFE(it, tmp, &px->queues)
    {
        free(QUEUE_OF(it)->model);
        free(QUEUE_OF(it));
    }
    ig_prefix_index_free(px->prefix_index);
    free(px);
    if (cb != NULL)
        cb(data);
}

static void on_exchange_closed(uv_handle_t *h)
{
    exchange_t *x = h->data;
    ig_proxy_t *px = x->px;
    if (--x->open_handles > 0)
        return;
    for (int i = 0; i < MAX_ATTEMPTS; i++)
        attempt_drop_body(&x->att[i]);
    free(x->model);
    free(x->path);
    free(x->body);
    free(x->prefix_hashes);
    free(x);
    px->live--;
    proxy_maybe_free(px);
}

/* The client's request is finished (x->req is NULL); account, and free
 * once the timers are closed (a later loop turn: never under a caller). */
static void exchange_done(exchange_t *x)
{
    ig_proxy_t *px = x->px;
    if (x->state == X_DONE)
        return;
    x->state = X_DONE;
    ig_metric_observe(px->m_e2e, seconds_since(x->start_ns), x->model);
    ig_usage_end(&x->usage, &px->m_usage, x->model, x->prompt_tokens);
    px->inflight--;
    uv_close((uv_handle_t *)&x->timer, on_exchange_closed);
    uv_close((uv_handle_t *)&x->ft_timer, on_exchange_closed);
    /* An attempt ended: a held request may fit now. */
    if (!px->closing)
        pump(px, x->model);
}

static void exchange_fail(exchange_t *x, int status, const char *code, const char *retry_after,
                          const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cancel_others(x, NULL);
    if (x->req != NULL && retry_after != NULL)
        ig_http_add_header(x->req, "Retry-After", retry_after);
    if (x->req != NULL && x->route_header[0])
        ig_http_add_header(x->req, "x-infergate-route", x->route_header);
    client_error(x, status, NULL, code, msg);
    exchange_done(x);
}

void ig_proxy_handle(ig_proxy_t *px, ig_http_req_t *req, const ig_proxy_call_t *call)
{
    exchange_t *x = malloc(sizeof(*x));
    if (x == NULL) {
        ig_api_respond_oom(req);
        return;
    }
    memset(x, 0, offsetof(exchange_t, tried));
    x->route_header[0] = '\0';
    x->px = px;
    x->req = req;
    ig_usage_init(&x->usage);
    x->model = strdup(call->model);
    x->path = strdup(call->path);
    x->endpoint = endpoint_of(call->path);
    x->body = malloc(call->len + 1);
    if (x->model == NULL || x->path == NULL || x->body == NULL) {
        free(x->model);
        free(x->path);
        free(x->body);
        free(x);
        ig_api_respond_oom(req);
        return;
    }
    memcpy(x->body, call->body, call->len);
    x->body[call->len] = '\0';
    x->len = call->len;
    x->stream = call->stream;
    x->prompt_tokens = call->prompt_tokens;
    x->local_only = call->local_only;
    x->prefix.prompt_tokens = call->prompt_tokens;
    x->prefix.block_size = call->block_size;
    if (call->prefix_hashes && call->nprefix > 0 &&
        (x->prefix_hashes = malloc(sizeof(uint64_t) * (size_t)call->nprefix)) != NULL) {
        memcpy(x->prefix_hashes, call->prefix_hashes, sizeof(uint64_t) * (size_t)call->nprefix);
        x->prefix.hashes = x->prefix_hashes;
        x->prefix.nhashes = call->nprefix;
    }
    if (call->session_id && call->session_id[0]) {
        x->prefix.has_session = 1;
        x->prefix.session = ig_prefix_seed(call->session_id);
    }
    x->priority = call->priority;
    x->max_queue_ms = call->max_queue_ms;
    x->output_tokens = call->output_tokens;
    x->slo_ttft_s = call->slo_ttft_s;
    static const char fwd[] = "Content-Type: application/json\r\nx-infergate-forwarded: ";
    size_t n = sizeof(fwd) - 1;
    memcpy(x->forwarded_header, fwd, n);
    n += ig_str_copy(x->forwarded_header + n, sizeof(x->forwarded_header) - n - 2,
                     call->region ? call->region : "1");
    memcpy(x->forwarded_header + n, "\r\n", 3);
    x->start_ns = ig_http_req_start_ns(req);
    uv_timer_init(px->loop, &x->timer);
    x->timer.data = x;
    uv_timer_init(px->loop, &x->ft_timer);
    x->ft_timer.data = x;
    x->open_handles = 2;
    px->inflight++;
    px->live++;
    if (px->closing) {
        exchange_fail(x, 503, "shutting_down", "1", "the gateway is shutting down");
        return;
    }
    uint64_t now = uv_hrtime();
    ig_router_budget_deposit(&px->router, now);
    px->hedge_tokens += px->opts.hedge_budget;
    if (px->hedge_tokens > 10)
        px->hedge_tokens = 10;
    ig_http_req_on_abort(req, on_client_abort, x);
    ig_http_req_on_drain(req, on_client_drain, x);
    attempt_start(x, 0);
}

void ig_proxy_close(ig_proxy_t *px, void (*cb)(void *data), void *data)
{
    px->closing = 1;
    px->close_cb = cb;
    px->close_data = data;
    ig_list_t *it;
    IG_LIST_FOREACH(it, &px->queues)
    {
        model_queue_t *q = QUEUE_OF(it);
        while (!ig_list_empty(&q->waiting)) {
            exchange_t *x = QUEUE_HEAD(q);
            queue_remove(px, x);
            exchange_fail(x, 503, "shutting_down", "1", "the gateway is shutting down");
        }
    }
    proxy_maybe_free(px);
}
