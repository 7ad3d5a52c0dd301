/*
 * The server: listeners, connections, the pipeline queue, deadlines, the
 * write queue with backpressure, graceful close.
 *
 * A connection reads into one buffer. The parsing core consumes whole header
 * blocks and body bytes from it; complete requests go to a FIFO. The head of
 * the FIFO is the one request handed to the handler; the next is dispatched
 * when it finishes and the unsent output has fallen to the write mark.
 * Reading stops while max_pipeline requests wait, after a request that closes
 * the connection, and after a protocol error.
 *
 * A write that fails inside a handler's call (ig_http_respond, a stream
 * write) only marks the connection errored; the connection is closed, and
 * the abort callback run, from a zero timeout of the connection's timer, so
 * that no ig_http_* call ever runs the abort callback under its caller.
 */
#include "http_internal.h"

#include "base/list.h"

#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK 65536
#define LINGER_MS 1000
#define LINGER_MAX_BYTES (1u << 20)

enum { TM_NONE = 0, TM_HEADER, TM_BODY, TM_IDLE, TM_HANDSHAKE };

/* The TLS handshake deadline when the server is given none. */
#define TLS_HANDSHAKE_MS 10000

struct ig__http_conn_s {
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
        uv_stream_t stream;
        uv_handle_t handle;
    } h;
    uv_timer_t timer;
    uv_shutdown_t shutdown;
    ig_http_server_t *server;
    ig_list_t node; /* in server->conns */
    ig__http_parser_t parser;
    char *rbuf;
    size_t rcap, rpos, rlen;
    ig_http_req_t *qhead, *qtail;
    unsigned qlen;
    ig_http_req_t *active;
    size_t wqueued;
    uint64_t msg_start_ms;
    uint64_t msg_start_ns;
    uint64_t accepted_ms;
    uint64_t progress_ms;
    size_t lingered;
    int reading;
    int eof;
    int stop_parse;  /* no more requests from this connection */
    int close_after; /* close once the active response is flushed */
    int closing;     /* uv_close called */
    int lingering;   /* shut down, discarding input until EOF */
    int errored;     /* a write failed; conn_close_now() comes next turn */
    int pumping, repump;
    int want_drain;
    int timer_mode;     /* the deadline that applies now (TM_*) */
    uint64_t deadline;  /* loop ms when it expires */
    uint64_t timer_due; /* when the armed timer fires; 0: not armed */
    int open_handles;
    unsigned served;
    char peer[64];
    ig_tls_t *tls; /* NULL: plain TCP */
    char *tls_raw; /* ciphertext read buffer (READ_CHUNK) */
    int tls_eof;   /* the client sent close_notify */
};

struct ig_http_server_s {
    uv_loop_t *loop;
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
        uv_stream_t stream;
        uv_handle_t handle;
    } listener;
    uv_timer_t drain_timer;
    int is_unix;
    int port;
    char *unix_path;
    ig_http_limits_t limits;
    ig_http_handler_cb handler;
    void *data;
    ig_list_t conns; /* of ig__http_conn_t, newest first */
    unsigned nconns;
    unsigned inflight;
    unsigned handles; /* listener + rejecting sockets */
    int closing;
    int drain_started;
    ig_http_close_cb close_cb;
    void *close_data;
    ig__http_reqpool_t pool;
    ig_tls_ctx_t *tls_ctx; /* new connections speak TLS on it; NULL: plain */
    uint64_t tls_handshake_ms;
};

typedef struct {
    uv_write_t w;
    ig__http_conn_t *conn;
    size_t len;
    char data[];
} conn_write_t;

typedef struct {
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_write_t w;
    uv_shutdown_t sd;
    ig_http_server_t *server;
} reject_t;

/* ---- metrics ---------------------------------------------------------- */

static ig_metric_t *m_requests, *m_duration, *m_open, *m_rx, *m_tx, *m_budget_rejects;

static double buffered_bytes(void *data)
{
    return (double)ig__http_budget_used();
}

static void metrics_register(void)
{
    m_requests = ig_metrics_counter("infergate_http_requests_total",
                                    "HTTP requests finished, by route and status.", "route,status");
    m_duration = ig_metrics_histogram(
        "infergate_http_request_duration_seconds",
        "Time from the first request byte to the end of the response.", "route", NULL, 0);
    m_open = ig_metrics_gauge("infergate_http_open_connections", "Open HTTP connections.", NULL);
    m_rx = ig_metrics_counter("infergate_http_received_bytes_total", "HTTP bytes received.", NULL);
    m_tx = ig_metrics_counter("infergate_http_sent_bytes_total", "HTTP bytes sent.", NULL);
    m_budget_rejects = ig_metrics_counter(
        "infergate_http_budget_rejections_total",
        "Requests answered 503 because the process's buffered HTTP bytes were over budget.", NULL);
    ig_metrics_gauge_fn("infergate_http_buffered_bytes",
                        "Request bodies, read buffers and unsent response bytes held by the HTTP "
                        "servers of the process.",
                        buffered_bytes, NULL);
}

/* ---- limits ----------------------------------------------------------- */

void ig_http_limits_default(ig_http_limits_t *l)
{
    l->max_request_line = 8 * 1024;
    l->max_header_bytes = 64 * 1024;
    l->max_headers = 100;
    l->max_body_bytes = 4 * 1024 * 1024;
    l->header_timeout_ms = 10000;
    l->body_timeout_ms = 60000;
    l->idle_timeout_ms = 75000;
    l->max_connections = 10000;
    l->max_pipeline = 16;
    l->write_buffer_bytes = 256 * 1024;
    l->max_buffered_bytes = (size_t)256 << 20;
    l->max_chunk_ext_bytes = 256;
    l->max_chunk_ext_total = 4096;
}

/* Fields that a zeroed limits struct leaves at 0 get their defaults. */
static void limits_fill(ig_http_limits_t *l)
{
    ig_http_limits_t d;
    ig_http_limits_default(&d);
    if (l->max_pipeline == 0)
        l->max_pipeline = 1;
    if (l->max_buffered_bytes == 0)
        l->max_buffered_bytes = d.max_buffered_bytes;
    if (l->max_chunk_ext_bytes == 0)
        l->max_chunk_ext_bytes = d.max_chunk_ext_bytes;
    if (l->max_chunk_ext_total == 0)
        l->max_chunk_ext_total = d.max_chunk_ext_total;
}

/* ---- small helpers ---------------------------------------------------- */

static const char *conn_date(const ig_http_req_t *req)
{
    static _Thread_local time_t sec;
    static _Thread_local char buf[40];
    time_t now = time(NULL);
    if (now != sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        sec = now;
    }
    return buf;
}

static size_t conn_queued(const ig_http_req_t *req)
{
    return req->conn != NULL ? req->conn->wqueued : 0;
}

static int conn_closing(const ig_http_req_t *req)
{
    ig__http_conn_t *c = req->conn;
    return c == NULL || c->close_after || c->errored || c->server->closing;
}

static void conn_pump(ig__http_conn_t *c);
static void conn_close(ig__http_conn_t *c);
static void conn_close_now(ig__http_conn_t *c);
static void conn_abort(ig__http_conn_t *c);
static void conn_fail(ig__http_conn_t *c);
static void conn_update(ig__http_conn_t *c);
static void server_maybe_done(ig_http_server_t *s);

/* ---- accounting ------------------------------------------------------- */

static void account(ig_http_req_t *req)
{
    int status = req->status != 0 ? req->status : 499;
    double dur = req->start_ns ? (double)(uv_hrtime() - req->start_ns) / 1e9 : 0.0;
    char st[4] = "499"; /* a status is three digits */
    if (status >= 100 && status <= 999) {
        st[0] = (char)('0' + status / 100);
        st[1] = (char)('0' + status / 10 % 10);
        st[2] = (char)('0' + status % 10);
    }
    if (m_requests != NULL) {
        ig_metric_add(m_requests, 1, req->route, st);
        ig_metric_observe(m_duration, dur, req->route);
    }
    if (ig_log_level() <= IG_LOG_INFO) {
        ig_access_log_t a = {
            .method = req->method != NULL ? req->method : "-",
            .path = req->path != NULL ? req->path : "-",
            .status = status,
            .bytes_in = req->bytes_in,
            .bytes_out = req->bytes_out,
            .duration_s = dur,
            .upstream = req->upstream,
            .peer = req->peer[0] ? req->peer : NULL,
            .timed = req->timed,
            .queue_s = req->queue_s,
            .ttft_s = req->ttft_s,
            .upstream_ttft_s = req->upstream_ttft_s,
        };
        ig_log_access(&a);
    }
}

/* ---- writing ---------------------------------------------------------- */

static void on_write(uv_write_t *w, int status)
{
    conn_write_t *cw = (conn_write_t *)w;
    ig__http_conn_t *c = cw->conn;
    c->wqueued -= cw->len;
    ig__http_budget_release(sizeof(*cw) + cw->len);
    free(cw);
    if (c->closing || c->errored)
        return;
    if (status < 0) {
        conn_abort(c);
        return;
    }
    size_t mark = c->server->limits.write_buffer_bytes;
    if (c->want_drain && c->wqueued < mark) {
        c->want_drain = 0;
        ig_http_req_t *r = c->active;
        if (r != NULL && r->drain_cb != NULL)
            r->drain_cb(r, r->drain_data);
    }
    if (c->closing || c->errored)
        return;
    if (c->active == NULL && c->qhead != NULL && c->wqueued <= mark) {
        /* The next pipelined request waited for the output to drain. */
        conn_pump(c);
        return;
    }
    if (c->wqueued == 0 && c->close_after && c->active == NULL)
        conn_close(c);
}

/* Sends raw bytes: uv_try_write first, then one uv_write with a copy of the
 * rest. Returns 0, IG_EBUSY (queued above the limit) or IG_ECLOSED. */
static int raw_write(ig__http_conn_t *c, const char *data, size_t len)
{
    if (c->closing || c->lingering || c->errored)
        return IG_ECLOSED;
    size_t off = 0;
    if (c->wqueued == 0) {
        uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
        int n = uv_try_write(&c->h.stream, &b, 1);
        if (n > 0)
            off = (size_t)n;
        else if (n < 0 && n != UV_EAGAIN && n != UV_ENOSYS) {
            conn_fail(c);
            return IG_ECLOSED;
        }
    }
    if (m_tx != NULL)
        ig_metric_add(m_tx, (double)len);
    if (off < len) {
        size_t rest = len - off;
        conn_write_t *cw = malloc(sizeof(*cw) + rest);
        if (cw == NULL) {
            conn_fail(c);
            return IG_ENOMEM;
        }
        cw->conn = c;
        cw->len = rest;
        memcpy(cw->data, data + off, rest);
        uv_buf_t b = uv_buf_init(cw->data, (unsigned)rest);
        int rc = uv_write(&cw->w, &c->h.stream, &b, 1, on_write);
        if (rc < 0) {
            free(cw);
            conn_fail(c);
            return IG_ECLOSED;
        }
        c->wqueued += rest;
        /* Committed memory: charged even past the budget, which new
         * requests then see (dispatch answers 503). */
        ig__http_budget_charge(sizeof(*cw) + rest);
    }
    if (c->wqueued > c->server->limits.write_buffer_bytes) {
        c->want_drain = 1;
        return IG_EBUSY;
    }
    return 0;
}

/* Sends the ciphertext the TLS session has for the client. Same results
 * as raw_write. */
static int tls_flush(ig__http_conn_t *c)
{
    char buf[READ_CHUNK];
    size_t n;
    int rc = 0;
    while ((n = ig_tls_take(c->tls, buf, sizeof(buf))) > 0) {
        int r = raw_write(c, buf, n);
        if (r == IG_ECLOSED || r == IG_ENOMEM)
            return r;
        if (r != 0)
            rc = r;
    }
    return rc;
}

/* Sends response bytes: as they are, or encrypted on a TLS connection. */
static int conn_write(ig__http_conn_t *c, const char *data, size_t len)
{
    if (c->tls == NULL)
        return raw_write(c, data, len);
    if (c->closing || c->lingering || c->errored)
        return IG_ECLOSED;
    if (ig_tls_write(c->tls, data, len) != 0) {
        conn_fail(c);
        return IG_ECLOSED;
    }
    return tls_flush(c);
}

static int conn_send(ig_http_req_t *req, const char *data, size_t len)
{
    ig__http_conn_t *c = req->conn;
    if (c == NULL)
        return 0; /* detached: discarded */
    if (c->errored)
        return IG_ECLOSED;
    req->bytes_out += len;
    return conn_write(c, data, len);
}

/* ---- requests --------------------------------------------------------- */

static void queue_push(ig__http_conn_t *c, ig_http_req_t *r)
{
    r->next = NULL;
    r->conn = c;
    memcpy(r->peer, c->peer, sizeof(r->peer));
    if (c->qtail != NULL)
        c->qtail->next = r;
    else
        c->qhead = r;
    c->qtail = r;
    c->qlen++;
}

static ig_http_req_t *queue_pop(ig__http_conn_t *c)
{
    ig_http_req_t *r = c->qhead;
    if (r != NULL) {
        c->qhead = r->next;
        if (c->qhead == NULL)
            c->qtail = NULL;
        c->qlen--;
        r->next = NULL;
    }
    return r;
}

static void queue_drop(ig__http_conn_t *c)
{
    ig_http_req_t *r;
    while ((r = queue_pop(c)) != NULL)
        ig__http_req_free(r);
}

static void req_finished(ig_http_req_t *req)
{
    if (req->state == IG__REQ_FINISHED)
        return;
    req->state = IG__REQ_FINISHED;
    if (req->tap_cb != NULL)
        req->tap_cb(req, req->tap_data, NULL, 0);
    account(req);
    ig__http_conn_t *c = req->conn;
    if (c == NULL) {
        ig__http_req_free(req);
        return;
    }
    c->active = NULL;
    c->server->inflight--;
    c->served++;
    if (!req->keep_alive) {
        c->close_after = 1;
        c->stop_parse = 1;
    }
    ig__http_req_free(req);
    if (c->close_after) {
        queue_drop(c);
        conn_close(c); /* the shutdown waits for queued writes */
        return;
    }
    conn_pump(c);
}

static const ig__http_conn_ops_t conn_ops = {
    .send = conn_send,
    .finished = req_finished,
    .queued = conn_queued,
    .closing = conn_closing,
    .date = conn_date,
};

/* Set when the program starts, before any thread: a request is only ever
 * made by a server of this file. */
__attribute__((constructor)) static void set_conn_ops(void)
{
    ig__http_conn_ops = &conn_ops;
}

/* 503 for the buffer budget: the client may retry soon. */
static void answer_busy(ig_http_req_t *r, const char *msg)
{
    if (m_budget_rejects != NULL)
        ig_metric_add(m_budget_rejects, 1);
    ig_http_add_header(r, "Retry-After", "1");
    ig_http_respond_error(r, 503, NULL, NULL, "server_busy", "%s", msg);
}

/* Answers a protocol error: OpenAI-shaped body, then close. */
static void answer_error(ig__http_conn_t *c, ig_http_req_t *r)
{
    r->keep_alive = 0;
    r->http_minor = 1;
    c->stop_parse = 1;
    if (r->error_status == 503) /* the parser's only 503: a body over the budget */
        answer_busy(r, r->error_msg);
    else
        ig_http_respond_error(r, r->error_status, NULL, NULL, NULL, "%s", r->error_msg);
}

static void dispatch(ig__http_conn_t *c)
{
    ig_http_req_t *r = queue_pop(c);
    ig_http_server_t *s = c->server;
    c->active = r;
    r->state = IG__REQ_DISPATCHED;
    s->inflight++;
    if (r->error_status != 0)
        answer_error(c, r);
    else if (ig__http_budget_used() > s->limits.max_buffered_bytes)
        /* Over budget: no new work that could queue more output. The
         * connection stays usable. */
        answer_busy(r, "server busy: buffered HTTP data over budget");
    else
        s->handler(r, s->data);
}

/* ---- reading and parsing ---------------------------------------------- */

static void parse_more(ig__http_conn_t *c)
{
    ig_http_server_t *s = c->server;
    while (!c->stop_parse && c->qlen < s->limits.max_pipeline && c->rpos < c->rlen) {
        if (ig__http_parser_idle(&c->parser)) {
            c->msg_start_ms = uv_now(s->loop);
            c->msg_start_ns = uv_hrtime();
        }
        ig_http_req_t *r = NULL;
        int n = ig__http_parser_feed(&c->parser, c->rbuf + c->rpos, c->rlen - c->rpos, &r);
        if (n == IG_EPARSE) {
            if (r == NULL)
                r = ig__http_error_req(&s->pool, 500, "out of memory");
            if (r == NULL) {
                conn_fail(c);
                return;
            }
            r->start_ns = c->msg_start_ns;
            queue_push(c, r);
            c->stop_parse = 1;
            break;
        }
        c->rpos += (size_t)n;
        if (r != NULL) {
            r->start_ns = c->msg_start_ns;
            queue_push(c, r);
            if (!r->keep_alive)
                c->stop_parse = 1;
            continue;
        }
        if (n == 0)
            break;
    }
    if (c->rpos == c->rlen)
        c->rpos = c->rlen = 0;
    if (c->parser.want_continue) {
        c->parser.want_continue = 0;
        /* Only when nothing is ahead of it; a pipelining client gets its
         * 100 on its own schedule (it sends the body after a timeout). */
        if (c->qlen == 0 && c->active == NULL)
            conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    }
}

/* Makes room at the end of the read buffer (moving or growing it up to the
 * limit of one header block plus two reads). */
static void rbuf_grow(ig__http_conn_t *c)
{
    const ig_http_limits_t *l = &c->server->limits;
    size_t max = l->max_request_line + l->max_header_bytes + 2 * READ_CHUNK;
    if (c->rpos > 0 && c->rcap - c->rlen < READ_CHUNK / 4) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->rcap - c->rlen < READ_CHUNK / 4 && c->rcap < max) {
        size_t cap = c->rcap ? c->rcap * 2 : 16384;
        if (cap > max)
            cap = max;
        char *nb = realloc(c->rbuf, cap);
        if (nb != NULL) {
            ig__http_budget_charge(cap - c->rcap);
            c->rbuf = nb;
            c->rcap = cap;
        }
    }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    ig__http_conn_t *c = h->data;
    if (c->tls != NULL) {
        /* Ciphertext goes to its own buffer; tls_pull() decrypts into rbuf. */
        if (c->tls_raw == NULL && (c->tls_raw = malloc(READ_CHUNK)) != NULL)
            ig__http_budget_charge(READ_CHUNK);
        buf->base = c->tls_raw;
        buf->len = c->tls_raw != NULL ? READ_CHUNK : 0;
        return;
    }
    rbuf_grow(c);
    buf->base = c->rbuf != NULL ? c->rbuf + c->rlen : NULL;
    buf->len = c->rbuf != NULL ? c->rcap - c->rlen : 0;
}

/* Moves the plaintext the TLS session has into rbuf, as far as rbuf has
 * room (the rest waits in the session for the next pump), and sends what
 * the session produced for the client (handshake messages, tickets,
 * alerts). 0, or IG_EIO when the handshake or a record failed. */
static int tls_pull(ig__http_conn_t *c)
{
    int rc = 0;
    while (!c->tls_eof) {
        rbuf_grow(c);
        size_t room = c->rbuf != NULL ? c->rcap - c->rlen : 0;
        if (room == 0)
            break;
        int n = ig_tls_read(c->tls, c->rbuf + c->rlen, room);
        if (n > 0) {
            c->rlen += (size_t)n;
            continue;
        }
        if (n == IG_ECLOSED) {
            c->tls_eof = 1;
        } else if (n < 0) {
            ig_log(IG_LOG_DEBUG, "http: TLS from %s: %s", c->peer, ig_tls_error(c->tls));
            rc = IG_EIO;
        }
        break;
    }
    if (tls_flush(c) == IG_ECLOSED && rc == 0)
        rc = IG_ECLOSED;
    return rc;
}

/* The client closed its side (EOF, or TLS close_notify). */
static void conn_eof(ig__http_conn_t *c)
{
    /* A client that closes while a handler that can cancel (it set an
     * abort callback) is still computing its answer has gone away, as
     * inference servers assume: cancel rather than compute for nobody.
     * Otherwise a half-closed client still gets its answers. */
    if (c->active != NULL && c->active->abort_cb != NULL) {
        conn_abort(c);
        return;
    }
    c->eof = 1;
    c->reading = 0;
    uv_read_stop(&c->h.stream);
    /* A half-closed client still gets answers to what it sent. */
    if (c->active == NULL && c->qhead == NULL)
        conn_close(c);
    else
        c->stop_parse = c->stop_parse || c->rpos == c->rlen;
    conn_update(c);
}

/* Ciphertext arrived: decrypt, answer the handshake, parse. */
static void tls_read(ig__http_conn_t *c, const char *data, size_t n)
{
    c->progress_ms = uv_now(c->server->loop);
    if (m_rx != NULL)
        ig_metric_add(m_rx, (double)n);
    if (ig_tls_feed(c->tls, data, n) != 0 || tls_pull(c) != 0) {
        conn_abort(c);
        return;
    }
    conn_pump(c);
    if (c->tls_eof && !c->eof && !c->closing && !c->lingering && !c->errored)
        conn_eof(c);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    ig__http_conn_t *c = stream->data;
    if (c->closing || c->errored)
        return;
    if (c->lingering) {
        c->lingered += nread > 0 ? (size_t)nread : 0;
        if (nread < 0 || c->lingered > LINGER_MAX_BYTES)
            conn_close_now(c);
        return;
    }
    if (nread == 0)
        return;
    if (nread < 0) {
        /* Plaintext still in the session (rbuf was full) is the client's
         * last words: into rbuf first, as far as it fits. */
        if (nread == UV_EOF && c->tls != NULL) {
            if (tls_pull(c) != 0) {
                conn_abort(c);
                return;
            }
            conn_pump(c);
            if (c->closing || c->lingering || c->errored || c->eof)
                return;
        }
        if (nread == UV_EOF)
            conn_eof(c);
        else
            conn_abort(c);
        return;
    }
    if (c->tls != NULL) {
        tls_read(c, buf->base, (size_t)nread);
        return;
    }
    c->rlen += (size_t)nread;
    c->progress_ms = uv_now(c->server->loop);
    if (m_rx != NULL)
        ig_metric_add(m_rx, (double)nread);
    conn_pump(c);
}

/* Sets reading and the deadline timer from the connection's state. */
static void on_timer(uv_timer_t *t);

static void conn_update(ig__http_conn_t *c)
{
    ig_http_server_t *s = c->server;
    if (c->closing || c->lingering || c->errored)
        return;
    int want_read = !c->eof && !c->stop_parse && c->qlen < s->limits.max_pipeline;
    if (want_read && !c->reading) {
        if (uv_read_start(&c->h.stream, on_alloc, on_read) == 0)
            c->reading = 1;
    } else if (!want_read && c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = 0;
    }
    int mode;
    uint64_t due, now = uv_now(s->loop);
    if (c->tls != NULL && !ig_tls_established(c->tls) && !c->eof) {
        mode = TM_HANDSHAKE;
        due = c->accepted_ms + s->tls_handshake_ms;
    } else if (c->active != NULL || c->qhead != NULL || c->eof || c->stop_parse) {
        mode = TM_NONE;
        due = 0;
    } else if (ig__http_parser_idle(&c->parser) && c->rpos == c->rlen) {
        if (c->served > 0) {
            mode = TM_IDLE;
            due = now + s->limits.idle_timeout_ms;
        } else {
            mode = TM_HEADER;
            due = c->accepted_ms + s->limits.header_timeout_ms;
        }
    } else if (c->parser.phase == IG__PARSE_HEAD) {
        mode = TM_HEADER;
        due = c->msg_start_ms + s->limits.header_timeout_ms;
    } else {
        mode = TM_BODY;
        due = c->progress_ms + s->limits.body_timeout_ms;
    }
    c->timer_mode = mode;
    c->deadline = due;
    /* Lazy timer: it is re-armed only when the deadline moves earlier. A
     * timer that fires early finds a later deadline and re-arms, so a
     * keep-alive request costs no timer operation in the common case. */
    if (mode != TM_NONE && (c->timer_due == 0 || c->timer_due > due)) {
        c->timer_due = due;
        uv_timer_start(&c->timer, on_timer, due > now ? due - now : 0, 0);
    }
}

static void conn_pump(ig__http_conn_t *c)
{
    if (c->pumping) {
        c->repump = 1;
        return;
    }
    if (c->errored)
        return;
    c->pumping = 1;
    do {
        c->repump = 0;
        if (c->closing || c->errored)
            break;
        /* Plaintext that did not fit in rbuf at the last read. */
        if (c->tls != NULL && !c->lingering && !c->tls_eof && tls_pull(c) != 0) {
            conn_fail(c);
            break;
        }
        parse_more(c);
        /* A pipelined request waits while the previous answers are unsent
         * past the mark; on_write() pumps again below it. */
        if (!c->closing && !c->errored && c->active == NULL && c->qhead != NULL &&
            c->wqueued <= c->server->limits.write_buffer_bytes) {
            dispatch(c);
            c->repump = 1; /* room in the queue again: parse what is buffered */
        }
    } while (c->repump && !c->closing && !c->errored);
    c->pumping = 0;
    if (!c->closing && !c->errored && c->eof && c->active == NULL && c->qhead == NULL)
        conn_close(c); /* the shutdown waits for queued writes */
    conn_update(c);
}

static void on_timer(uv_timer_t *t)
{
    ig__http_conn_t *c = t->data;
    int mode = c->timer_mode;
    c->timer_due = 0;
    if (c->closing || c->lingering || c->errored || mode == TM_NONE)
        return;
    uint64_t now = uv_now(c->server->loop);
    if (c->deadline > now) {
        c->timer_due = c->deadline;
        uv_timer_start(&c->timer, on_timer, c->deadline - now, 0);
        return;
    }
    c->timer_mode = TM_NONE;
    if (mode == TM_HANDSHAKE) {
        ig_log(IG_LOG_DEBUG, "http: TLS handshake from %s timed out", c->peer);
        conn_abort(c);
        return;
    }
    if (mode == TM_IDLE) {
        conn_close(c);
        return;
    }
    ig_http_req_t *r =
        ig__http_error_req(&c->server->pool, 408,
                           mode == TM_HEADER ? "request header timeout" : "request body timeout");
    if (r == NULL) {
        conn_abort(c);
        return;
    }
    r->start_ns = c->msg_start_ns ? c->msg_start_ns : uv_hrtime();
    /* The partial request is dropped; the 408 goes out in order. */
    queue_push(c, r);
    c->stop_parse = 1;
    conn_pump(c);
}

/* ---- closing ---------------------------------------------------------- */

static void on_conn_handle_closed(uv_handle_t *h)
{
    ig__http_conn_t *c = h->data;
    if (--c->open_handles > 0)
        return;
    ig_http_server_t *s = c->server;
    ig_list_remove(&c->node);
    ig__http_parser_dispose(&c->parser);
    ig__http_budget_release(c->rcap);
    free(c->rbuf);
    if (c->tls_raw != NULL)
        ig__http_budget_release(READ_CHUNK);
    free(c->tls_raw);
    ig_tls_free(c->tls);
    free(c);
    s->nconns--;
    if (m_open != NULL)
        ig_metric_add(m_open, -1.0);
    server_maybe_done(s);
}

/* Detaches the active request (the handler still finishes it) and drops
 * what is queued; the connection is unusable from here on. */
static void conn_detach(ig__http_conn_t *c)
{
    queue_drop(c);
    ig_http_req_t *r = c->active;
    c->active = NULL;
    if (r != NULL) {
        r->conn = NULL;
        r->pool = NULL; /* may outlive the server */
        r->aborted = 1;
        c->server->inflight--;
        if (r->abort_cb != NULL)
            r->abort_cb(r, r->abort_data);
    }
}

static void conn_close_now(ig__http_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    conn_detach(c);
    uv_close(&c->h.handle, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

/* From a loop callback (a read or write completion, a timer): nothing of
 * the handler is on the stack, so the abort callback may run now. */
static void conn_abort(ig__http_conn_t *c)
{
    conn_close_now(c);
}

static void on_fail_timer(uv_timer_t *t)
{
    conn_close_now(t->data);
}

/* From inside a call of the handler's (a write failed): the connection is
 * dead from here on (writes return IG_ECLOSED, nothing more is read or
 * dispatched) and the request reads as aborted, but the close and the abort
 * callback wait for a turn of the loop of their own. */
static void conn_fail(ig__http_conn_t *c)
{
    if (c->closing || c->errored)
        return;
    c->errored = 1;
    c->stop_parse = 1;
    if (c->active != NULL)
        c->active->aborted = 1;
    if (c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = 0;
    }
    c->timer_mode = TM_NONE;
    c->timer_due = 0;
    uv_timer_start(&c->timer, on_fail_timer, 0, 0);
}

static void on_linger_timer(uv_timer_t *t)
{
    conn_close_now(t->data);
}

static void on_shutdown(uv_shutdown_t *sd, int status)
{
    ig__http_conn_t *c = sd->data;
    if (c->closing)
        return;
    if (status < 0 || c->eof) {
        conn_close_now(c);
        return;
    }
    /* Read and discard until the client closes (or a short deadline) so that
     * unread request bytes do not turn our FIN into a RST that could destroy
     * the response before the client reads it. */
    uv_timer_start(&c->timer, on_linger_timer, LINGER_MS, 0);
    if (!c->reading && uv_read_start(&c->h.stream, on_alloc, on_read) == 0)
        c->reading = 1;
    if (!c->reading)
        conn_close_now(c);
}

/* Graceful close of the socket after the last response is flushed. */
static void conn_close(ig__http_conn_t *c)
{
    if (c->closing || c->lingering || c->errored)
        return;
    if (c->tls != NULL && !c->tls_eof) {
        ig_tls_shutdown(c->tls); /* close_notify, before our FIN */
        tls_flush(c);
        if (c->errored)
            return;
    }
    c->lingering = 1;
    conn_detach(c);
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    c->timer_due = 0;
    /* Discarded input needs no buffer space beyond one read. */
    c->rpos = c->rlen = 0;
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, &c->h.stream, on_shutdown) < 0)
        conn_close_now(c);
}

int ig_http_stream_reset(ig_http_req_t *req)
{
    if (req->state == IG__REQ_FINISHED)
        return IG_ESTATE;
    if (req->conn != NULL)
        conn_fail(req->conn); /* unsent bytes go with the socket, next turn */
    req_finished(req);
    return 0;
}

/* ---- accepting -------------------------------------------------------- */

static void on_reject_closed(uv_handle_t *h)
{
    reject_t *rj = h->data;
    ig_http_server_t *s = rj->server;
    free(rj);
    s->handles--;
    server_maybe_done(s);
}

static void on_reject_shutdown(uv_shutdown_t *sd, int status)
{
    reject_t *rj = sd->data;
    uv_close((uv_handle_t *)&rj->h, on_reject_closed);
}

static void on_reject_written(uv_write_t *w, int status)
{
    reject_t *rj = w->data;
    rj->sd.data = rj;
    if (status < 0 || uv_shutdown(&rj->sd, (uv_stream_t *)&rj->h, on_reject_shutdown) < 0)
        uv_close((uv_handle_t *)&rj->h, on_reject_closed);
}

/* The body is 114 bytes; test_http_limits checks the framing. */
static const char reject_503[] =
    "HTTP/1.1 503 Service Unavailable\r\nServer: infergate\r\nContent-Type: application/json\r\n"
    "Content-Length: 114\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    "{\"error\":{\"message\":\"too many connections\",\"type\":\"unavailable_error\","
    "\"param\":null,\"code\":\"too_many_connections\"}}";

/* Over the connection cap: accept, answer 503 and close, outside the
 * connection accounting. */
static void reject(ig_http_server_t *s)
{
    reject_t *rj = malloc(sizeof(*rj));
    if (rj == NULL)
        return;
    rj->server = s;
    if (s->is_unix)
        uv_pipe_init(s->loop, &rj->h.pipe, 0);
    else
        uv_tcp_init(s->loop, &rj->h.tcp);
    rj->h.tcp.data = rj;
    s->handles++;
    if (uv_accept(&s->listener.stream, (uv_stream_t *)&rj->h) < 0) {
        uv_close((uv_handle_t *)&rj->h, on_reject_closed);
        return;
    }
    ig_log(IG_LOG_WARN, "http: connection limit %u reached, rejecting", s->limits.max_connections);
    if (s->tls_ctx != NULL) {
        /* No plaintext answer on a TLS port: the close says it. */
        uv_close((uv_handle_t *)&rj->h, on_reject_closed);
        return;
    }
    rj->w.data = rj;
    uv_buf_t b = uv_buf_init((char *)reject_503, sizeof(reject_503) - 1);
    if (uv_write(&rj->w, (uv_stream_t *)&rj->h, &b, 1, on_reject_written) < 0)
        uv_close((uv_handle_t *)&rj->h, on_reject_closed);
}

static void peer_name(ig__http_conn_t *c)
{
    if (c->server->is_unix) {
        snprintf(c->peer, sizeof(c->peer), "unix");
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, ip, sizeof(ip));
            port = ntohs(a->sin6_port);
            snprintf(c->peer, sizeof(c->peer), "[%s]:%d", ip, port);
            return;
        }
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof(ip));
        port = ntohs(a->sin_port);
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, port);
}

static void on_connection(uv_stream_t *listener, int status)
{
    ig_http_server_t *s = listener->data;
    if (status < 0 || s->closing)
        return;
    if (s->nconns >= s->limits.max_connections) {
        reject(s);
        return;
    }
    ig__http_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return;
    c->server = s;
    if (s->is_unix)
        uv_pipe_init(s->loop, &c->h.pipe, 0);
    else
        uv_tcp_init(s->loop, &c->h.tcp);
    uv_timer_init(s->loop, &c->timer);
    c->h.handle.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    ig_list_push_front(&s->conns, &c->node);
    s->nconns++;
    if (m_open != NULL)
        ig_metric_add(m_open, 1.0);
    ig__http_parser_init(&c->parser, &s->limits, &s->pool);
    c->accepted_ms = uv_now(s->loop);
    if (uv_accept(listener, &c->h.stream) < 0 ||
        (s->tls_ctx != NULL && ig_tls_new(&c->tls, s->tls_ctx, 1, NULL) != 0)) {
        conn_close_now(c);
        return;
    }
    if (!s->is_unix)
        uv_tcp_nodelay(&c->h.tcp, 1);
    peer_name(c);
    conn_update(c);
}

/* ---- server ----------------------------------------------------------- */

static int parse_listen(const char *listen, struct sockaddr_storage *ss)
{
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon[1] == '\0')
        return IG_EINVAL;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535)
        return IG_EINVAL;
    char host[INET6_ADDRSTRLEN + 2];
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof(host))
        return IG_EINVAL;
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        if (uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss) != 0)
            return IG_EINVAL;
        return 0;
    }
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    else if (hl == 0 || strcmp(host, "*") == 0)
        strcpy(host, "0.0.0.0");
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) != 0)
        return IG_EINVAL;
    return 0;
}

static void on_listener_closed_fail(uv_handle_t *h)
{
    ig_http_server_t *s = h->data;
    free(s->unix_path);
    free(s);
}

int ig_http_server_start(ig_http_server_t **out, uv_loop_t *loop, const char *listen,
                         const ig_http_limits_t *limits, ig_http_handler_cb handler, void *data)
{
    int rc;
    *out = NULL;
    if (listen == NULL || handler == NULL)
        return IG_EINVAL;
    ig_http_server_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return IG_ENOMEM;
    s->loop = loop;
    ig_list_init(&s->conns);
    s->handler = handler;
    s->data = data;
    if (limits != NULL)
        s->limits = *limits;
    else
        ig_http_limits_default(&s->limits);
    limits_fill(&s->limits);
    if (strncmp(listen, "unix:", 5) == 0) {
        s->is_unix = 1;
        s->unix_path = strdup(listen + 5);
        if (s->unix_path == NULL || s->unix_path[0] == '\0') {
            free(s->unix_path);
            free(s);
            return IG_EINVAL;
        }
        struct stat st;
        /* A stale socket from a previous run would make bind fail. */
        if (stat(s->unix_path, &st) == 0 && S_ISSOCK(st.st_mode))
            unlink(s->unix_path);
        uv_pipe_init(loop, &s->listener.pipe, 0);
        s->listener.handle.data = s;
        rc = uv_pipe_bind(&s->listener.pipe, s->unix_path);
    } else {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        if (parse_listen(listen, &ss) < 0) {
            free(s);
            return IG_EINVAL;
        }
        uv_tcp_init(loop, &s->listener.tcp);
        s->listener.handle.data = s;
        rc = uv_tcp_bind(&s->listener.tcp, (struct sockaddr *)&ss, 0);
    }
    if (rc == 0)
        rc = uv_listen(&s->listener.stream, 1024, on_connection);
    if (rc < 0)
        goto fail;
    if (!s->is_unix) {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        uv_tcp_getsockname(&s->listener.tcp, (struct sockaddr *)&ss, &len);
        s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    s->handles = 1;
    metrics_register();
    *out = s;
    return 0;
fail:
    uv_close(&s->listener.handle, on_listener_closed_fail);
    return rc;
}

void ig_http_server_set_tls(ig_http_server_t *s, ig_tls_ctx_t *ctx, uint64_t handshake_timeout_ms)
{
    ig_tls_ctx_ref(ctx);
    ig_tls_ctx_unref(s->tls_ctx);
    s->tls_ctx = ctx;
    s->tls_handshake_ms = handshake_timeout_ms > 0 ? handshake_timeout_ms : TLS_HANDSHAKE_MS;
}

void ig_http_server_set_limits(ig_http_server_t *s, const ig_http_limits_t *limits)
{
    s->limits = *limits;
    limits_fill(&s->limits);
}

int ig_http_server_port(const ig_http_server_t *s)
{
    return s->port;
}

unsigned ig_http_server_connections(const ig_http_server_t *s)
{
    return s->nconns;
}

unsigned ig_http_server_inflight(const ig_http_server_t *s)
{
    return s->inflight;
}

static void on_drain_timer_closed(uv_handle_t *h)
{
    ig_http_server_t *s = h->data;
    if (s->close_cb != NULL)
        s->close_cb(s, s->close_data);
    ig__http_reqpool_dispose(&s->pool);
    ig_tls_ctx_unref(s->tls_ctx);
    free(s->unix_path);
    free(s);
}

static void server_maybe_done(ig_http_server_t *s)
{
    if (!s->closing || s->nconns > 0 || s->handles > 0 || !s->drain_started)
        return;
    if (uv_is_closing((uv_handle_t *)&s->drain_timer))
        return;
    uv_close((uv_handle_t *)&s->drain_timer, on_drain_timer_closed);
}

static void on_listener_closed(uv_handle_t *h)
{
    ig_http_server_t *s = h->data;
    if (s->is_unix)
        unlink(s->unix_path);
    s->handles--;
    server_maybe_done(s);
}

static void on_drain_timeout(uv_timer_t *t)
{
    ig_http_server_t *s = t->data;
    ig_list_t *it, *tmp;
    if (!ig_list_empty(&s->conns))
        ig_log(IG_LOG_WARN, "http: drain timeout, force-closing %u connections", s->nconns);
    IG_LIST_FOREACH_SAFE(it, tmp, &s->conns)
    {
        conn_close_now(IG_LIST_DATA(it, ig__http_conn_t, node));
    }
}

void ig_http_server_close(ig_http_server_t *s, uint64_t drain_timeout_ms, ig_http_close_cb cb,
                          void *data)
{
    if (s->closing)
        return;
    s->closing = 1;
    s->close_cb = cb;
    s->close_data = data;
    uv_timer_init(s->loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_close(&s->listener.handle, on_listener_closed);
    ig_list_t *it, *tmp;
    IG_LIST_FOREACH_SAFE(it, tmp, &s->conns)
    {
        ig__http_conn_t *c = IG_LIST_DATA(it, ig__http_conn_t, node);
        if (!c->closing && !c->lingering && !c->errored) {
            if (c->active == NULL) {
                conn_close(c);
            } else {
                /* The in-flight response finishes and carries
                 * Connection: close; nothing after it is dispatched. */
                c->close_after = 1;
                c->stop_parse = 1;
                queue_drop(c);
                conn_update(c);
            }
        }
    }
    uv_timer_start(&s->drain_timer, on_drain_timeout, drain_timeout_ms, 0);
    s->drain_started = 1;
    server_maybe_done(s);
}

/* ---- test hooks ------------------------------------------------------- */

unsigned ig__http_server_queued(const ig_http_server_t *s)
{
    unsigned n = 0;
    const ig_list_t *it;
    IG_LIST_FOREACH(it, &s->conns)
    {
        const ig__http_conn_t *c = IG_LIST_DATA(it, const ig__http_conn_t, node);
        n += c->qlen;
    }
    return n;
}

size_t ig__http_server_buffered(const ig_http_server_t *s)
{
    size_t n = 0;
    const ig_list_t *it;
    IG_LIST_FOREACH(it, &s->conns)
    {
        const ig__http_conn_t *c = IG_LIST_DATA(it, const ig__http_conn_t, node);
        n += c->rlen - c->rpos;
    }
    return n;
}

unsigned ig__http_server_reading(const ig_http_server_t *s)
{
    unsigned n = 0;
    const ig_list_t *it;
    IG_LIST_FOREACH(it, &s->conns)
    {
        const ig__http_conn_t *c = IG_LIST_DATA(it, const ig__http_conn_t, node);
        n += c->reading ? 1 : 0;
    }
    return n;
}
