#ifndef INFERGATE_UPSTREAM_INTERNAL_H
#define INFERGATE_UPSTREAM_INTERNAL_H

/*
 * The upstream client's state (include/infergate/upstream.h), shared by
 * upstream.c (connections, the cap, deadlines, reading and writing) and
 * upstream_parse.c (the response parser's callbacks). Private to route/.
 */

#include "infergate/tls.h"
#include "infergate/upstream.h"

#include "base/list.h"

#include <llhttp.h>
#include <netdb.h>
#include <stdint.h>

#define MAX_RESP_HEADERS 64
#define MAX_ADDRS 8
/* A name that failed to resolve is not asked again sooner than this: a
 * burst of connections to a dead name costs one lookup, not one each. */
#define RESOLVE_RETRY_NS (1000ULL * 1000000ULL)

typedef struct conn_s conn_t;

/* One uv_getaddrinfo in flight. It outlives a closed upstream (up is then
 * NULL) because the thread pool cannot be interrupted; the answer frees it. */
typedef struct {
    uv_getaddrinfo_t req;
    ig_upstream_t *up;
} resolve_t;

struct ig_upstream_s {
    uv_loop_t *loop;
    char *name;
    char *host;   /* Host header value */
    char *prefix; /* path prefix from the URL, "" when none */
    int is_unix;
    char *unix_path;
    ig_upstream_opts_t opts;
    int https;             /* every connection speaks TLS on tls_ctx */
    ig_tls_ctx_t *tls_ctx; /* a reference of our own */
    char *tls_name;        /* the name the certificate must carry */
    char *headers;         /* opts.headers, copied */
    ig_list_t idle;        /* pooled connections (conn_t.idle_node), most recent first */
    unsigned nidle;
    unsigned nconns; /* open or opening */
    ig_list_t reqs;  /* every request not yet done (ig_upstream_req_t.node) */
    unsigned nheld;  /* requests unlinked but still inside a callback */
    int closing;
    void (*close_cb)(void *data);
    void *close_data;
    /* TCP addresses: a literal one, or the last answer for resolve_name. */
    char *resolve_name; /* the host without brackets; NULL for a literal or unix */
    char port[8];
    struct sockaddr_storage addrs[MAX_ADDRS];
    int naddrs;
    int cur_addr;             /* the address new connections use */
    int addr_failures;        /* connects failed since the last success or resolution */
    int stale;                /* every address failed: resolve before connecting again */
    uint64_t resolved_ns;     /* last good answer */
    uint64_t resolve_fail_ns; /* last failed lookup, 0 after a good one */
    resolve_t *resolving;     /* lookup in flight, or NULL */
    ig_list_t addr_wait;      /* connections waiting for an address (conn_t.wait_node) */
    /* The connection cap and the idle trim (see "the cap and the trim"). */
    unsigned nclosing;     /* counted in nconns until their handles are closed */
    unsigned max_conns;    /* open connections at most; 0 = no cap */
    ig_list_t pending;     /* requests waiting under the cap (ig_upstream_req_t.pend_node) */
    uv_timer_t trim_timer; /* the trim and the pending requests' deadlines */
    int trim_open;         /* trim_timer not yet closed */
    unsigned peak_busy, peak_prev; /* busy connections at most, this and the last window */
    uint64_t window_ns;            /* when this window began */
    int kicking;                   /* inside pending_kick */
    double ttfb_ewma_s;            /* time to a response's first byte, on average */
    int backlog_seen; /* requests looked unread while connections idled (see on_trim) */
};

struct conn_s {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_timer_t timer;
    /* The one deadline the timer serves (see conn_deadline): its loop time
     * in ms and what passing it means (NULL: none); and when the timer is
     * due, which may be earlier. */
    uint64_t deadline_ms;
    uv_timer_cb deadline_cb;
    uint64_t timer_due_ms;
    uv_connect_t connect;
    ig_upstream_t *up;
    ig_list_t idle_node; /* in up->idle */
    ig_list_t wait_node; /* in up->addr_wait */
    llhttp_t parser;
    ig_upstream_req_t *req; /* in flight, or NULL when idle */
    int handles_open;       /* the stream and the timer */
    int closing;
    int reused;           /* has carried a request before */
    int waiting_addr;     /* in up->addr_wait */
    int addr_index;       /* which of up->addrs it connects to */
    int fail_err;         /* a failure on_conn_fail reports */
    ig_tls_stream_t *tls; /* https: the session, NULL until connected */
    /* Set by on_message_complete, acted on by on_read. */
    int msg_done;
    int msg_keep_alive;
};

struct ig_upstream_req_s {
    ig_upstream_t *up;
    conn_t *conn;
    ig_list_t node;      /* in up->reqs */
    ig_list_t pend_node; /* in up->pending while it waits under the cap */
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
    int in_cb;         /* inside a user callback: ending it waits for the return */
    int end_pending;   /* ended while in_cb: on_read finishes it with end_err */
    int end_err;
    int unlinked;  /* out of up->reqs (counted in up->nheld while end_pending) */
    int finishing; /* on_done is running: cancel and finish do nothing */
    /* response headers being parsed */
    char *hbuf;
    size_t hlen, hcap;
    int nheaders;
    int in_value;
    /* Last, not zeroed by ig_upstream_request: [0, nheaders) are written
     * before they are read. */
    size_t name_off[MAX_RESP_HEADERS], value_off[MAX_RESP_HEADERS];
};

/* The llhttp settings of every connection's response parser: header
 * fields and values gathered into the request's hbuf, the user's headers
 * and body callbacks, and the message's end only recorded for on_read
 * (upstream_parse.c). */
const llhttp_settings_t *ig__upstream_parser_settings(void);

#endif
