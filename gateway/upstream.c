/*
 * The upstream client: keep-alive HTTP/1.1 connection pools on libuv +
 * llhttp (see include/infergate/upstream.h).
 *
 * A connection carries one request at a time. Its one timer serves the
 * request's deadlines while busy and the keep-alive idle close while
 * pooled, so a request needs no handle of its own and is freed right after
 * its done callback.
 */
#include "infergate/upstream.h"
#include "infergate/error.h"
#include "infergate/log.h"

#include <llhttp.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_RESP_HEADERS 64

typedef struct conn_s conn_t;

struct ig_upstream_s {
    uv_loop_t *loop;
    char *name;
    char *host;   /* Host header value */
    char *prefix; /* path prefix from the URL, "" when none */
    int is_unix;
    char *unix_path;
    struct sockaddr_storage addr;
    ig_upstream_opts_t opts;
    conn_t *idle; /* pooled connections, most recent first */
    unsigned nidle;
    unsigned nconns;         /* open or opening */
    ig_upstream_req_t *reqs; /* every request not yet done */
    int closing;
    void (*close_cb)(void *data);
    void *close_data;
};

struct conn_s {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_timer_t timer;
    uv_connect_t connect;
    ig_upstream_t *up;
    conn_t *next_idle;
    llhttp_t parser;
    ig_upstream_req_t *req; /* in flight, or NULL when idle */
    int handles_open;       /* the stream and the timer */
    int closing;
    int reused; /* has carried a request before */
};

struct ig_upstream_req_s {
    ig_upstream_t *up;
    conn_t *conn;
    ig_upstream_req_t *prev, *next; /* in up->reqs */
    ig_upstream_cbs_t cbs;
    void *data;
    char *wbuf; /* the whole request, bytes ready to send */
    size_t wlen;
    uv_write_t *write; /* pending write, or NULL */
    uint64_t t_start_ns, t_connected_ns, t_sent_ns, t_first_byte_ns;
    uint64_t deadline_ns; /* total */
    int got_bytes;        /* any response byte arrived */
    int headers_done;
    int canceled;
    int paused;
    int retried_fresh; /* a stale pooled connection was replaced once */
    int in_cb;         /* inside a user callback: a cancel is finished after it */
    /* response headers being parsed */
    char *hbuf;
    size_t hlen, hcap;
    int nheaders;
    size_t name_off[MAX_RESP_HEADERS], value_off[MAX_RESP_HEADERS];
    int in_value;
};

static llhttp_settings_t parser_settings;
static int parser_settings_ready;

void ig_upstream_opts_default(ig_upstream_opts_t *o)
{
    o->connect_timeout_ms = 2000;
    o->first_byte_timeout_ms = 60000;
    o->idle_timeout_ms = 30000;
    o->total_timeout_ms = 600000;
    o->max_idle_connections = 64;
    o->keepalive_idle_ms = 30000;
    o->max_response_header_bytes = 64 * 1024;
}

static void conn_close(conn_t *c);
static void req_finish(ig_upstream_req_t *r, int err);
static void conn_start(ig_upstream_req_t *r);
static void parser_settings_init(void);

/* ---- the upstream ------------------------------------------------------- */

static int parse_address(ig_upstream_t *u, const char *address)
{
    if (strncmp(address, "unix:", 5) == 0) {
        u->is_unix = 1;
        u->unix_path = strdup(address + 5);
        u->host = strdup("localhost");
        u->prefix = strdup("");
        return u->unix_path && u->host && u->prefix && u->unix_path[0] ? 0 : IG_EINVAL;
    }
    const char *hp = address;
    if (strncmp(hp, "http://", 7) == 0)
        hp += 7;
    else if (strstr(hp, "://") != NULL)
        return IG_EINVAL; /* https and others: not spoken here */
    const char *slash = strchr(hp, '/');
    size_t hplen = slash ? (size_t)(slash - hp) : strlen(hp);
    char hostport[300];
    if (hplen == 0 || hplen >= sizeof(hostport))
        return IG_EINVAL;
    memcpy(hostport, hp, hplen);
    hostport[hplen] = '\0';
    u->host = strdup(hostport);
    u->prefix = strdup(slash ? slash : "");
    if (u->host == NULL || u->prefix == NULL)
        return IG_ENOMEM;
    /* Drop a trailing '/' of the prefix so "/v1/..." paths join cleanly. */
    size_t pl = strlen(u->prefix);
    if (pl > 0 && u->prefix[pl - 1] == '/')
        u->prefix[pl - 1] = '\0';

    char *host = hostport;
    char *port;
    if (host[0] == '[') {
        char *end = strchr(host, ']');
        if (end == NULL || end[1] != ':')
            return IG_EINVAL;
        *end = '\0';
        host++;
        port = end + 2;
    } else {
        port = strrchr(host, ':');
        if (port == NULL)
            return IG_EINVAL;
        *port++ = '\0';
    }
    if (*port == '\0' || *host == '\0')
        return IG_EINVAL;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL)
        return IG_EINVAL;
    memcpy(&u->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

static void upstream_free(ig_upstream_t *u)
{
    free(u->name);
    free(u->host);
    free(u->prefix);
    free(u->unix_path);
    free(u);
}

int ig_upstream_init(ig_upstream_t **out, uv_loop_t *loop, const char *name, const char *address,
                     const ig_upstream_opts_t *opts)
{
    parser_settings_init();
    ig_upstream_t *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return IG_ENOMEM;
    u->loop = loop;
    u->name = strdup(name);
    if (opts != NULL)
        u->opts = *opts;
    else
        ig_upstream_opts_default(&u->opts);
    int rc = u->name ? parse_address(u, address) : IG_ENOMEM;
    if (rc != 0)
        goto fail;
    *out = u;
    return 0;
fail:
    upstream_free(u);
    return rc;
}

const char *ig_upstream_name(const ig_upstream_t *u)
{
    return u->name;
}

unsigned ig_upstream_open_connections(const ig_upstream_t *u)
{
    return u->nconns;
}

static void maybe_finish_close(ig_upstream_t *u)
{
    if (!u->closing || u->nconns > 0 || u->reqs != NULL)
        return;
    void (*cb)(void *) = u->close_cb;
    void *data = u->close_data;
    upstream_free(u);
    if (cb != NULL)
        cb(data);
}

void ig_upstream_close(ig_upstream_t *u, void (*cb)(void *data), void *data)
{
    u->closing = 1;
    u->close_cb = cb;
    u->close_data = data;
    while (u->reqs != NULL)
        req_finish(u->reqs, IG_ECANCELED);
    while (u->idle != NULL) {
        conn_t *c = u->idle;
        u->idle = c->next_idle;
        u->nidle--;
        c->next_idle = NULL;
        conn_close(c);
    }
    maybe_finish_close(u);
}

/* ---- connections --------------------------------------------------------- */

static void conn_on_handle_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->handles_open > 0)
        return;
    ig_upstream_t *u = c->up;
    u->nconns--;
    free(c);
    maybe_finish_close(u);
}

/* Closes a connection that is not in the idle list. */
static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (c->req != NULL && c->req->conn == c)
        c->req->conn = NULL;
    c->req = NULL;
    uv_close((uv_handle_t *)&c->timer, conn_on_handle_closed);
    uv_close(&c->h.handle, conn_on_handle_closed);
}

static void idle_remove(ig_upstream_t *u, conn_t *c)
{
    for (conn_t **p = &u->idle; *p != NULL; p = &(*p)->next_idle) {
        if (*p == c) {
            *p = c->next_idle;
            c->next_idle = NULL;
            u->nidle--;
            return;
        }
    }
}

static void on_keepalive_timeout(uv_timer_t *t)
{
    conn_t *c = t->data;
    idle_remove(c->up, c);
    conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static char slab[65536]; /* the loop is single-threaded; data is consumed at once */
    buf->base = slab;
    buf->len = sizeof(slab);
}

/* Puts a connection whose response completed back into the pool. */
static void conn_release(conn_t *c, int keep_alive)
{
    ig_upstream_t *u = c->up;
    c->req = NULL;
    if (!keep_alive || u->closing || u->nidle >= u->opts.max_idle_connections) {
        conn_close(c);
        return;
    }
    /* A pooled connection keeps reading so that a server-side close is
     * noticed; any byte arriving while idle is a protocol error. */
    c->reused = 1;
    c->next_idle = u->idle;
    u->idle = c;
    u->nidle++;
    uv_timer_start(&c->timer, on_keepalive_timeout, u->opts.keepalive_idle_ms, 0);
}

/* ---- request deadlines --------------------------------------------------- */

static uint64_t ms_until(uint64_t now_ns, uint64_t deadline_ns)
{
    return deadline_ns > now_ns ? (deadline_ns - now_ns + 999999) / 1000000 : 0;
}

static void on_req_timeout(uv_timer_t *t);

/* Arms the connection's timer for the nearest deadline of its request. */
static void req_arm_timer(ig_upstream_req_t *r)
{
    conn_t *c = r->conn;
    if (c == NULL)
        return;
    uint64_t now = uv_hrtime();
    uint64_t phase_ms;
    if (r->t_connected_ns == 0)
        phase_ms = r->up->opts.connect_timeout_ms;
    else if (!r->got_bytes)
        phase_ms = r->up->opts.first_byte_timeout_ms;
    else if (r->paused)
        phase_ms = 0; /* no idle deadline while the client holds us back */
    else
        phase_ms = r->up->opts.idle_timeout_ms;
    uint64_t total_ms = ms_until(now, r->deadline_ns);
    uint64_t ms = phase_ms != 0 && phase_ms < total_ms ? phase_ms : total_ms;
    uv_timer_start(&c->timer, on_req_timeout, ms, 0);
}

static void on_req_timeout(uv_timer_t *t)
{
    conn_t *c = t->data;
    ig_upstream_req_t *r = c->req;
    if (r == NULL)
        return;
    /* Before connecting, a timeout is a connect failure: retry-safe. */
    req_finish(r, r->t_connected_ns == 0 ? IG_ECONNECT : IG_ETIMEDOUT);
}

/* ---- the response parser ------------------------------------------------- */

static ig_upstream_req_t *parser_req(llhttp_t *p)
{
    conn_t *c = p->data;
    return c->req;
}

static int hbuf_append(ig_upstream_req_t *r, const char *at, size_t len)
{
    if (r->hlen + len + 1 > r->up->opts.max_response_header_bytes)
        return -1;
    if (r->hlen + len + 1 > r->hcap) {
        size_t cap = r->hcap ? r->hcap * 2 : 1024;
        while (cap < r->hlen + len + 1)
            cap *= 2;
        char *n = realloc(r->hbuf, cap);
        if (n == NULL)
            return -1;
        r->hbuf = n;
        r->hcap = cap;
    }
    memcpy(r->hbuf + r->hlen, at, len);
    r->hlen += len;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL)
        return HPE_USER;
    if (r->in_value || r->nheaders == 0) {
        if (r->nheaders >= MAX_RESP_HEADERS)
            return HPE_USER;
        if (r->nheaders > 0 && hbuf_append(r, "", 1) != 0) /* end the last value */
            return HPE_USER;
        r->name_off[r->nheaders++] = r->hlen;
        r->in_value = 0;
    }
    return hbuf_append(r, at, len) == 0 ? 0 : HPE_USER;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL || r->nheaders == 0)
        return HPE_USER;
    if (!r->in_value) {
        if (hbuf_append(r, "", 1) != 0) /* end the name */
            return HPE_USER;
        r->value_off[r->nheaders - 1] = r->hlen;
        r->in_value = 1;
    }
    return hbuf_append(r, at, len) == 0 ? 0 : HPE_USER;
}

static int on_headers_complete(llhttp_t *p)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL)
        return HPE_USER;
    if (r->nheaders > 0 && !r->in_value) {
        /* A name without a value: give it an empty one. */
        if (hbuf_append(r, "", 1) != 0)
            return HPE_USER;
        r->value_off[r->nheaders - 1] = r->hlen;
    }
    if (r->nheaders > 0 && hbuf_append(r, "", 1) != 0)
        return HPE_USER;
    const char *names[MAX_RESP_HEADERS], *values[MAX_RESP_HEADERS];
    for (int i = 0; i < r->nheaders; i++) {
        names[i] = r->hbuf + r->name_off[i];
        values[i] = r->hbuf + r->value_off[i];
    }
    r->headers_done = 1;
    if (r->cbs.on_headers != NULL) {
        r->in_cb++;
        r->cbs.on_headers(r, p->status_code, r->nheaders, names, values, r->data);
        r->in_cb--;
    }
    return r->canceled ? HPE_USER : 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL)
        return HPE_USER;
    if (r->cbs.on_body != NULL) {
        r->in_cb++;
        r->cbs.on_body(r, at, len, r->data);
        r->in_cb--;
    }
    return r->canceled ? HPE_USER : 0;
}

static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    ig_upstream_req_t *r = c->req;
    if (r == NULL)
        return HPE_USER;
    int keep = llhttp_should_keep_alive(p);
    req_finish(r, 0);
    /* req_finish detached the request; hand the connection back. */
    if (!c->closing)
        conn_release(c, keep);
    return HPE_PAUSED; /* nothing more is parsed from this read */
}

static void parser_settings_init(void)
{
    if (parser_settings_ready)
        return;
    llhttp_settings_init(&parser_settings);
    parser_settings.on_header_field = on_header_field;
    parser_settings.on_header_value = on_header_value;
    parser_settings.on_headers_complete = on_headers_complete;
    parser_settings.on_body = on_body;
    parser_settings.on_message_complete = on_message_complete;
    parser_settings_ready = 1;
}

/* ---- reading and writing ------------------------------------------------- */

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    ig_upstream_req_t *r = c->req;
    if (r == NULL) {
        /* Idle: the server closed the connection, or sent junk. */
        if (nread != 0) {
            idle_remove(c->up, c);
            conn_close(c);
        }
        return;
    }
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && r->got_bytes) {
            /* A body delimited by the close ends cleanly here. */
            llhttp_errno_t e = llhttp_finish(&c->parser);
            if (e == HPE_OK && c->req == NULL)
                return;
        }
        if (!r->got_bytes && c->reused && !r->retried_fresh) {
            /* A pooled connection the server had closed: try once more on a
             * fresh one. Nothing reached the server's application. */
            r->retried_fresh = 1;
            if (r->write != NULL) { /* canceled with the old connection */
                r->write->data = NULL;
                r->write = NULL;
            }
            conn_close(c);
            r->conn = NULL;
            r->t_connected_ns = 0;
            conn_start(r);
            return;
        }
        req_finish(r, r->got_bytes ? IG_ECLOSED : IG_ECONNECT);
        return;
    }
    if (!r->got_bytes) {
        r->got_bytes = 1;
        r->t_first_byte_ns = uv_hrtime();
    }
    llhttp_errno_t e = llhttp_execute(&c->parser, buf->base, (size_t)nread);
    if (e == HPE_PAUSED) {
        /* The response completed (on_message_complete pauses) and req_finish
         * freed r: only c may be touched here. Bytes after the response, with
         * no request to carry, mean the server misbehaved. */
        const char *stop = llhttp_get_error_pos(&c->parser);
        llhttp_resume(&c->parser);
        if (stop != NULL && stop < buf->base + nread && !c->closing) {
            idle_remove(c->up, c);
            conn_close(c);
        }
        return;
    }
    if (r->canceled && r->in_cb == 0 && e == HPE_USER) {
        /* Canceled from inside its own callback: finish it now. */
        req_finish(r, IG_ECANCELED);
        return;
    }
    if (e == HPE_OK) {
        if (c->req == r && !r->canceled)
            req_arm_timer(r); /* the idle deadline restarts on progress */
        return;
    }
    if (c->req == r && !r->canceled)
        req_finish(r, IG_EPARSE);
}

static void on_written(uv_write_t *w, int status)
{
    ig_upstream_req_t *r = w->data;
    free(w);
    if (r == NULL)
        return; /* the request finished while its bytes were in flight */
    r->write = NULL;
    if (status < 0 && r->conn != NULL && !r->got_bytes)
        req_finish(r, IG_ECONNECT);
}

static void req_send(ig_upstream_req_t *r)
{
    conn_t *c = r->conn;
    if (r->t_connected_ns == 0)
        r->t_connected_ns = uv_hrtime();
    r->t_sent_ns = uv_hrtime();
    req_arm_timer(r);
    int rc = uv_read_start(&c->h.stream, on_alloc, on_read);
    if (rc == 0 || rc == UV_EALREADY) {
        uv_buf_t b = uv_buf_init(r->wbuf, (unsigned)r->wlen);
        /* Most requests fit the socket buffer at once. A uv_write would
         * also do, but its completion makes libuv re-arm the watcher, one
         * epoll_ctl per request; a pending remainder still goes by uv_write. */
        int n = uv_try_write(&c->h.stream, &b, 1);
        if (n == (int)b.len)
            return;
        if (n > 0) {
            b.base += n;
            b.len -= (unsigned)n;
        }
        uv_write_t *w = malloc(sizeof(*w));
        if (w == NULL) {
            req_finish(r, IG_ECONNECT);
            return;
        }
        w->data = r;
        r->write = w;
        rc = uv_write(w, &c->h.stream, &b, 1, on_written);
        if (rc != 0) {
            r->write = NULL;
            free(w);
        }
    }
    if (rc != 0 && rc != UV_EALREADY)
        req_finish(r, IG_ECONNECT);
}

static void on_connected(uv_connect_t *cr, int status)
{
    conn_t *c = cr->data;
    ig_upstream_req_t *r = c->req;
    if (c->closing || r == NULL)
        return;
    if (status < 0) {
        IG_DEBUG("upstream %s: connect: %s", c->up->name, uv_strerror(status));
        req_finish(r, IG_ECONNECT);
        return;
    }
    req_send(r);
}

/* Gives r a connection: a pooled one, or a new one being connected. */
static void conn_start(ig_upstream_req_t *r)
{
    ig_upstream_t *u = r->up;
    conn_t *c = r->retried_fresh ? NULL : u->idle;
    if (c != NULL) {
        u->idle = c->next_idle;
        u->nidle--;
        c->next_idle = NULL;
        uv_timer_stop(&c->timer);
        c->req = r;
        r->conn = c;
        r->t_connected_ns = uv_hrtime(); /* connected already: no connect time */
        r->t_start_ns = r->t_connected_ns;
        req_send(r);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        req_finish(r, IG_ECONNECT);
        return;
    }
    c->up = u;
    int rc = u->is_unix ? uv_pipe_init(u->loop, &c->h.pipe, 0) : uv_tcp_init(u->loop, &c->h.tcp);
    if (rc != 0) {
        free(c);
        req_finish(r, IG_ECONNECT);
        return;
    }
    uv_timer_init(u->loop, &c->timer);
    c->handles_open = 2;
    c->h.handle.data = c;
    c->timer.data = c;
    c->connect.data = c;
    u->nconns++;
    llhttp_init(&c->parser, HTTP_RESPONSE, &parser_settings);
    c->parser.data = c;
    c->req = r;
    r->conn = c;
    req_arm_timer(r);
    if (u->is_unix) {
        uv_pipe_connect(&c->connect, &c->h.pipe, u->unix_path, on_connected);
        return;
    }
    uv_tcp_nodelay(&c->h.tcp, 1);
    rc = uv_tcp_connect(&c->connect, &c->h.tcp, (const struct sockaddr *)&u->addr, on_connected);
    if (rc != 0)
        req_finish(r, IG_ECONNECT);
}

/* ---- requests ------------------------------------------------------------ */

static int build_request(ig_upstream_req_t *r, const char *method, const char *path,
                         const char *extra, const char *body, size_t len)
{
    ig_upstream_t *u = r->up;
    size_t extra_len = extra ? strlen(extra) : 0;
    size_t cap =
        strlen(method) + strlen(u->prefix) + strlen(path) + strlen(u->host) + extra_len + len + 128;
    r->wbuf = malloc(cap);
    if (r->wbuf == NULL)
        return IG_ENOMEM;
    int n = snprintf(r->wbuf, cap,
                     "%s %s%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %zu\r\n"
                     "Connection: keep-alive\r\n%s\r\n",
                     method, u->prefix, path, u->host, len, extra ? extra : "");
    if (n < 0 || (size_t)n + len > cap)
        return IG_ENOMEM;
    if (len > 0)
        memcpy(r->wbuf + n, body, len);
    r->wlen = (size_t)n + len;
    return 0;
}

int ig_upstream_request(ig_upstream_t *u, const char *method, const char *path,
                        const char *extra_headers, const char *body, size_t len,
                        const ig_upstream_cbs_t *cbs, void *data, ig_upstream_req_t **out)
{
    if (u->closing)
        return IG_ESTATE;
    ig_upstream_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return IG_ENOMEM;
    r->up = u;
    r->cbs = *cbs;
    r->data = data;
    r->t_start_ns = uv_hrtime();
    r->deadline_ns = r->t_start_ns + u->opts.total_timeout_ms * 1000000ULL;
    int rc = build_request(r, method, path, extra_headers, body, len);
    if (rc != 0) {
        free(r->wbuf);
        free(r);
        return rc;
    }
    r->next = u->reqs;
    if (u->reqs != NULL)
        u->reqs->prev = r;
    u->reqs = r;
    if (out != NULL)
        *out = r;
    conn_start(r);
    return 0;
}

/*
 * Ends a request: unlinks it, detaches it from its connection (closing the
 * connection unless the response completed cleanly, which the caller then
 * releases), fires on_done unless canceled, and frees it.
 */
static void req_finish(ig_upstream_req_t *r, int err)
{
    ig_upstream_t *u = r->up;
    conn_t *c = r->conn;
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        u->reqs = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    /* A write still pending (the server answered before reading it all)
     * pins the buffer: the connection cannot be reused, and closing it
     * cancels the write before wbuf is freed below. */
    int write_pending = r->write != NULL;
    if (write_pending)
        r->write->data = NULL;
    if (c != NULL) {
        uv_timer_stop(&c->timer);
        r->conn = NULL;
        if (err != 0 || write_pending) {
            conn_close(c);
        } else {
            c->req = NULL; /* the caller releases it */
        }
    }
    if (!r->canceled && r->cbs.on_done != NULL)
        r->cbs.on_done(r, err, r->data);
    free(r->hbuf);
    free(r->wbuf);
    free(r);
    maybe_finish_close(u);
}

void ig_upstream_cancel(ig_upstream_req_t *r)
{
    if (r->canceled)
        return;
    r->canceled = 1;
    /* Closing the connection is what tells the worker the client is gone. */
    if (r->conn != NULL) {
        conn_t *c = r->conn;
        uv_timer_stop(&c->timer);
        conn_close(c);
        r->conn = NULL;
    }
    if (r->in_cb > 0)
        return; /* on_read finishes it once the callback has returned */
    req_finish(r, IG_ECANCELED);
}

void ig_upstream_pause(ig_upstream_req_t *r)
{
    if (r->paused || r->conn == NULL)
        return;
    r->paused = 1;
    uv_read_stop(&r->conn->h.stream);
    req_arm_timer(r);
}

void ig_upstream_resume(ig_upstream_req_t *r)
{
    if (!r->paused || r->conn == NULL)
        return;
    r->paused = 0;
    uv_read_start(&r->conn->h.stream, on_alloc, on_read);
    req_arm_timer(r);
}

double ig_upstream_req_ttfb(const ig_upstream_req_t *r)
{
    if (r->t_first_byte_ns == 0)
        return -1;
    return (double)(r->t_first_byte_ns - r->t_sent_ns) / 1e9;
}

double ig_upstream_req_connect_time(const ig_upstream_req_t *r)
{
    if (r->t_connected_ns == 0 || r->t_connected_ns < r->t_start_ns)
        return 0;
    return (double)(r->t_connected_ns - r->t_start_ns) / 1e9;
}
