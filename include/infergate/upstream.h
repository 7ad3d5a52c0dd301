#ifndef INFERGATE_UPSTREAM_H
#define INFERGATE_UPSTREAM_H

/*
 * The upstream client: HTTP/1.1 over keep-alive connection pools, one pool
 * per upstream (a worker's Unix socket or a site's TCP address), on libuv +
 * llhttp. A request is sent as canonical bytes the gateway builds (never the
 * client's raw bytes); the response comes back as callbacks: headers once,
 * body pieces as they arrive (de-chunked, so SSE passes through event by
 * event), then done exactly once.
 *
 * Deadlines per request: connect, first byte of the response (the first
 * token of a stream comes with the headers or right after), idle between
 * body pieces, and total. A request that misses one ends with IG_ETIMEDOUT
 * and its connection is closed.
 */

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct ig_upstream_s ig_upstream_t;
typedef struct ig_upstream_req_s ig_upstream_req_t;

/* The defaults are ig_upstream_opts_default()'s (gateway/route/upstream.c);
 * a gateway's come from its config (docs/config.md). */
typedef struct {
    uint64_t connect_timeout_ms;
    uint64_t first_byte_timeout_ms; /* headers of the response */
    uint64_t idle_timeout_ms;       /* between body pieces */
    uint64_t total_timeout_ms;
    unsigned max_idle_connections; /* kept open per upstream */
    uint64_t keepalive_idle_ms;    /* an idle pooled connection closes after */
    size_t max_response_header_bytes;
    uint64_t resolve_ttl_ms; /* a host name's answer is refreshed after */
    /* Open connections at most (0 = no cap): a request that finds none
     * idle and the cap reached waits, in order, for one to come free (at
     * most first_byte_timeout_ms, then IG_ECONNECT). ig_upstream_set_max_
     * connections() moves it (the proxy sets the adaptive limit). */
    unsigned max_connections;
    /* Idle connections beyond the most that were busy at once in the last
     * one to two of these windows are closed, least recently used first
     * (0 = only keepalive_idle_ms closes them). */
    uint64_t idle_trim_ms;
    /* https:// addresses (gateway/http/tls.c): the peer is verified with
     * tls (NULL: the system's CAs) against tls_server_name (NULL: the
     * URL's host); the handshake is part of the connect deadline. A
     * handshake that fails is a failed connect; there is no plain HTTP
     * fallback. */
    struct ig_tls_ctx_s *tls;
    const char *tls_server_name;
    const char *headers; /* "Name: value\r\n" lines sent on every request, or NULL */
} ig_upstream_opts_t;

void ig_upstream_opts_default(ig_upstream_opts_t *opts);

/*
 * Creates the connection pool for one upstream and attaches it to the
 * loop; ig_upstream_close() is its pair. address: "unix:PATH", "HOST[:PORT]",
 * "http://HOST[:PORT][/prefix]" (the prefix is prepended to request paths;
 * the port defaults to 80; an IPv6 address goes in brackets). name is
 * copied; HOST[:PORT] as written goes into the Host header for TCP.
 *
 * A literal address is used as is. A host name is resolved with
 * uv_getaddrinfo, never blocking the loop: first at start, again in the
 * background once the answer is older than opts.resolve_ttl_ms, and again
 * before the next connect once every address it gave has failed to
 * connect. A connection that needs an answer waits for it within its
 * connect deadline. A name that does not resolve is no error here: its
 * requests end with IG_ECONNECT (a failed lookup is repeated at most once a
 * second), and a later answer serves again.
 * 0, IG_EINVAL (a malformed address) or IG_ENOMEM.
 */
int ig_upstream_start(ig_upstream_t **out, uv_loop_t *loop, const char *name, const char *address,
                      const ig_upstream_opts_t *opts);

/* Cancels every request (their done callbacks fire with IG_ECANCELED),
 * closes every connection, then calls cb and frees the upstream. */
void ig_upstream_close(ig_upstream_t *u, void (*cb)(void *data), void *data);

const char *ig_upstream_name(const ig_upstream_t *u);
unsigned ig_upstream_open_connections(const ig_upstream_t *u);
/* 1 once an address is known (always for unix: and literal addresses). */
int ig_upstream_resolved(const ig_upstream_t *u);

/* Moves the connection cap (0 = none). Lowering it closes idle connections
 * beyond it at once and busy ones as their responses end; raising it lets
 * waiting requests connect. */
void ig_upstream_set_max_connections(ig_upstream_t *u, unsigned max);
/* Idle connections now, and requests waiting under the cap. */
unsigned ig_upstream_idle_connections(const ig_upstream_t *u);
unsigned ig_upstream_waiting(const ig_upstream_t *u);

typedef struct {
    /* Status and headers. Header names/values are borrowed for the call. */
    void (*on_headers)(ig_upstream_req_t *r, int status, int nheaders, const char *const *names,
                       const char *const *values, void *data);
    /* One body piece, borrowed for the call. */
    void (*on_body)(ig_upstream_req_t *r, const char *buf, size_t len, void *data);
    /* The end, exactly once: 0 after a complete response (a body without
     * Content-Length or chunking ends with the connection, which is then
     * not reused), else IG_ECONNECT (the name did not resolve, could not
     * connect, or the connection failed before a byte came back: safe to
     * retry), IG_ETIMEDOUT, IG_ECLOSED (broken mid-response), IG_EPARSE
     * (malformed response) or IG_ECANCELED. The request is freed after. */
    void (*on_done)(ig_upstream_req_t *r, int err, void *data);
} ig_upstream_cbs_t;

/*
 * Sends one request. extra_headers is a block of "Name: value\r\n" lines or
 * NULL; Host, Content-Length and Connection are the client's. body is copied.
 * Returns 0 and a handle in *out (may be NULL), or IG_ENOMEM / IG_ESTATE
 * (the upstream is closing); on error no callback fires. No callback fires
 * inside this call either: a failure found at once comes from the loop.
 */
int ig_upstream_request(ig_upstream_t *u, const char *method, const char *path,
                        const char *extra_headers, const char *body, size_t len,
                        const ig_upstream_cbs_t *cbs, void *data, ig_upstream_req_t **out);

/*
 * Abandons a request: its connection is closed (so a worker sees the
 * client gone and frees the sequence), and no callback fires any more.
 * Allowed from inside the request's own callbacks (the request is freed
 * once the callback has returned); inside on_done it does nothing.
 */
void ig_upstream_cancel(ig_upstream_req_t *r);

/* Stops and restarts reading the response (backpressure from a slow
 * client). The idle deadline does not run while paused. */
void ig_upstream_pause(ig_upstream_req_t *r);
void ig_upstream_resume(ig_upstream_req_t *r);

/* Seconds from sending to the response's first byte, once known (else -1),
 * and from connect start to connected (0 for a reused connection). */
double ig_upstream_req_ttfb(const ig_upstream_req_t *r);
double ig_upstream_req_connect_time(const ig_upstream_req_t *r);

#endif
