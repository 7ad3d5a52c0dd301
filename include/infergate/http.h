#ifndef INFERGATE_HTTP_H
#define INFERGATE_HTTP_H

/*
 * A strict HTTP/1.1 server on libuv + llhttp, shared by the gateway and the
 * worker. The server parses, enforces limits and deadlines, and hands each
 * complete request (headers and body) to one handler callback. The handler
 * answers it, at once or later, whole or as a stream.
 *
 * Ownership: the server owns every ig_http_req_t. The handler must finish
 * each request exactly once, with ig_http_respond*() or ig_http_stream_end();
 * the request stays valid until then, even when the client has gone away
 * (the abort callback says so; later writes are discarded). After the
 * finishing call the request must not be touched.
 *
 * Pipelined requests are handed to the handler one at a time, in order: the
 * next one is dispatched when the previous response has been finished and
 * the connection's unsent output is at most write_buffer_bytes. While
 * max_pipeline parsed requests wait, the server stops reading the socket.
 *
 * Write errors and re-entrancy: no ig_http_* call ever runs the handler's
 * abort callback from inside itself. When a write finds the connection
 * broken (EPIPE, ECONNRESET, a failed allocation), the call returns its
 * result (IG_ECLOSED for stream calls, 0 for ig_http_respond*: the request
 * is finished anyway), ig_http_req_aborted() is 1 from then on, and later
 * writes return IG_ECLOSED. The request stays valid, and so does whatever the
 * handler keeps for it, until the handler finishes it. The abort callback
 * runs later, from its own turn of the loop, and only if the request has not
 * been finished by then. So after a write call returns an error, the handler
 * may still read the request, write (discarded), finish it right away, or
 * leave it to its abort callback; it must finish it exactly once either way.
 */

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct ig_http_server_s ig_http_server_t;
typedef struct ig_http_req_s ig_http_req_t;

typedef struct {
    size_t max_request_line;    /* bytes; over it -> 414 (default 8 KiB) */
    size_t max_header_bytes;    /* bytes of the header block; -> 431 (64 KiB) */
    unsigned max_headers;       /* header count; over it -> 431 (100) */
    size_t max_body_bytes;      /* -> 413 (4 MiB) */
    uint64_t header_timeout_ms; /* no complete header in time -> 408 + close (10 s) */
    uint64_t body_timeout_ms;   /* body stalls longer -> 408 + close (60 s) */
    uint64_t idle_timeout_ms;   /* keep-alive idle close (75 s) */
    unsigned max_connections;   /* past it new connections get 503 + close (10000) */
    unsigned max_pipeline;      /* parsed requests queued per connection (16) */
    size_t write_buffer_bytes;  /* queued unsent response bytes before a
                                   stream write reports backpressure and the
                                   next pipelined request waits (256 KiB) */
    /* The fields below take their default when 0, so that a zeroed struct
     * filled field by field (the config loader) stays sane. */
    size_t max_buffered_bytes;  /* process-wide budget for request bodies,
                                   read buffers and unsent output; past it
                                   -> 503 + Retry-After (256 MiB) */
    size_t max_chunk_ext_bytes; /* one chunk's extensions -> 400 + close (256) */
    size_t max_chunk_ext_total; /* all chunk extensions of one body (4 KiB) */
} ig_http_limits_t;

/* Fills the defaults above. */
void ig_http_limits_default(ig_http_limits_t *limits);

/* Called once per complete request, on the loop thread. */
typedef void (*ig_http_handler_cb)(ig_http_req_t *req, void *data);
typedef void (*ig_http_close_cb)(ig_http_server_t *server, void *data);

/*
 * Starts listening. `listen` is "HOST:PORT" (IPv4 or [IPv6]) or "unix:PATH".
 * Port 0 picks a free port; ig_http_server_port() tells which.
 * Returns 0, IG_EINVAL for a bad address, or a libuv error (bind, listen).
 */
int ig_http_server_start(ig_http_server_t **out, uv_loop_t *loop, const char *listen,
                         const ig_http_limits_t *limits, ig_http_handler_cb handler, void *data);

/*
 * Connections accepted from now on speak TLS on ctx (the server takes a
 * reference; NULL: plain again). Open connections keep the context they
 * started with, so a certificate reload drops none. A client that has not
 * finished its handshake within handshake_timeout_ms (0: 10 s) is closed.
 * Loop thread only.
 */
typedef struct ig_tls_ctx_s ig_tls_ctx_t;
void ig_http_server_set_tls(ig_http_server_t *server, ig_tls_ctx_t *ctx,
                            uint64_t handshake_timeout_ms);

/* The bound TCP port (0 for a Unix socket). */
int ig_http_server_port(const ig_http_server_t *server);

/* Replaces the limits in place (a config reload): new connections and the
 * next deadline of each open one use them; zero fields take defaults. */
void ig_http_server_set_limits(ig_http_server_t *server, const ig_http_limits_t *limits);

/* Connections open now, and requests handed to the handler but not finished. */
unsigned ig_http_server_connections(const ig_http_server_t *server);
unsigned ig_http_server_inflight(const ig_http_server_t *server);

/*
 * Graceful close: stops accepting at once, closes idle connections, lets
 * requests in flight finish (their connections close after the response) and
 * force-closes whatever is left after drain_timeout_ms. cb fires once, when
 * every handle is closed; the server is freed after it returns.
 */
void ig_http_server_close(ig_http_server_t *server, uint64_t drain_timeout_ms, ig_http_close_cb cb,
                          void *data);

/* ---- the request ------------------------------------------------------ */

const char *ig_http_req_method(const ig_http_req_t *req); /* "GET", "POST", ... */
const char *ig_http_req_path(const ig_http_req_t *req);   /* without the query */
const char *ig_http_req_query(const ig_http_req_t *req);  /* after '?', or "" */
/* Case-insensitive lookup; the first value or NULL. Borrowed. */
const char *ig_http_req_header(const ig_http_req_t *req, const char *name);
/* The whole body (de-chunked), NUL-terminated; *len may be NULL. Borrowed. */
const char *ig_http_req_body(const ig_http_req_t *req, size_t *len);
/* "ip:port" of the client, or "unix". */
const char *ig_http_req_peer(const ig_http_req_t *req);
/* Monotonic time (uv_hrtime, ns) when the request's first byte arrived. */
uint64_t ig_http_req_start_ns(const ig_http_req_t *req);
/* 1 once the client has gone away (reset, closed, or server force-close). */
int ig_http_req_aborted(const ig_http_req_t *req);

/* Memory that lives exactly as long as the request (its arena). */
void *ig_http_req_alloc(ig_http_req_t *req, size_t size);
char *ig_http_req_strdup(ig_http_req_t *req, const char *s);

/* Per-request user pointer for the handler's own state. */
void ig_http_req_set_data(ig_http_req_t *req, void *data);
void *ig_http_req_get_data(const ig_http_req_t *req);

/* The route label for metrics ("/v1/completions"); a static string. Requests
 * the handler never labels are counted under "unmatched", so that client
 * paths cannot blow up label cardinality. */
void ig_http_req_set_route(ig_http_req_t *req, const char *route);

/* Names the upstream that served the request, for the access log. Copied. */
void ig_http_req_set_upstream(ig_http_req_t *req, const char *upstream);

/* A proxied answer's timing, for the access log (ig_access_log_t): the
 * request's wait before its first attempt was sent, its time to first
 * token, and the answering attempt's own. In seconds. */
void ig_http_req_set_timing(ig_http_req_t *req, double queue_s, double ttft_s,
                            double upstream_ttft_s);

/*
 * Called once if the client goes away before the response is finished, so
 * that the backend can cancel work. The handler must still finish the
 * request (writes are then discarded); it may do so, and free its own state,
 * inside the callback. The callback always runs from a loop callback of the
 * server (a read, a write completion, a timer), never from inside another
 * ig_http_* call, so no ig_http_* call of the handler is on the stack.
 */
typedef void (*ig_http_abort_cb)(ig_http_req_t *req, void *data);
void ig_http_req_on_abort(ig_http_req_t *req, ig_http_abort_cb cb, void *data);

/* ---- the response ----------------------------------------------------- */

/* Adds a response header before the response starts. Both strings copied.
 * Content-Length, Transfer-Encoding, Connection and Date are the server's.
 * Returns 0, IG_EINVAL (one of those names, or CR/LF in a string),
 * IG_ESTATE (the response has started) or IG_ENOMEM. */
int ig_http_add_header(ig_http_req_t *req, const char *name, const char *value);

/* Sends a whole response and finishes the request. body is copied. For HEAD
 * the body is left out (Content-Length stays); 204/304 carry neither.
 * Returns 0 (also when the client is gone or the write failed: the bytes are
 * discarded), IG_ESTATE when the request was already answered, or IG_ENOMEM;
 * the request is finished in every case but IG_ESTATE, and its abort
 * callback does not run after that. */
int ig_http_respond(ig_http_req_t *req, int status, const char *content_type, const char *body,
                    size_t len);

/* Sends `{"error":{"message","type","param","code"}}` with the status and
 * finishes the request. type NULL picks one from the status
 * (invalid_request_error, not_found_error, ...); param and code may be NULL. */
int ig_http_respond_error(ig_http_req_t *req, int status, const char *type, const char *param,
                          const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/*
 * Streaming: starts a chunked response (text/event-stream for SSE). Each
 * write is sent as one chunk. A write returns 0 when the bytes are queued,
 * or IG_EBUSY when they were queued but the unsent bytes are now above
 * write_buffer_bytes: the producer should pause until the drain callback
 * fires. ig_http_stream_end() sends the last chunk and finishes the request.
 */
int ig_http_stream_start(ig_http_req_t *req, int status, const char *content_type);
/* After the client went away (or this very write failed), writes return
 * IG_ECLOSED; the request is still valid and the end still needed (see the
 * top of this file). HTTP/1.0 clients get the raw bytes, delimited by the
 * close. ig_http_stream_end returns 0 also when the client is gone. */
int ig_http_stream_write(ig_http_req_t *req, const char *data, size_t len);
int ig_http_stream_end(ig_http_req_t *req);
/* Finishes the request and closes its connection on the next turn of the
 * loop, discarding what is still unsent: for a stream whose client stopped
 * reading, whose queued bytes must not grow or linger. 0 or IG_ESTATE. */
int ig_http_stream_reset(ig_http_req_t *req);

/*
 * A tap on the response body: cb sees every body byte the handler sends
 * (unframed, also after the client went away), then once bytes NULL when
 * the request finishes, just before it is freed (ig_http_req_status() says
 * how it was answered). For accounting (the gateway's per-key tokens); it
 * must not call ig_http_* functions on req but the getters.
 */
typedef void (*ig_http_tap_cb)(ig_http_req_t *req, void *data, const char *bytes, size_t len);
void ig_http_req_on_body(ig_http_req_t *req, ig_http_tap_cb cb, void *data);
/* The status the request was answered with (0 before the answer started). */
int ig_http_req_status(const ig_http_req_t *req);

typedef void (*ig_http_drain_cb)(ig_http_req_t *req, void *data);
void ig_http_req_on_drain(ig_http_req_t *req, ig_http_drain_cb cb, void *data);
/* Unsent response bytes queued on the request's connection now. */
size_t ig_http_req_write_queued(const ig_http_req_t *req);

/* The reason phrase of a status code ("Not Found"). */
const char *ig_http_status_text(int status);

#endif
