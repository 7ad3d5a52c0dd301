#ifndef INFERGATE_HTTP_INTERNAL_H
#define INFERGATE_HTTP_INTERNAL_H

/*
 * Private to gateway/http/: the request object, its arena, the parsing core
 * (ig__http_parser, usable without sockets so that the fuzzer drives the
 * exact code the server runs) and the connection/server handles.
 */

#include "infergate/http.h"

#include <llhttp.h>
#include <stdint.h>

/* ---- arena ------------------------------------------------------------ */

typedef struct ig__arena_block_s {
    struct ig__arena_block_s *next;
    size_t cap;
    size_t used;
    _Alignas(16) char data[];
} ig__arena_block_t;

/* First block lives inside the request, so small requests never malloc. */
#define IG__ARENA_INLINE 4096

typedef struct {
    ig__arena_block_t *blocks; /* malloc'ed overflow blocks */
    size_t used;               /* of inline */
    _Alignas(16) char inline_buf[IG__ARENA_INLINE];
} ig__arena_t;

void ig__arena_init(ig__arena_t *a);
void *ig__arena_alloc(ig__arena_t *a, size_t size);
void ig__arena_dispose(ig__arena_t *a);

/* ---- request ---------------------------------------------------------- */

typedef struct {
    const char *name;
    const char *value;
    size_t nlen;
    size_t vlen;
} ig__http_header_t;

typedef struct ig__http_conn_s ig__http_conn_t;

/* Finished request objects kept for reuse, so that keep-alive traffic does
 * not malloc per request. One per server; loop thread only. */
typedef struct {
    struct ig_http_req_s *free;
    unsigned count;
} ig__http_reqpool_t;

typedef struct ig__http_out_header_s {
    struct ig__http_out_header_s *next;
    const char *name;
    const char *value;
    size_t nlen, vlen; /* measured once, when added */
} ig__http_out_header_t;

enum {
    IG__REQ_FRESH = 0, /* queued, not yet dispatched */
    IG__REQ_DISPATCHED,
    IG__REQ_STREAMING,
    IG__REQ_FINISHED,
};

struct ig_http_req_s {
    struct ig_http_req_s *next; /* pipeline queue / free list */
    ig__http_conn_t *conn;      /* NULL once detached (client gone) */
    ig__http_reqpool_t *pool;   /* where it goes when freed; NULL: free() */
    int state;
    int error_status;      /* protocol error: answered by the server itself */
    const char *error_msg; /* static */
    int keep_alive;
    int http_minor; /* 0 or 1 */
    int aborted;
    int chunked_out; /* streaming with chunked framing */
    int head_only;   /* HEAD: no body on the wire */
    const char *method;
    char *path;
    char *query;
    ig__http_header_t *headers;
    unsigned nheaders;
    char *body;
    size_t body_len;
    size_t body_cap;
    int body_heap; /* body was malloc'ed (chunked growth) */
    uint64_t start_ns;
    uint64_t bytes_in;
    uint64_t bytes_out;
    int status;
    const char *route;
    char *upstream;
    int timed; /* the three below were set (ig_http_req_set_timing) */
    double queue_s, ttft_s, upstream_ttft_s;
    char peer[64];
    void *data;
    ig_http_abort_cb abort_cb;
    void *abort_data;
    ig_http_drain_cb drain_cb;
    void *drain_data;
    ig_http_tap_cb tap_cb;
    void *tap_data;
    ig__http_out_header_t *out_headers;
    ig__http_out_header_t **out_tail;
    size_t budget; /* bytes charged to the buffer budget (its body) */
    ig__arena_t arena;
};

/* ---- the process-wide buffer budget ----------------------------------- */

/* Bytes of request bodies, read buffers and unsent output held by every
 * server of the process (ig_http_limits_t.max_buffered_bytes). Any thread. */
size_t ig__http_budget_used(void);
/* Charges n bytes if that keeps the total within limit: 0, or -1 (nothing
 * charged). */
int ig__http_budget_take(size_t n, size_t limit);
/* Charges n bytes unconditionally (memory that is already committed). */
void ig__http_budget_charge(size_t n);
void ig__http_budget_release(size_t n);

/* pool may be NULL (plain malloc/free). */
ig_http_req_t *ig__http_req_new(ig__http_reqpool_t *pool);
void ig__http_req_free(ig_http_req_t *req);
void ig__http_reqpool_dispose(ig__http_reqpool_t *pool);

/* ---- parsing core ----------------------------------------------------- */

enum {
    IG__PARSE_HEAD = 0,
    IG__PARSE_BODY,
};

typedef struct {
    llhttp_t ll;
    llhttp_settings_t settings;
    const ig_http_limits_t *limits;
    ig__http_reqpool_t *pool;
    int phase;
    /* header pre-scan, offsets relative to the data passed in */
    size_t scan;
    size_t line_start;
    size_t head_start; /* first byte of the request line (after leading CRLFs) */
    size_t hdr_start;  /* first byte after the request line */
    unsigned lines;
    unsigned nheaders;
    /* the request being built */
    ig_http_req_t *req;
    const char *copy; /* arena copy of the header block being fed to llhttp */
    const char *url;
    size_t url_len;
    unsigned hcap;
    int in_trailers;
    int complete;
    int want_continue;
    int err_status;
    const char *err_msg;
    /* chunked framing validator (llhttp 8.1 does not check the CRLF after
     * chunk data) */
    int cstate;
    uint64_t csize;
    size_t ctrailer_bytes;
    size_t cext_bytes; /* of the current chunk's extensions */
    size_t cext_total; /* of every chunk extension of this body */
} ig__http_parser_t;

void ig__http_parser_init(ig__http_parser_t *p, const ig_http_limits_t *limits,
                          ig__http_reqpool_t *pool);
void ig__http_parser_dispose(ig__http_parser_t *p);

/* 1 when no byte of a next request has been seen. */
int ig__http_parser_idle(const ig__http_parser_t *p);

/*
 * Feeds data (starting at the first unconsumed byte of the connection).
 * Returns the bytes consumed (>= 0) and sets *out to a complete request when
 * one finished (the caller owns it then); the parser stops after each
 * request. In the header phase it consumes nothing until the whole header
 * block is there (it remembers how far it scanned, so repeated calls with
 * growing data stay linear). On a protocol error it returns IG_EPARSE and
 * *out is a request with error_status/error_msg set (the connection must
 * answer it and close).
 */
int ig__http_parser_feed(ig__http_parser_t *p, const char *data, size_t len, ig_http_req_t **out);

/* Builds an error pseudo-request for the server to answer (e.g. 408). */
ig_http_req_t *ig__http_error_req(ig__http_reqpool_t *pool, int status, const char *msg);

/* ---- what a request asks of its connection ---------------------------- */

/* The connection is above the request (server.c owns both): request.c
 * reaches it through these, which server.c sets when the program starts. */
typedef struct {
    /* Queues bytes to the request's connection (copies what is not
     * written at once). Discards when detached. */
    int (*send)(ig_http_req_t *req, const char *data, size_t len);
    /* The request has been completely answered. */
    void (*finished)(ig_http_req_t *req);
    /* Bytes queued on the connection, not yet written. */
    size_t (*queued)(const ig_http_req_t *req);
    /* Whether the connection closes after this response. */
    int (*closing)(const ig_http_req_t *req);
    /* The Date header's value, cached per second. */
    const char *(*date)(const ig_http_req_t *req);
} ig__http_conn_ops_t;

extern const ig__http_conn_ops_t *ig__http_conn_ops;

/* Test hooks: parsed requests waiting (not dispatched), unparsed buffered
 * bytes, and connections reading now, summed over the server's
 * connections. Loop thread only. */
unsigned ig__http_server_queued(const ig_http_server_t *s);
size_t ig__http_server_buffered(const ig_http_server_t *s);
unsigned ig__http_server_reading(const ig_http_server_t *s);

#endif
