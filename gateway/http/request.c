/*
 * The request object: arena, accessors, and the response API (whole
 * responses and chunked/SSE streams).
 */
#include "http_internal.h"

#include "infergate/error.h"
#include "infergate/swar.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const ig__http_conn_ops_t *ig__http_conn_ops; /* server.c sets it */

/* ---- arena ------------------------------------------------------------ */

void ig__arena_init(ig__arena_t *a)
{
    a->blocks = NULL;
    a->used = 0;
}

void *ig__arena_alloc(ig__arena_t *a, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (size == 0)
        size = 16;
    if (IG__ARENA_INLINE - a->used >= size) {
        void *p = a->inline_buf + a->used;
        a->used += size;
        return p;
    }
    ig__arena_block_t *b = a->blocks;
    if (b != NULL && b->cap - b->used >= size) {
        void *p = b->data + b->used;
        b->used += size;
        return p;
    }
    size_t cap = size > 16384 ? size : 16384;
    b = malloc(sizeof(*b) + cap);
    if (b == NULL)
        return NULL;
    b->cap = cap;
    b->used = size;
    if (a->blocks != NULL && size > 16384) {
        /* A big one-off block goes behind the current one so that the
         * current block's free space stays usable. */
        b->next = a->blocks->next;
        a->blocks->next = b;
    } else {
        b->next = a->blocks;
        a->blocks = b;
    }
    return b->data;
}

void ig__arena_dispose(ig__arena_t *a)
{
    ig__arena_block_t *b = a->blocks;
    while (b != NULL) {
        ig__arena_block_t *n = b->next;
        free(b);
        b = n;
    }
    a->blocks = NULL;
    a->used = 0;
}

/* ---- the buffer budget ------------------------------------------------ */

/* One counter for the process: servers may run on several loops (tests,
 * an embedding program), and the point is the process's memory. */
static atomic_size_t budget_used;

size_t ig__http_budget_used(void)
{
    return atomic_load_explicit(&budget_used, memory_order_relaxed);
}

int ig__http_budget_take(size_t n, size_t limit)
{
    size_t cur = atomic_load_explicit(&budget_used, memory_order_relaxed);
    do {
        if (n > limit || cur > limit - n)
            return -1;
    } while (!atomic_compare_exchange_weak_explicit(&budget_used, &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return 0;
}

void ig__http_budget_charge(size_t n)
{
    atomic_fetch_add_explicit(&budget_used, n, memory_order_relaxed);
}

void ig__http_budget_release(size_t n)
{
    atomic_fetch_sub_explicit(&budget_used, n, memory_order_relaxed);
}

/* ---- request lifecycle ------------------------------------------------ */

#define REQ_POOL_MAX 64

/* A request from pool's free list, or NULL when it has none. */
static ig_http_req_t *pool_take(ig__http_reqpool_t *pool)
{
    ig_http_req_t *r = pool != NULL ? pool->free : NULL;
    if (r != NULL) {
        pool->free = r->next;
        pool->count--;
    }
    return r;
}

ig_http_req_t *ig__http_req_new(ig__http_reqpool_t *pool)
{
    ig_http_req_t *r = pool_take(pool);
    if (r == NULL && (r = malloc(sizeof(*r))) == NULL)
        return NULL;
    memset(r, 0, offsetof(ig_http_req_t, arena));
    ig__arena_init(&r->arena);
    r->pool = pool;
    r->out_tail = &r->out_headers;
    r->route = "unmatched";
    return r;
}

void ig__http_req_free(ig_http_req_t *r)
{
    if (r == NULL)
        return;
    if (r->body_heap)
        free(r->body);
    if (r->budget != 0) {
        ig__http_budget_release(r->budget);
        r->budget = 0;
    }
    free(r->upstream);
    ig__arena_dispose(&r->arena);
    ig__http_reqpool_t *pool = r->pool;
    if (pool != NULL && pool->count < REQ_POOL_MAX) {
        r->next = pool->free;
        pool->free = r;
        pool->count++;
    } else {
        free(r);
    }
}

void ig__http_reqpool_dispose(ig__http_reqpool_t *pool)
{
    ig_http_req_t *r;
    while ((r = pool_take(pool)) != NULL)
        free(r);
}

/* ---- accessors -------------------------------------------------------- */

const char *ig_http_req_method(const ig_http_req_t *req)
{
    return req->method;
}

const char *ig_http_req_path(const ig_http_req_t *req)
{
    return req->path;
}

const char *ig_http_req_query(const ig_http_req_t *req)
{
    return req->query;
}

const char *ig_http_req_header(const ig_http_req_t *req, const char *name)
{
    size_t n = strlen(name);
    for (unsigned i = 0; i < req->nheaders; i++) {
        const ig__http_header_t *h = &req->headers[i];
        if (h->nlen == n && strcasecmp(h->name, name) == 0)
            return h->value;
    }
    return NULL;
}

const char *ig_http_req_body(const ig_http_req_t *req, size_t *len)
{
    if (len != NULL)
        *len = req->body_len;
    return req->body != NULL ? req->body : "";
}

const char *ig_http_req_peer(const ig_http_req_t *req)
{
    return req->peer;
}

uint64_t ig_http_req_start_ns(const ig_http_req_t *req)
{
    return req->start_ns;
}

int ig_http_req_aborted(const ig_http_req_t *req)
{
    return req->aborted;
}

void *ig_http_req_alloc(ig_http_req_t *req, size_t size)
{
    return ig__arena_alloc(&req->arena, size);
}

/* The n bytes at s and a NUL, in req's arena. */
static char *arena_copy(ig_http_req_t *req, const char *s, size_t n)
{
    char *d = ig__arena_alloc(&req->arena, n + 1);
    if (d != NULL)
        memcpy(d, s, n + 1);
    return d;
}

char *ig_http_req_strdup(ig_http_req_t *req, const char *s)
{
    return arena_copy(req, s, strlen(s));
}

void ig_http_req_set_data(ig_http_req_t *req, void *data)
{
    req->data = data;
}

void *ig_http_req_get_data(const ig_http_req_t *req)
{
    return req->data;
}

void ig_http_req_set_route(ig_http_req_t *req, const char *route)
{
    req->route = route != NULL ? route : "unmatched";
}

void ig_http_req_set_upstream(ig_http_req_t *req, const char *upstream)
{
    free(req->upstream);
    req->upstream = upstream != NULL ? strdup(upstream) : NULL;
}

void ig_http_req_set_timing(ig_http_req_t *req, double queue_s, double ttft_s,
                            double upstream_ttft_s)
{
    req->timed = 1;
    req->queue_s = queue_s;
    req->ttft_s = ttft_s;
    req->upstream_ttft_s = upstream_ttft_s;
}

void ig_http_req_on_abort(ig_http_req_t *req, ig_http_abort_cb cb, void *data)
{
    req->abort_cb = cb;
    req->abort_data = data;
}

void ig_http_req_on_body(ig_http_req_t *req, ig_http_tap_cb cb, void *data)
{
    req->tap_cb = cb;
    req->tap_data = data;
}

int ig_http_req_status(const ig_http_req_t *req)
{
    return req->status;
}

void ig_http_req_on_drain(ig_http_req_t *req, ig_http_drain_cb cb, void *data)
{
    req->drain_cb = cb;
    req->drain_data = data;
}

size_t ig_http_req_write_queued(const ig_http_req_t *req)
{
    return ig__http_conn_ops->queued(req);
}

/* ---- status text ------------------------------------------------------ */

const char *ig_http_status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 499:
        return "Client Closed Request";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}

/* ---- responses -------------------------------------------------------- */

static int reserved_header(const char *name)
{
    switch (*name | 0x20) { /* the first letter, in lower case, picks the one to compare */
    case 'c':
        return strcasecmp(name, "content-length") == 0 || strcasecmp(name, "connection") == 0;
    case 't':
        return strcasecmp(name, "transfer-encoding") == 0;
    case 'd':
        return strcasecmp(name, "date") == 0;
    }
    return 0;
}

/* A name is a token: no separator, control or space (a ':' would move
 * where the value starts) in its n bytes, eight at a time. */
static int valid_header_name(const char *s, size_t n)
{
    size_t i = 0;
    if (n == 0)
        return 0;
    for (; n - i >= 8; i += 8) {
        uint64_t w = ig_swar_load(s + i);
        if (ig_swar_below(w, ' ' + 1) | ig_swar_eq(w, ':'))
            return 0;
    }
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == ':' || c <= ' ')
            return 0;
    }
    return 1;
}

/* A value must not split the header block: no CR or LF in its n bytes.
 * Values run long (the route header), so libc's vector memchr scans them. */
static int valid_header_value(const char *s, size_t n)
{
    return memchr(s, '\r', n) == NULL && memchr(s, '\n', n) == NULL;
}

int ig_http_add_header(ig_http_req_t *req, const char *name, const char *value)
{
    if (req->state != IG__REQ_DISPATCHED)
        return IG_ESTATE;
    size_t nlen = strlen(name), vlen = strlen(value);
    if (!valid_header_name(name, nlen) || !valid_header_value(value, vlen) || reserved_header(name))
        return IG_EINVAL;
    ig__http_out_header_t *h = ig__arena_alloc(&req->arena, sizeof(*h));
    char *n = arena_copy(req, name, nlen);
    char *v = arena_copy(req, value, vlen);
    if (h == NULL || n == NULL || v == NULL)
        return IG_ENOMEM;
    h->next = NULL;
    h->name = n;
    h->value = v;
    h->nlen = nlen;
    h->vlen = vlen;
    *req->out_tail = h;
    req->out_tail = &h->next;
    return 0;
}

static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define PUT_LIT(p, lit) put((p), (lit), sizeof(lit) - 1)

static char *put_str(char *p, const char *s)
{
    return put(p, s, strlen(s));
}

static char *put_u64(char *p, unsigned long long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* Writes the status line and headers; body_len -1 means a stream, -2 no
 * body. Returns the length written (buf is large enough: see head_size()).
 * Plain copies instead of printf: this runs once per response. */
static size_t format_head(ig_http_req_t *req, char *buf, int status, const char *content_type,
                          long long body_len)
{
    int close = !req->keep_alive || ig__http_conn_ops->closing(req);
    char *p = PUT_LIT(buf, "HTTP/1.1 ");
    p = put_u64(p, (unsigned)status);
    *p++ = ' ';
    p = put_str(p, ig_http_status_text(status));
    p = PUT_LIT(p, "\r\nServer: infergate\r\nDate: ");
    p = put_str(p, ig__http_conn_ops->date(req));
    p = PUT_LIT(p, "\r\n");
    if (content_type != NULL) {
        p = PUT_LIT(p, "Content-Type: ");
        p = put_str(p, content_type);
        p = PUT_LIT(p, "\r\n");
    }
    if (body_len >= 0) {
        p = PUT_LIT(p, "Content-Length: ");
        p = put_u64(p, (unsigned long long)body_len);
        p = PUT_LIT(p, "\r\n");
    } else if (body_len == -2) {
        /* 204/304: neither a length nor a body */
    } else if (req->http_minor == 1) {
        p = PUT_LIT(p, "Transfer-Encoding: chunked\r\n");
        req->chunked_out = 1;
    } else {
        close = 1; /* HTTP/1.0 stream: the end of the body is the close */
    }
    if (close) {
        req->keep_alive = 0;
        p = PUT_LIT(p, "Connection: close\r\n");
    } else if (req->http_minor == 0) {
        p = PUT_LIT(p, "Connection: keep-alive\r\n");
    }
    for (ig__http_out_header_t *h = req->out_headers; h != NULL; h = h->next) {
        p = put(p, h->name, h->nlen);
        p = PUT_LIT(p, ": ");
        p = put(p, h->value, h->vlen);
        p = PUT_LIT(p, "\r\n");
    }
    p = PUT_LIT(p, "\r\n");
    return (size_t)(p - buf);
}

/* A content type from the handler must not split the header block. */
static const char *safe_type(const char *content_type)
{
    if (content_type != NULL && strpbrk(content_type, "\r\n") != NULL)
        return "application/octet-stream";
    return content_type;
}

static size_t head_size(const ig_http_req_t *req, const char *content_type)
{
    size_t n = 256 + (content_type != NULL ? strlen(content_type) : 0);
    for (ig__http_out_header_t *h = req->out_headers; h != NULL; h = h->next)
        n += h->nlen + h->vlen + 4;
    return n;
}

/* The status a response or stream starts with, recorded on req: a code
 * outside 100..999 becomes 500. */
static int answer_status(ig_http_req_t *req, int status)
{
    req->status = status < 100 || status > 999 ? 500 : status;
    return req->status;
}

int ig_http_respond(ig_http_req_t *req, int status, const char *content_type, const char *body,
                    size_t len)
{
    if (req->state != IG__REQ_DISPATCHED)
        return IG_ESTATE;
    status = answer_status(req, status);
    content_type = safe_type(content_type);
    int rc = 0;
    if (req->tap_cb != NULL && len > 0)
        req->tap_cb(req, req->tap_data, body, len);
    if (req->conn != NULL) {
        int no_body = req->head_only || status == 204 || status == 304 || status < 200;
        size_t cap = head_size(req, content_type) + (no_body ? 0 : len);
        char stackbuf[8192];
        char *buf = cap <= sizeof(stackbuf) ? stackbuf : malloc(cap);
        if (buf == NULL) {
            rc = IG_ENOMEM;
        } else {
            size_t n = format_head(req, buf, status, content_type,
                                   (status == 204 || status == 304) ? -2 : (long long)len);
            if (!no_body && len > 0) {
                memcpy(buf + n, body, len);
                n += len;
            }
            rc = ig__http_conn_ops->send(req, buf, n);
            if (rc == IG_EBUSY || rc == IG_ECLOSED)
                rc = 0; /* queued whole, or discarded: nothing to pause */
            if (buf != stackbuf)
                free(buf);
        }
    }
    ig__http_conn_ops->finished(req);
    return rc;
}

static const char *error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 408:
        return "timeout_error";
    case 413:
    case 414:
    case 431:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "unavailable_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

int ig_http_respond_error(ig_http_req_t *req, int status, const char *type, const char *param,
                          const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_t *o = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type",
                          type != NULL ? type : error_type(status), "param", param, "code", code);
    char *s = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    int rc;
    if (s == NULL) {
        static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                       "\"server_error\",\"param\":null,\"code\":null}}";
        rc = ig_http_respond(req, status, "application/json", fallback, sizeof(fallback) - 1);
    } else {
        rc = ig_http_respond(req, status, "application/json", s, strlen(s));
        free(s);
    }
    return rc;
}

/* ---- streams ---------------------------------------------------------- */

int ig_http_stream_start(ig_http_req_t *req, int status, const char *content_type)
{
    if (req->state != IG__REQ_DISPATCHED)
        return IG_ESTATE;
    status = answer_status(req, status);
    content_type = safe_type(content_type);
    if (content_type != NULL && strncasecmp(content_type, "text/event-stream", 17) == 0) {
        /* Proxies must not buffer or transform an event stream. */
        ig_http_add_header(req, "Cache-Control", "no-cache");
    }
    req->state = IG__REQ_STREAMING;
    if (req->conn == NULL)
        return 0;
    size_t cap = head_size(req, content_type);
    char stackbuf[8192];
    char *buf = cap <= sizeof(stackbuf) ? stackbuf : malloc(cap);
    if (buf == NULL)
        return IG_ENOMEM;
    size_t n = format_head(req, buf, status, content_type, -1);
    int rc = ig__http_conn_ops->send(req, buf, n);
    if (buf != stackbuf)
        free(buf);
    return rc;
}

int ig_http_stream_write(ig_http_req_t *req, const char *data, size_t len)
{
    if (req->state != IG__REQ_STREAMING)
        return IG_ESTATE;
    if (req->tap_cb != NULL && len > 0)
        req->tap_cb(req, req->tap_data, data, len);
    if (req->conn == NULL)
        return IG_ECLOSED;
    if (len == 0 || req->head_only)
        return 0;
    int rc;
    if (!req->chunked_out) {
        rc = ig__http_conn_ops->send(req, data, len);
    } else {
        char stackbuf[8192];
        size_t cap = len + 24;
        char *buf = cap <= sizeof(stackbuf) ? stackbuf : malloc(cap);
        if (buf == NULL)
            return IG_ENOMEM;
        size_t n = (size_t)sprintf(buf, "%zx\r\n", len);
        memcpy(buf + n, data, len);
        n += len;
        buf[n++] = '\r';
        buf[n++] = '\n';
        rc = ig__http_conn_ops->send(req, buf, n);
        if (buf != stackbuf)
            free(buf);
    }
    return rc;
}

int ig_http_stream_end(ig_http_req_t *req)
{
    if (req->state != IG__REQ_STREAMING)
        return IG_ESTATE;
    int rc = 0;
    if (req->conn != NULL && req->chunked_out && !req->head_only)
        rc = ig__http_conn_ops->send(req, "0\r\n\r\n", 5);
    if (rc == IG_EBUSY || rc == IG_ECLOSED)
        rc = 0;
    ig__http_conn_ops->finished(req);
    return rc;
}
