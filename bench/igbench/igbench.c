/*
 * igbench: an open-loop (or closed-loop) load generator for OpenAI-style
 * HTTP endpoints, streaming-aware, free of coordinated omission.
 *
 * Open loop: arrivals are scheduled in advance (constant or Poisson at
 * --rate) and every latency counts from the SCHEDULED send time. When all
 * connections are busy a new one is opened (up to --max-connections), and
 * beyond that requests wait in a queue, keeping their scheduled time; so a
 * stalled target shows in the tail instead of silently slowing the arrivals.
 * Closed loop (--concurrency N) is there to compare against: N users that
 * each send the next request when the previous one ends, latency from the
 * actual send.
 *
 * Arrivals and timeouts run on a timerfd queue (bench/lib/benchutil.h) to
 * send within tens of µs of the schedule; libuv timers have a 1 ms grain.
 *
 * Long (about 1,500 lines) but in the order of one request and one run:
 * the workload, the connections and the HTTP/SSE reader, dispatch and the
 * schedule, the report, then the command line and main. The pieces the other
 * bench tools share live in bench/lib/benchutil.h.
 */
#include "../lib/benchutil.h"
#include "hdr.h"

#include <jansson.h>
#include <llhttp.h>

#include <ctype.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>

/* ------------------------------------------------------------------------- */
/* Configuration                                                             */
/* ------------------------------------------------------------------------- */

typedef enum { EP_COMPLETIONS, EP_CHAT, EP_RAW } endpoint_t;

static struct {
    const char *target_str;
    igb_addr_t addr;
    char host_header[520];
    int allow_remote;
    double rate;
    int poisson;
    int concurrency; /* > 0: closed loop */
    double duration_s;
    long long max_requests;
    double warmup_s;
    unsigned long long seed;
    double timeout_s;
    int max_connections;
    endpoint_t endpoint;
    int input_tokens;
    const char *max_tokens_spec;
    igb_dist_t max_tokens;
    int stream;
    const char *model;
    const char *raw_method, *raw_path;
    char *raw_body;
    size_t raw_body_len;
    double slo_ttft_ms, slo_tpot_ms, slo_e2e_ms; /* 0: not set */
    const char *json_path;
    const char *label;
    int quiet;
    int progress;        /* the one-line progress display: a terminal, not --quiet */
    char model_buf[256]; /* the model found in the target's /v1/models */
} cfg;

/* ------------------------------------------------------------------------- */
/* State                                                                     */
/* ------------------------------------------------------------------------- */

typedef struct conn_s conn_t;

typedef struct breq_s {
    igb_link_t qlink; /* in S.queue while it waits for a connection */
    conn_t *c;
    uint64_t id;
    uint64_t sched;  /* scheduled send time (ns) */
    uint64_t sent;   /* actual send time */
    uint64_t origin; /* what latencies count from: sched (open) or sent (closed) */
    uint64_t first_token, last_token;
    int measured;
    int ntok;          /* token events seen */
    long usage_tokens; /* from a usage object, -1 when none */
    double cost;       /* the gateway's x-infergate-cost (USD), NAN when none or unknown */
    int status;
    int sse;
    int done_seen;
    int retried; /* resent once after a reused connection closed under it */
    size_t rx_bytes;
    char *payload;
    size_t payload_len;
    char *buf; /* partial SSE line, or the whole body of a non-streamed answer */
    size_t buf_len, buf_cap;
    char hname[64];
    size_t hname_len;
    char hval[128];
    size_t hval_len;
    igb_tq_entry_t timeout;
} breq_t;

struct conn_s {
    igb_stream_t u;
    uv_connect_t creq;
    llhttp_t parser;
    breq_t *req;
    conn_t *next_idle;
    igb_link_t all_link; /* in S.all */
    int connected;
    int closing;
    int completed; /* requests completed on this connection */
};

#define MAX_ERR_KINDS 32

static struct {
    uv_loop_t *loop;
    igb_tq_t tq;
    llhttp_settings_t settings;
    igb_rng_t rng_arrival, rng_work;
    igb_tq_entry_t arrival;
    uint64_t t0, t_end_sched, warmup_end;
    uint64_t next_arrival;
    int generating;
    long long issued;
    long long inflight;
    igb_link_t queue; /* breq_t.qlink: requests waiting for a connection */
    long long qlen, qmax;
    conn_t *idle;
    igb_link_t all; /* conn_t.all_link: every open connection */
    int nconns, peak_conns;
    long long conns_opened;
    long long retries;
    /* figures over measured requests */
    igb_hdr_t e2e, ttft, itl, tpot, lag;
    long long measured_sent, ok, good, out_tokens;
    double cost_usd;                 /* x-infergate-cost of the measured answers */
    long long priced, priced_tokens; /* answers with a cost, and their output tokens */
    uint64_t last_done;
    struct {
        char name[32];
        long long n;
    } errs[MAX_ERR_KINDS];
    int nerr_kinds;
    long long errors;
    int stopping;
    int finished;
} S;

static void dispatch(breq_t *r);
static void maybe_finish(void);
static void issue_closed(void);

/* ------------------------------------------------------------------------- */
/* Request payloads                                                          */
/* ------------------------------------------------------------------------- */

static const char *const vocab[] = {
    "time",   "river",  "light",  "stone",  "market", "window", "garden", "number", "signal",
    "paper",  "engine", "silver", "forest", "bridge", "letter", "winter", "cloud",  "orange",
    "doctor", "planet", "yellow", "camera", "spring", "travel", "animal", "circle", "island",
    "button", "memory", "theory", "battle", "coffee", "mirror", "rocket", "school", "summer",
    "tunnel", "violin", "wonder", "answer", "basket", "candle", "dinner", "energy", "family",
    "guitar", "hammer", "jacket", "kitten", "ladder", "museum", "needle", "office", "pencil",
    "quartz", "rabbit", "saddle", "ticket", "useful", "valley", "walnut", "zipper", "anchor",
};

static char *make_prompt(int ntok)
{
    size_t cap = (size_t)ntok * 8 + 16, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[0] = 0;
    for (int i = 0; i < ntok; i++) {
        const char *w = vocab[igb_rng_next(&S.rng_work) % (sizeof(vocab) / sizeof(vocab[0]))];
        len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? " " : "", w);
    }
    return s;
}

/* Builds the HTTP request bytes of one request. 0 or -1 (out of memory). */
static int build_payload(breq_t *r)
{
    const char *method = "POST", *path;
    char *body = NULL;
    size_t body_len = 0;
    int owned = 0;
    if (cfg.endpoint == EP_RAW) {
        method = cfg.raw_method;
        path = cfg.raw_path;
        body = cfg.raw_body;
        body_len = cfg.raw_body_len;
    } else {
        path = cfg.endpoint == EP_CHAT ? "/v1/chat/completions" : "/v1/completions";
        long mt = lround(igb_dist_sample(&cfg.max_tokens, &S.rng_work));
        if (mt < 1)
            mt = 1;
        char *prompt = make_prompt(cfg.input_tokens);
        if (!prompt)
            return -1;
        json_t *root = json_object();
        json_object_set_new(root, "model", json_string(cfg.model));
        if (cfg.endpoint == EP_CHAT) {
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("user"));
            json_object_set_new(msg, "content", json_string(prompt));
            json_t *msgs = json_array();
            json_array_append_new(msgs, msg);
            json_object_set_new(root, "messages", msgs);
        } else {
            json_object_set_new(root, "prompt", json_string(prompt));
        }
        free(prompt);
        json_object_set_new(root, "max_tokens", json_integer(mt));
        json_object_set_new(root, "ignore_eos", json_true());
        if (cfg.stream) {
            json_object_set_new(root, "stream", json_true());
            json_t *so = json_object();
            json_object_set_new(so, "include_usage", json_true());
            json_object_set_new(root, "stream_options", so);
        }
        body = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        if (!body)
            return -1;
        body_len = strlen(body);
        owned = 1;
    }
    int has_body = body != NULL || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0;
    char hdr[1024];
    int n = snprintf(hdr, sizeof(hdr),
                     "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: igbench/" IG_VERSION "\r\n"
                     "Accept: %s\r\n",
                     method, path, cfg.host_header,
                     cfg.stream ? "text/event-stream" : "application/json, */*");
    if (has_body)
        n += snprintf(hdr + n, sizeof(hdr) - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    n += snprintf(hdr + n, sizeof(hdr) - (size_t)n, "\r\n");
    r->payload_len = (size_t)n + body_len;
    r->payload = malloc(r->payload_len);
    if (r->payload) {
        memcpy(r->payload, hdr, (size_t)n);
        if (body_len)
            memcpy(r->payload + n, body, body_len);
    }
    if (owned)
        free(body);
    return r->payload ? 0 : -1;
}

/* ------------------------------------------------------------------------- */
/* Outcomes                                                                  */
/* ------------------------------------------------------------------------- */

static void count_error(const char *kind)
{
    S.errors++;
    for (int i = 0; i < S.nerr_kinds; i++) {
        if (strcmp(S.errs[i].name, kind) == 0) {
            S.errs[i].n++;
            return;
        }
    }
    if (S.nerr_kinds < MAX_ERR_KINDS) {
        snprintf(S.errs[S.nerr_kinds].name, sizeof(S.errs[0].name), "%s", kind);
        S.errs[S.nerr_kinds++].n = 1;
    }
}

static void req_free(breq_t *r)
{
    igb_tq_remove(&S.tq, &r->timeout);
    free(r->payload);
    free(r->buf);
    free(r);
}

static void queue_remove(breq_t *r)
{
    if (!igb_link_linked(&r->qlink))
        return;
    igb_list_remove(&r->qlink);
    S.qlen--;
}

/* The request waiting longest for a connection, NULL when none. */
static breq_t *queue_head(void)
{
    igb_link_t *l = igb_list_first(&S.queue);
    return l ? IGB_CONTAINER_OF(l, breq_t, qlink) : NULL;
}

/* The oldest open connection, NULL when none. */
static conn_t *all_first(void)
{
    igb_link_t *l = igb_list_first(&S.all);
    return l ? IGB_CONTAINER_OF(l, conn_t, all_link) : NULL;
}

/* Ends a request: records it (when measured) and frees it. kind is NULL for
 * a success, else the error kind. */
static void req_end(breq_t *r, const char *kind)
{
    uint64_t now = uv_hrtime();
    if (r->measured) {
        if (kind) {
            count_error(kind);
        } else {
            uint64_t e2e = now - r->origin;
            igb_hdr_record(&S.e2e, e2e / 1000);
            long out = r->usage_tokens >= 0 ? r->usage_tokens : r->ntok;
            double ttft_ms = (double)e2e / 1e6, tpot_ms = 0;
            if (r->sse && r->ntok > 0) {
                uint64_t ttft = r->first_token - r->origin;
                ttft_ms = (double)ttft / 1e6;
                igb_hdr_record(&S.ttft, ttft / 1000);
                if (out > 1) {
                    double tpot = (double)(e2e - ttft) / (double)(out - 1);
                    tpot_ms = tpot / 1e6;
                    igb_hdr_record(&S.tpot, (uint64_t)(tpot / 1000.0));
                }
            }
            if (out > 0)
                S.out_tokens += out;
            if (!isnan(r->cost)) {
                S.cost_usd += r->cost;
                S.priced++;
                S.priced_tokens += out > 0 ? out : 0;
            }
            S.ok++;
            int good = (!cfg.slo_e2e_ms || (double)e2e / 1e6 <= cfg.slo_e2e_ms) &&
                       (!cfg.slo_ttft_ms || ttft_ms <= cfg.slo_ttft_ms) &&
                       (!cfg.slo_tpot_ms || tpot_ms <= cfg.slo_tpot_ms);
            S.good += good;
        }
        if (now > S.last_done)
            S.last_done = now;
    }
    if (r->c && r->c->req == r)
        r->c->req = NULL;
    queue_remove(r);
    req_free(r);
    S.inflight--;
    if (cfg.concurrency > 0)
        issue_closed();
    maybe_finish();
}

/* ------------------------------------------------------------------------- */
/* Connections                                                               */
/* ------------------------------------------------------------------------- */

static void idle_remove(conn_t *c)
{
    conn_t **pp = &S.idle;
    while (*pp && *pp != c)
        pp = &(*pp)->next_idle;
    if (*pp)
        *pp = c->next_idle;
    c->next_idle = NULL;
}

static void on_conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    free(c);
    maybe_finish();
}

static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    idle_remove(c);
    igb_list_remove(&c->all_link);
    S.nconns--;
    uv_close(&c->u.h, on_conn_closed);
}

/* Fails the request on c (if any) with kind, closes c, and lets queued
 * requests find another connection. */
static void conn_fail(conn_t *c, const char *kind)
{
    breq_t *r = c->req;
    c->req = NULL;
    conn_close(c);
    if (r) {
        r->c = NULL;
        req_end(r, kind);
    }
    breq_t *q;
    while ((q = queue_head()) && S.nconns < cfg.max_connections && !S.stopping) {
        queue_remove(q);
        dispatch(q);
        if (igb_link_linked(&q->qlink))
            break;
    }
}

typedef struct {
    uv_write_t w;
    uv_buf_t buf;
    char data[];
} wreq_t;

static void on_written(uv_write_t *w, int status)
{
    free(w);
}

static void conn_send(conn_t *c, breq_t *r)
{
    c->req = r;
    r->c = c;
    r->sent = uv_hrtime();
    if (cfg.concurrency > 0)
        r->origin = r->sent;
    else if (r->measured)
        igb_hdr_record(&S.lag, (r->sent - r->sched) / 1000);
    wreq_t *wr = malloc(sizeof(*wr) + r->payload_len);
    if (!wr) {
        conn_fail(c, "client");
        return;
    }
    memcpy(wr->data, r->payload, r->payload_len);
    wr->buf = uv_buf_init(wr->data, (unsigned)r->payload_len);
    int rc = uv_write(&wr->w, &c->u.s, &wr->buf, 1, on_written);
    if (rc != 0) {
        free(wr);
        conn_fail(c, c->completed ? "closed" : "connect");
    }
}

/* The request on c is done and the connection may serve another one. */
static void conn_release(conn_t *c)
{
    breq_t *q = queue_head();
    if (q && !S.stopping) {
        queue_remove(q);
        conn_send(c, q);
        return;
    }
    c->next_idle = S.idle;
    S.idle = c;
}

/* ---- response parsing ---- */

static void on_token(breq_t *r)
{
    uint64_t now = uv_hrtime();
    if (r->ntok == 0)
        r->first_token = now;
    else if (r->measured)
        igb_hdr_record(&S.itl, (now - r->last_token) / 1000);
    r->last_token = now;
    r->ntok++;
}

static int nonempty_str(json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0;
}

/* One SSE data payload. Returns 0, or -1 when it is not valid JSON. */
static int on_sse_data(breq_t *r, const char *data, size_t len)
{
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        r->done_seen = 1;
        return 0;
    }
    json_error_t err;
    json_t *root = json_loadb(data, len, 0, &err);
    if (!root)
        return -1;
    json_t *usage = json_object_get(root, "usage");
    json_t *ct = json_object_get(usage, "completion_tokens");
    if (json_is_integer(ct))
        r->usage_tokens = (long)json_integer_value(ct);
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    if (choice) {
        json_t *delta = json_object_get(choice, "delta");
        if (nonempty_str(json_object_get(choice, "text")) ||
            nonempty_str(json_object_get(delta, "content")) ||
            nonempty_str(json_object_get(delta, "reasoning_content")))
            on_token(r);
    }
    json_decref(root);
    return 0;
}

static int buf_append(breq_t *r, const char *at, size_t len)
{
    return igb_buf_append(&r->buf, &r->buf_len, &r->buf_cap, at, len, 64u << 20);
}

/* Feeds SSE bytes: complete lines are handled, a partial one stays in buf.
 * Events here carry one data line each (as every OpenAI-style server sends). */
/* A cost as infergate writes it ("1.25e-05" or "unknown"): USD or NAN. */
static double parse_cost(const char *s, size_t n)
{
    char tmp[64];
    if (n == 0 || n >= sizeof(tmp))
        return NAN;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    char *end;
    double v = strtod(tmp, &end);
    return end != tmp && *end == '\0' && v >= 0 ? v : NAN;
}

static int sse_feed(breq_t *r, const char *at, size_t len)
{
    if (buf_append(r, at, len) != 0)
        return -1;
    size_t start = 0;
    for (size_t i = 0; i < r->buf_len; i++) {
        if (r->buf[i] != '\n')
            continue;
        size_t end = i;
        if (end > start && r->buf[end - 1] == '\r')
            end--;
        const char *line = r->buf + start;
        size_t ll = end - start;
        /* infergate's cost of a stream: a comment after its last event */
        static const char cost[] = ": x-infergate-cost: ";
        if (ll > sizeof(cost) - 1 && memcmp(line, cost, sizeof(cost) - 1) == 0)
            r->cost = parse_cost(line + sizeof(cost) - 1, ll - (sizeof(cost) - 1));
        if (ll >= 5 && memcmp(line, "data:", 5) == 0) {
            line += 5;
            ll -= 5;
            if (ll && *line == ' ') {
                line++;
                ll--;
            }
            if (on_sse_data(r, line, ll) != 0)
                return -1;
        }
        start = i + 1;
    }
    memmove(r->buf, r->buf + start, r->buf_len - start);
    r->buf_len -= start;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    breq_t *r = ((conn_t *)p->data)->req;
    if (!r)
        return -1;
    /* Names longer than the buffer are cut: only short ones matter here. */
    if (r->hname_len + len >= sizeof(r->hname))
        len = sizeof(r->hname) - 1 - r->hname_len;
    memcpy(r->hname + r->hname_len, at, len);
    r->hname_len += len;
    r->hname[r->hname_len] = 0;
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    breq_t *r = ((conn_t *)p->data)->req;
    if (!r)
        return -1;
    if (r->hval_len + len >= sizeof(r->hval))
        len = sizeof(r->hval) - 1 - r->hval_len;
    memcpy(r->hval + r->hval_len, at, len);
    r->hval_len += len;
    r->hval[r->hval_len] = 0;
    return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    breq_t *r = ((conn_t *)p->data)->req;
    if (strcasecmp(r->hname, "content-type") == 0 &&
        strncasecmp(r->hval, "text/event-stream", 17) == 0)
        r->sse = 1;
    if (strcasecmp(r->hname, "x-infergate-cost") == 0)
        r->cost = parse_cost(r->hval, r->hval_len);
    r->hname_len = r->hval_len = 0;
    r->hname[0] = r->hval[0] = 0;
    return 0;
}

static int on_headers_complete(llhttp_t *p)
{
    breq_t *r = ((conn_t *)p->data)->req;
    r->status = p->status_code;
    /* A response to HEAD has headers only, whatever Content-Length says. */
    return cfg.endpoint == EP_RAW && strcmp(cfg.raw_method, "HEAD") == 0 ? 1 : 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    breq_t *r = ((conn_t *)p->data)->req;
    if (r->status / 100 != 2)
        return 0;
    if (r->sse)
        return sse_feed(r, at, len);
    if (cfg.endpoint == EP_RAW)
        return 0;
    return buf_append(r, at, len);
}

static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    breq_t *r = c->req;
    if (!r)
        return -1;
    const char *kind = NULL;
    char kbuf[32];
    if (r->status / 100 != 2) {
        snprintf(kbuf, sizeof(kbuf), "http_%d", r->status);
        kind = kbuf;
    } else if (r->sse) {
        if (r->buf_len && sse_feed(r, "\n", 1) != 0)
            kind = "parse";
        else if (!r->done_seen)
            kind = "broken_stream";
    } else if (cfg.endpoint != EP_RAW) {
        json_error_t err;
        json_t *root = json_loadb(r->buf ? r->buf : "", r->buf_len, 0, &err);
        json_t *ct = json_object_get(json_object_get(root, "usage"), "completion_tokens");
        if (!root)
            kind = "parse";
        else if (json_is_integer(ct))
            r->usage_tokens = (long)json_integer_value(ct);
        json_decref(root);
    }
    int keep = llhttp_should_keep_alive(p) && !S.stopping;
    c->req = NULL;
    r->c = NULL;
    c->completed++;
    /* Free the connection first, so that a closed-loop user that sends its
     * next request from req_end() finds it idle. */
    if (keep)
        conn_release(c);
    else
        conn_close(c);
    req_end(r, kind);
    return keep ? 0 : HPE_PAUSED;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (c->closing)
        return;
    if (nread < 0) {
        breq_t *r = c->req;
        if (r && r->rx_bytes && llhttp_finish(&c->parser) == HPE_OK && !c->req)
            return; /* the close ended a body that ran to EOF */
        r = c->req;
        if (!r) {
            conn_close(c);
            return;
        }
        if (!r->rx_bytes && c->completed && !r->retried && !S.stopping) {
            /* The server closed an idle keep-alive connection as the request
             * went out: it never saw it. Resend once on another connection;
             * the latency still counts from the scheduled time. */
            c->req = NULL;
            r->c = NULL;
            r->retried = 1;
            S.retries++;
            conn_close(c);
            dispatch(r);
            return;
        }
        conn_fail(c, r->rx_bytes ? "broken_stream" : (c->completed ? "closed" : "connect"));
        return;
    }
    if (nread == 0)
        return;
    if (!c->req) {
        /* Bytes nobody asked for: the connection is out of step. */
        conn_close(c);
        return;
    }
    c->req->rx_bytes += (size_t)nread;
    llhttp_errno_t e = llhttp_execute(&c->parser, buf->base, (size_t)nread);
    if (e == HPE_PAUSED || e == HPE_OK)
        return;
    if (!c->closing)
        conn_fail(c, "parse");
}

static void on_connect(uv_connect_t *creq, int status)
{
    conn_t *c = creq->data;
    if (c->closing)
        return;
    if (status < 0) {
        conn_fail(c, "connect");
        return;
    }
    c->connected = 1;
    if (c->u.h.type == UV_TCP)
        uv_tcp_nodelay(&c->u.tcp, 1);
    uv_read_start(&c->u.s, igb_on_alloc, on_read);
    breq_t *r = c->req;
    c->req = NULL;
    if (r)
        conn_send(c, r);
    else
        conn_release(c);
}

static int conn_open(breq_t *r)
{
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return -1;
    int rc;
    if (cfg.addr.is_unix) {
        rc = uv_pipe_init(S.loop, &c->u.pipe, 0);
    } else {
        rc = uv_tcp_init(S.loop, &c->u.tcp);
    }
    if (rc != 0) {
        free(c);
        return -1;
    }
    c->u.h.data = c;
    c->creq.data = c;
    llhttp_init(&c->parser, HTTP_RESPONSE, &S.settings);
    c->parser.data = c;
    c->req = r;
    r->c = c;
    igb_list_push(&S.all, &c->all_link);
    S.nconns++;
    S.conns_opened++;
    if (S.nconns > S.peak_conns)
        S.peak_conns = S.nconns;
    if (cfg.addr.is_unix) {
        uv_pipe_connect(&c->creq, &c->u.pipe, cfg.addr.path, on_connect);
    } else {
        rc = uv_tcp_connect(&c->creq, &c->u.tcp, (struct sockaddr *)&cfg.addr.ss, on_connect);
        if (rc != 0) {
            c->req = NULL;
            r->c = NULL;
            conn_close(c);
            return -1;
        }
    }
    return 0;
}

static void on_timeout(igb_tq_entry_t *e)
{
    breq_t *r = (breq_t *)((char *)e - offsetof(breq_t, timeout));
    if (r->c) {
        conn_fail(r->c, "timeout");
    } else {
        req_end(r, "timeout");
    }
}

/* Sends r on an idle connection, a new one, or queues it. */
static void dispatch(breq_t *r)
{
    if (S.idle) {
        conn_t *c = S.idle;
        S.idle = c->next_idle;
        c->next_idle = NULL;
        conn_send(c, r);
        return;
    }
    if (S.nconns < cfg.max_connections && conn_open(r) == 0)
        return;
    if (S.nconns == 0 && igb_list_empty(&S.queue)) {
        req_end(r, "connect");
        return;
    }
    igb_list_push(&S.queue, &r->qlink);
    S.qlen++;
    if (S.qlen > S.qmax)
        S.qmax = S.qlen;
}

/* ------------------------------------------------------------------------- */
/* Arrivals                                                                  */
/* ------------------------------------------------------------------------- */

static breq_t *new_request(uint64_t sched)
{
    breq_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    igb_tq_entry_init(&r->timeout);
    r->id = (uint64_t)S.issued++;
    r->sched = r->origin = sched;
    r->usage_tokens = -1;
    r->cost = NAN;
    r->measured = sched >= S.warmup_end;
    if (r->measured)
        S.measured_sent++;
    if (build_payload(r) != 0) {
        free(r);
        return NULL;
    }
    S.inflight++;
    igb_tq_add(&S.tq, &r->timeout, sched + (uint64_t)(cfg.timeout_s * 1e9), on_timeout);
    return r;
}

static int budget_left(uint64_t t)
{
    if (cfg.max_requests > 0 && S.issued >= cfg.max_requests)
        return 0;
    if (cfg.duration_s > 0 && t >= S.t_end_sched)
        return 0;
    return !S.stopping;
}

static void issue_closed(void)
{
    while (S.inflight < cfg.concurrency && budget_left(uv_hrtime())) {
        breq_t *r = new_request(uv_hrtime());
        if (!r)
            break;
        dispatch(r);
    }
    if (!budget_left(uv_hrtime()))
        S.generating = 0;
}

static uint64_t interarrival_ns(void)
{
    double mean = 1e9 / cfg.rate;
    return (uint64_t)(cfg.poisson ? igb_rng_exp(&S.rng_arrival, mean) : mean);
}

static void on_arrival(igb_tq_entry_t *e)
{
    uint64_t now = uv_hrtime();
    /* Catch up on every arrival already due, each with its own scheduled time. */
    while (S.next_arrival <= now && budget_left(S.next_arrival)) {
        breq_t *r = new_request(S.next_arrival);
        S.next_arrival += interarrival_ns();
        if (r)
            dispatch(r);
    }
    if (budget_left(S.next_arrival)) {
        igb_tq_add(&S.tq, &S.arrival, S.next_arrival, on_arrival);
    } else {
        S.generating = 0;
        maybe_finish();
    }
}

static void stop_all(void)
{
    S.stopping = 1;
    igb_tq_remove(&S.tq, &S.arrival);
    S.generating = 0;
    breq_t *r;
    while ((r = queue_head())) {
        queue_remove(r);
        req_end(r, "canceled");
    }
    conn_t *c;
    while ((c = all_first())) {
        if (c->req)
            conn_fail(c, "canceled");
        else
            conn_close(c);
    }
}

static void maybe_finish(void)
{
    if (S.generating || S.inflight > 0)
        return;
    if (!S.finished) {
        S.finished = 1;
        S.stopping = 1;
        conn_t *c;
        while ((c = all_first()))
            conn_close(c);
        igb_tq_close(&S.tq);
    }
}

static void on_signal(uv_signal_t *s, int signum)
{
    fprintf(stderr, "igbench: interrupted, reporting what was measured\n");
    uv_close((uv_handle_t *)s, NULL);
    stop_all();
    maybe_finish();
}

/* ------------------------------------------------------------------------- */
/* Progress: one line on a terminal, redrawn every second                    */
/* ------------------------------------------------------------------------- */

static uv_timer_t progress_timer;

static void progress_draw(void)
{
    double t = (double)(uv_hrtime() - S.t0) / 1e9;
    char p50[32] = "-", p99[32] = "-";
    if (S.e2e.total) {
        snprintf(p50, sizeof(p50), "%.1f ms", igb_hdr_quantile(&S.e2e, 0.5) / 1e3);
        snprintf(p99, sizeof(p99), "%.1f ms", igb_hdr_quantile(&S.e2e, 0.99) / 1e3);
    }
    /* \r and erase-to-end-of-line: the line is redrawn in place. */
    printf("\r%6.1f s  sent %lld  ok %lld  errors %lld  p50 %s  p99 %s\033[K", t < 0 ? 0 : t,
           S.issued, S.ok, S.errors, p50, p99);
    fflush(stdout);
}

static void on_progress(uv_timer_t *t)
{
    (void)t;
    progress_draw();
}

static void progress_start(void)
{
    if (!cfg.progress)
        return;
    uv_timer_init(S.loop, &progress_timer);
    uv_timer_start(&progress_timer, on_progress, 1000, 1000);
    uv_unref((uv_handle_t *)&progress_timer); /* the run ends without it */
}

/* Clears the line before the report takes the terminal. */
static void progress_stop(void)
{
    if (!cfg.progress)
        return;
    uv_timer_stop(&progress_timer);
    uv_close((uv_handle_t *)&progress_timer, NULL);
    printf("\r\033[K");
    fflush(stdout);
}

/* ------------------------------------------------------------------------- */
/* Report                                                                    */
/* ------------------------------------------------------------------------- */

static json_t *hist_json(const igb_hdr_t *h)
{
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)h->total));
    json_object_set_new(o, "mean", json_real(igb_hdr_mean(h) / 1e3));
    json_object_set_new(o, "min", json_real(h->total ? (double)h->min / 1e3 : 0));
    json_object_set_new(o, "p50", json_real(igb_hdr_quantile(h, 0.50) / 1e3));
    /* The p50's 95% interval by batch means (hdr.h): absent where the
     * values were not kept in order or are too few for the batches. */
    double lo, hi;
    if (igb_hdr_p50_interval(h, &lo, &hi) == 0) {
        json_object_set_new(o, "p50_lo", json_real(lo / 1e3));
        json_object_set_new(o, "p50_hi", json_real(hi / 1e3));
    }
    json_object_set_new(o, "p90", json_real(igb_hdr_quantile(h, 0.90) / 1e3));
    json_object_set_new(o, "p99", json_real(igb_hdr_quantile(h, 0.99) / 1e3));
    json_object_set_new(o, "p99.9", json_real(igb_hdr_quantile(h, 0.999) / 1e3));
    json_object_set_new(o, "max", json_real(igb_hdr_quantile(h, 1.0) / 1e3));
    return o;
}

static void print_row(const char *name, const igb_hdr_t *h)
{
    if (!h->total) {
        printf("  %-6s %8s\n", name, "-");
        return;
    }
    printf("  %-6s %8llu %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f\n", name, (unsigned long long)h->total,
           igb_hdr_mean(h) / 1e3, igb_hdr_quantile(h, 0.5) / 1e3, igb_hdr_quantile(h, 0.9) / 1e3,
           igb_hdr_quantile(h, 0.99) / 1e3, igb_hdr_quantile(h, 0.999) / 1e3,
           igb_hdr_quantile(h, 1.0) / 1e3);
}

static int report(void)
{
    double window = S.last_done > S.warmup_end ? (double)(S.last_done - S.warmup_end) / 1e9 : 0;
    double thr = window > 0 ? (double)S.ok / window : 0;
    double goodput = window > 0 ? (double)S.good / window : 0;
    double tps = window > 0 ? (double)S.out_tokens / window : 0;
    const char *ep = cfg.endpoint == EP_RAW    ? cfg.raw_path
                     : cfg.endpoint == EP_CHAT ? "/v1/chat/completions"
                                               : "/v1/completions";
    if (!cfg.quiet) {
        if (cfg.concurrency > 0)
            printf("igbench: closed loop, concurrency %d", cfg.concurrency);
        else
            printf("igbench: open loop, %s arrivals at %.2f req/s",
                   cfg.poisson ? "poisson" : "constant", cfg.rate);
        printf(", target %s %s %s%s\n", cfg.target_str,
               cfg.endpoint == EP_RAW ? cfg.raw_method : "POST", ep, cfg.stream ? " (stream)" : "");
        printf("requests: %lld issued, %lld measured, %lld ok, %lld errors", S.issued,
               S.measured_sent, S.ok, S.errors);
        for (int i = 0; i < S.nerr_kinds; i++)
            printf("%s%s=%lld", i ? " " : " (", S.errs[i].name, S.errs[i].n);
        printf("%s\n", S.nerr_kinds ? ")" : "");
        printf("window %.3f s: throughput %.2f req/s, goodput %.2f req/s, output %.1f tok/s\n",
               window, thr, goodput, tps);
        if (S.priced > 0)
            printf("cost: $%.6g over %lld priced answers (x-infergate-cost), $%.6g per 1M output "
                   "tokens\n",
                   S.cost_usd, S.priced,
                   S.priced_tokens > 0 ? S.cost_usd / (double)S.priced_tokens * 1e6 : 0.0);
        printf("connections: %lld opened, peak %d open; peak queue %lld; %lld resent after an "
               "idle close\n",
               S.conns_opened, S.peak_conns, S.qmax, S.retries);
        printf("  %-6s %8s %9s %9s %9s %9s %9s %9s  (ms)\n", "metric", "count", "mean", "p50",
               "p90", "p99", "p99.9", "max");
        print_row("e2e", &S.e2e);
        print_row("ttft", &S.ttft);
        print_row("itl", &S.itl);
        print_row("tpot", &S.tpot);
        print_row("lag", &S.lag);
    }
    if (!cfg.json_path)
        return 0;
    json_t *root = json_object();
    json_t *p = json_object();
    json_object_set_new(p, "target", json_string(cfg.target_str));
    json_object_set_new(p, "mode", json_string(cfg.concurrency > 0 ? "closed" : "open"));
    json_object_set_new(p, "rate", json_real(cfg.rate));
    json_object_set_new(p, "arrival", json_string(cfg.poisson ? "poisson" : "constant"));
    json_object_set_new(p, "concurrency", json_integer(cfg.concurrency));
    json_object_set_new(p, "duration_s", json_real(cfg.duration_s));
    json_object_set_new(p, "requests", json_integer(cfg.max_requests));
    json_object_set_new(p, "warmup_s", json_real(cfg.warmup_s));
    json_object_set_new(p, "seed", json_integer((json_int_t)cfg.seed));
    json_object_set_new(p, "timeout_s", json_real(cfg.timeout_s));
    json_object_set_new(p, "max_connections", json_integer(cfg.max_connections));
    json_object_set_new(p, "endpoint",
                        json_string(cfg.endpoint == EP_RAW    ? "raw"
                                    : cfg.endpoint == EP_CHAT ? "chat"
                                                              : "completions"));
    json_object_set_new(p, "method", json_string(cfg.endpoint == EP_RAW ? cfg.raw_method : "POST"));
    json_object_set_new(p, "path", json_string(ep));
    json_object_set_new(p, "input_tokens", json_integer(cfg.input_tokens));
    json_object_set_new(p, "max_tokens", json_string(cfg.max_tokens_spec));
    json_object_set_new(p, "stream", json_boolean(cfg.stream));
    json_object_set_new(p, "model", json_string(cfg.model));
    json_t *slo = json_object();
    if (cfg.slo_ttft_ms)
        json_object_set_new(slo, "ttft_ms", json_real(cfg.slo_ttft_ms));
    if (cfg.slo_tpot_ms)
        json_object_set_new(slo, "tpot_ms", json_real(cfg.slo_tpot_ms));
    if (cfg.slo_e2e_ms)
        json_object_set_new(slo, "e2e_ms", json_real(cfg.slo_e2e_ms));
    json_object_set_new(p, "slo", slo);
    if (cfg.label)
        json_object_set_new(p, "label", json_string(cfg.label));
    json_object_set_new(root, "params", p);
    json_t *rq = json_object();
    json_object_set_new(rq, "issued", json_integer(S.issued));
    json_object_set_new(rq, "measured", json_integer(S.measured_sent));
    json_object_set_new(rq, "ok", json_integer(S.ok));
    json_object_set_new(rq, "good", json_integer(S.good));
    json_object_set_new(rq, "errors", json_integer(S.errors));
    json_object_set_new(root, "requests", rq);
    json_t *errs = json_object();
    for (int i = 0; i < S.nerr_kinds; i++)
        json_object_set_new(errs, S.errs[i].name, json_integer(S.errs[i].n));
    json_object_set_new(root, "errors", errs);
    json_object_set_new(root, "window_s", json_real(window));
    json_object_set_new(root, "throughput_rps", json_real(thr));
    json_object_set_new(root, "goodput_rps", json_real(goodput));
    json_object_set_new(root, "output_tokens", json_integer(S.out_tokens));
    json_object_set_new(root, "output_tokens_per_s", json_real(tps));
    if (S.priced > 0) {
        json_object_set_new(root, "cost_usd", json_real(S.cost_usd));
        json_object_set_new(root, "priced_answers", json_integer(S.priced));
        if (S.priced_tokens > 0)
            json_object_set_new(root, "cost_per_1m_output_tokens",
                                json_real(S.cost_usd / (double)S.priced_tokens * 1e6));
    }
    json_t *cn = json_object();
    json_object_set_new(cn, "opened", json_integer(S.conns_opened));
    json_object_set_new(cn, "peak_open", json_integer(S.peak_conns));
    json_object_set_new(cn, "peak_queue", json_integer(S.qmax));
    json_object_set_new(cn, "resent_after_idle_close", json_integer(S.retries));
    json_object_set_new(root, "connections", cn);
    json_t *lat = json_object();
    json_object_set_new(lat, "e2e", hist_json(&S.e2e));
    json_object_set_new(lat, "ttft", hist_json(&S.ttft));
    json_object_set_new(lat, "itl", hist_json(&S.itl));
    json_object_set_new(lat, "tpot", hist_json(&S.tpot));
    /* How late each request left against its schedule (open loop): the
     * generator's own error, included in the figures above. */
    json_object_set_new(lat, "send_lag", hist_json(&S.lag));
    json_object_set_new(root, "latency_ms", lat);
    int rc = json_dump_file(root, cfg.json_path, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (rc != 0) {
        fprintf(stderr, "igbench: cannot write %s\n", cfg.json_path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Command line                                                              */
/* ------------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: igbench --target URL (--rate R | --concurrency N) [options]\n"
            "\n"
            "Load generator for OpenAI-style HTTP endpoints. Open loop (--rate) counts\n"
            "every latency from the request's scheduled send time, so stalls are not\n"
            "hidden (no coordinated omission); closed loop (--concurrency) from the send.\n"
            "\n"
            "target:\n"
            "  --target URL           http://HOST:PORT, HOST:PORT or unix:PATH (alias --url)\n"
            "  --allow-remote         allow targets outside 127.0.0.0/8 and ::1\n"
            "load:\n"
            "  --rate R               open loop: R requests/s\n"
            "  --arrival KIND         poisson (default) or constant\n"
            "  --concurrency N        closed loop: N requests in flight\n"
            "  --duration S           send for S seconds (default 10 unless --requests)\n"
            "  --requests N           send N requests in all (warm-up ones included)\n"
            "  --warmup S             requests scheduled in the first S seconds are not counted\n"
            "  --seed N               seed for arrivals, prompts and lengths (default 1)\n"
            "  --timeout S            per-request timeout from its scheduled time (default 30)\n"
            "  --max-connections N    open loop: keep-alive connections at most (default 1024)\n"
            "workload:\n"
            "  --endpoint E           completions (default) or chat\n"
            "  --input-tokens N       prompt of about N tokens (N seeded words; default 32)\n"
            "  --max-tokens SPEC      N | uniform:A:B | exp:MEAN | choice:A@W,B@W (default 16)\n"
            "  --stream               ask for SSE streaming (stream_options.include_usage)\n"
            "  --model NAME           model field (default: the first id of the target's\n"
            "                         GET /v1/models, else \"test\")\n"
            "  --raw METHOD PATH      any request instead (e.g. --raw GET /health)\n"
            "  --body FILE | --body-string S   body of a raw request (sent as JSON)\n"
            "report:\n"
            "  --slo ttft=MS,tpot=MS,e2e=MS    goodput counts requests meeting all given SLOs\n"
            "  --json FILE            write every figure and the parameters as JSON\n"
            "  --label TEXT           a label stored in the JSON parameters\n"
            "  --spin-us US           wake this early and spin, for precise timing (default 200)\n"
            "  --quiet                no table and no progress line on stdout\n"
            "\n"
            "On a terminal a progress line (sent, ok, errors, e2e p50 and p99) is redrawn\n"
            "every second; it is off when stdout is not a terminal, or with --quiet.\n"
            "\n"
            "Figures (ms): e2e; ttft = first non-empty token event (streams only);\n"
            "itl = gaps between token events; tpot = (e2e - ttft) / (output tokens - 1),\n"
            "output tokens from the usage object when given, else the token events.\n"
            "Quantiles come from a log-linear histogram (0.1%% buckets, 1 µs - 100 s).\n"
            "Errors by kind: connect, closed, timeout, http_<status>, broken_stream, parse.\n"
            "Exit status: 0 when the run completed (errors are figures), 1 on failure,\n"
            "2 on bad usage.\n");
}

static int parse_slo(const char *s)
{
    char *copy = strdup(s), *save = NULL;
    int rc = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            rc = -1;
            break;
        }
        *eq = 0;
        double v = atof(eq + 1);
        if (v <= 0)
            rc = -1;
        else if (!strcmp(tok, "ttft"))
            cfg.slo_ttft_ms = v;
        else if (!strcmp(tok, "tpot"))
            cfg.slo_tpot_ms = v;
        else if (!strcmp(tok, "e2e"))
            cfg.slo_e2e_ms = v;
        else
            rc = -1;
    }
    free(copy);
    return rc;
}

static int read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)(n > 0 ? n : 1));
    *len = (size_t)(n > 0 ? n : 0);
    int ok = *out && fread(*out, 1, *len, f) == *len;
    fclose(f);
    return ok ? 0 : -1;
}

static int parse_target(const char *t)
{
    char buf[512];
    if (strncmp(t, "http://", 7) == 0)
        t += 7;
    else if (strstr(t, "://"))
        return -1; /* https and others: not supported */
    snprintf(buf, sizeof(buf), "%s", t);
    if (strncmp(buf, "unix:", 5) != 0) {
        char *slash = strchr(buf, '/');
        if (slash)
            *slash = 0;
        if (!strchr(buf, ':') || (buf[0] == '[' && !strstr(buf, "]:")))
            strncat(buf, ":80", sizeof(buf) - strlen(buf) - 1);
        snprintf(cfg.host_header, sizeof(cfg.host_header), "%s", buf);
    } else {
        snprintf(cfg.host_header, sizeof(cfg.host_header), "localhost");
    }
    return igb_addr_parse(buf, &cfg.addr);
}

/* The first model id of GET /v1/models of the target, into cfg.model_buf:
 * 0, or -1 with the reason in why. One blocking request before the run,
 * 5 s at most. */
typedef struct {
    char *body;
    size_t len;
    int done;
} models_reply_t;

static int models_on_body(llhttp_t *p, const char *at, size_t len)
{
    models_reply_t *m = p->data;
    if (m->len + len > (1u << 20))
        return -1;
    char *nb = realloc(m->body, m->len + len + 1);
    if (nb == NULL)
        return -1;
    memcpy(nb + m->len, at, len);
    m->len += len;
    nb[m->len] = '\0';
    m->body = nb;
    return 0;
}

static int models_on_complete(llhttp_t *p)
{
    ((models_reply_t *)p->data)->done = 1;
    return 0;
}

static int discover_model(char *why, size_t wlen)
{
    int fd = socket(cfg.addr.is_unix ? AF_UNIX : cfg.addr.ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(why, wlen, "socket: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_un un;
    const struct sockaddr *sa = (const struct sockaddr *)&cfg.addr.ss;
    socklen_t salen = cfg.addr.ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                        : sizeof(struct sockaddr_in);
    if (cfg.addr.is_unix) {
        memset(&un, 0, sizeof(un));
        un.sun_family = AF_UNIX;
        snprintf(un.sun_path, sizeof(un.sun_path), "%s", cfg.addr.path);
        sa = (const struct sockaddr *)&un;
        salen = sizeof(un);
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, sa, salen) != 0) {
        snprintf(why, wlen, "connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    char req[700];
    int n = snprintf(req, sizeof(req),
                     "GET /v1/models HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\n"
                     "Connection: close\r\n\r\n",
                     cfg.host_header);
    if (write(fd, req, (size_t)n) != n) {
        snprintf(why, wlen, "send: %s", strerror(errno));
        close(fd);
        return -1;
    }
    llhttp_settings_t st;
    llhttp_settings_init(&st);
    st.on_body = models_on_body;
    st.on_message_complete = models_on_complete;
    llhttp_t parser;
    llhttp_init(&parser, HTTP_RESPONSE, &st);
    models_reply_t m = {NULL, 0, 0};
    parser.data = &m;
    char buf[16384];
    ssize_t got;
    int bad = 0;
    while (!m.done && !bad && (got = read(fd, buf, sizeof(buf))) > 0)
        bad = llhttp_execute(&parser, buf, (size_t)got) != HPE_OK;
    if (!m.done && !bad)
        bad = llhttp_finish(&parser) != HPE_OK || !m.done;
    close(fd);
    int rc = -1;
    if (bad) {
        snprintf(why, wlen, "no complete HTTP answer");
    } else if (parser.status_code != 200) {
        snprintf(why, wlen, "status %d", parser.status_code);
    } else {
        json_t *root = json_loadb(m.body ? m.body : "", m.len, 0, NULL);
        const char *id = json_string_value(
            json_object_get(json_array_get(json_object_get(root, "data"), 0), "id"));
        if (id == NULL || id[0] == '\0' || strlen(id) >= sizeof(cfg.model_buf)) {
            snprintf(why, wlen, "no model id in data[0].id");
        } else {
            snprintf(cfg.model_buf, sizeof(cfg.model_buf), "%s", id);
            rc = 0;
        }
        json_decref(root);
    }
    free(m.body);
    return rc;
}

int main(int argc, char **argv)
{
    double spin_us = 200;
    cfg.seed = 1;
    cfg.timeout_s = 30;
    cfg.max_connections = 1024;
    cfg.input_tokens = 32;
    cfg.max_tokens_spec = "16";
    cfg.model = NULL; /* the target's first model, else "test" */
    cfg.poisson = 1;
    igb_list_init(&S.queue);
    igb_list_init(&S.all);
    igb_opts_t o;
    igb_opts_init(&o, "igbench", argc, argv, usage);
    int more;
    while ((more = igb_opts_next(&o)) > 0) {
        const char *a = o.opt, *v = NULL;
        if (!strcmp(a, "--target") || !strcmp(a, "--url")) {
            IGB_NEED(&o, v);
            cfg.target_str = v;
        } else if (!strcmp(a, "--allow-remote")) {
            cfg.allow_remote = 1;
        } else if (!strcmp(a, "--rate")) {
            IGB_NEED(&o, v);
            cfg.rate = atof(v);
        } else if (!strcmp(a, "--arrival")) {
            int k = igb_opt_choice(&o, "poisson|constant");
            if (k < 0)
                return 2;
            cfg.poisson = k == 0;
        } else if (!strcmp(a, "--concurrency")) {
            IGB_NEED(&o, v);
            cfg.concurrency = atoi(v);
        } else if (!strcmp(a, "--duration")) {
            IGB_NEED(&o, v);
            cfg.duration_s = atof(v);
        } else if (!strcmp(a, "--requests")) {
            IGB_NEED(&o, v);
            cfg.max_requests = atoll(v);
        } else if (!strcmp(a, "--warmup")) {
            IGB_NEED(&o, v);
            cfg.warmup_s = atof(v);
        } else if (!strcmp(a, "--seed")) {
            IGB_NEED(&o, v);
            cfg.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--timeout")) {
            IGB_NEED(&o, v);
            cfg.timeout_s = atof(v);
        } else if (!strcmp(a, "--max-connections")) {
            IGB_NEED(&o, v);
            cfg.max_connections = atoi(v);
        } else if (!strcmp(a, "--endpoint")) {
            int k = igb_opt_choice(&o, "completions|chat");
            if (k < 0)
                return 2;
            cfg.endpoint = k == 0 ? EP_COMPLETIONS : EP_CHAT;
        } else if (!strcmp(a, "--input-tokens")) {
            IGB_NEED(&o, v);
            cfg.input_tokens = atoi(v);
        } else if (!strcmp(a, "--max-tokens")) {
            IGB_NEED(&o, v);
            cfg.max_tokens_spec = v;
        } else if (!strcmp(a, "--stream")) {
            cfg.stream = 1;
        } else if (!strcmp(a, "--model")) {
            IGB_NEED(&o, v);
            cfg.model = v;
        } else if (!strcmp(a, "--raw")) {
            if (o.i + 2 >= argc) {
                fprintf(stderr, "igbench: --raw METHOD PATH\n");
                return 2;
            }
            cfg.endpoint = EP_RAW;
            cfg.raw_method = argv[++o.i];
            cfg.raw_path = argv[++o.i];
        } else if (!strcmp(a, "--body")) {
            IGB_NEED(&o, v);
            if (read_file(v, &cfg.raw_body, &cfg.raw_body_len) != 0) {
                fprintf(stderr, "igbench: cannot read %s\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--body-string")) {
            IGB_NEED(&o, v);
            cfg.raw_body = strdup(v);
            cfg.raw_body_len = strlen(v);
        } else if (!strcmp(a, "--slo")) {
            IGB_NEED(&o, v);
            if (parse_slo(v) != 0) {
                fprintf(stderr, "igbench: bad --slo '%s' (ttft=MS,tpot=MS,e2e=MS)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--json")) {
            IGB_NEED(&o, v);
            cfg.json_path = v;
        } else if (!strcmp(a, "--label")) {
            IGB_NEED(&o, v);
            cfg.label = v;
        } else if (igb_opt_shared(&o, &spin_us, &cfg.quiet) != 0) {
            return 2;
        }
    }
    if (more < 0)
        return 0;
    if (!cfg.target_str) {
        fprintf(stderr, "igbench: --target is required (see --help)\n");
        return 2;
    }
    if (parse_target(cfg.target_str) != 0) {
        fprintf(stderr, "igbench: bad target '%s'\n", cfg.target_str);
        return 2;
    }
    if (!igb_addr_is_local(&cfg.addr) && !cfg.allow_remote) {
        fprintf(stderr, "igbench: %s is not a loopback address; pass --allow-remote to load it\n",
                cfg.target_str);
        return 2;
    }
    if ((cfg.rate > 0) == (cfg.concurrency > 0)) {
        fprintf(stderr, "igbench: give exactly one of --rate R (open loop) or --concurrency N\n");
        return 2;
    }
    if (cfg.raw_body && cfg.endpoint != EP_RAW) {
        fprintf(stderr, "igbench: --body/--body-string go with --raw\n");
        return 2;
    }
    if (cfg.endpoint == EP_RAW && cfg.stream) {
        /* A raw request may still be answered with SSE; it is parsed as such. */
    }
    if (igb_dist_parse(cfg.max_tokens_spec, &cfg.max_tokens) != 0) {
        fprintf(stderr, "igbench: bad --max-tokens '%s'\n", cfg.max_tokens_spec);
        return 2;
    }
    if (cfg.duration_s <= 0 && cfg.max_requests <= 0)
        cfg.duration_s = 10;
    if (cfg.timeout_s <= 0 || cfg.max_connections < 1 || cfg.input_tokens < 0 || cfg.warmup_s < 0) {
        fprintf(stderr, "igbench: --timeout, --max-connections, --input-tokens, --warmup out of "
                        "range\n");
        return 2;
    }
    if (cfg.concurrency > 0 && cfg.max_connections < cfg.concurrency)
        cfg.max_connections = cfg.concurrency;
    if (cfg.model == NULL && cfg.endpoint != EP_RAW) {
        char why[256];
        if (discover_model(why, sizeof(why)) == 0) {
            cfg.model = cfg.model_buf;
            if (!cfg.quiet)
                fprintf(stderr, "igbench: --model %s (the first of %s/v1/models)\n", cfg.model,
                        cfg.target_str);
        } else {
            cfg.model = "test";
            fprintf(stderr, "igbench: GET /v1/models of %s: %s; --model defaults to \"test\"\n",
                    cfg.target_str, why);
        }
    } else if (cfg.model == NULL) {
        cfg.model = "test";
    }
    cfg.progress = !cfg.quiet && isatty(STDOUT_FILENO);

    signal(SIGPIPE, SIG_IGN);
    S.loop = uv_default_loop();
    igb_rng_init(&S.rng_arrival, cfg.seed);
    igb_rng_init(&S.rng_work, cfg.seed ^ 0xA5A5A5A5ull);
    if (igb_hdr_init(&S.e2e) || igb_hdr_init(&S.ttft) || igb_hdr_init(&S.itl) ||
        igb_hdr_init(&S.tpot) || igb_hdr_init(&S.lag)) {
        fprintf(stderr, "igbench: out of memory\n");
        return 1;
    }
    igb_hdr_keep_order(&S.e2e);
    igb_hdr_keep_order(&S.ttft);
    llhttp_settings_init(&S.settings);
    S.settings.on_header_field = on_header_field;
    S.settings.on_header_value = on_header_value;
    S.settings.on_header_value_complete = on_header_value_complete;
    S.settings.on_headers_complete = on_headers_complete;
    S.settings.on_body = on_body;
    S.settings.on_message_complete = on_message_complete;
    int rc = igb_tq_start(S.loop, &S.tq);
    S.tq.spin_ns = (uint64_t)(spin_us * 1000);
    if (rc != 0) {
        fprintf(stderr, "igbench: timer: %s\n", uv_strerror(rc));
        return 1;
    }
    uv_signal_t sigint;
    uv_signal_init(S.loop, &sigint);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_unref((uv_handle_t *)&sigint);

    /* Start a little in the future so the first arrivals are on time. */
    S.t0 = uv_hrtime() + 2000000ull;
    S.t_end_sched = S.t0 + (uint64_t)(cfg.duration_s * 1e9);
    S.warmup_end = S.t0 + (uint64_t)(cfg.warmup_s * 1e9);
    S.generating = 1;
    igb_tq_entry_init(&S.arrival);
    if (cfg.concurrency > 0) {
        S.warmup_end = uv_hrtime() + (uint64_t)(cfg.warmup_s * 1e9);
        S.t_end_sched = uv_hrtime() + (uint64_t)(cfg.duration_s * 1e9);
        issue_closed();
    } else {
        S.next_arrival = S.t0;
        igb_tq_add(&S.tq, &S.arrival, S.next_arrival, on_arrival);
    }
    progress_start();
    uv_run(S.loop, UV_RUN_DEFAULT);
    progress_stop();
    if (!uv_is_closing((uv_handle_t *)&sigint))
        uv_close((uv_handle_t *)&sigint, NULL);
    uv_run(S.loop, UV_RUN_DEFAULT);
    rc = report();
    igb_hdr_dispose(&S.e2e);
    igb_hdr_dispose(&S.ttft);
    igb_hdr_dispose(&S.itl);
    igb_hdr_dispose(&S.tpot);
    igb_hdr_dispose(&S.lag);
    free(cfg.raw_body);
    return rc == 0 ? 0 : 1;
}
