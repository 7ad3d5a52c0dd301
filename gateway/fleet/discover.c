/*
 * DNS discovery (see include/infergate/discover.h) over c-ares: a timer
 * starts each resolution; c-ares's sockets are watched by uv_poll handles
 * (its socket-state callback opens and closes them) and its retries by a
 * second timer, so nothing blocks the loop and no thread is used.
 */
#include "infergate/discover.h"
#include "infergate/error.h"
#include "infergate/log.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUERY_TIMEOUT_MS 2000
#define QUERY_TRIES 2
#define CLASS_IN 1
#define TYPE_SRV 33

/* One socket of c-ares's, watched on the loop. */
typedef struct watch_s {
    uv_poll_t poll;
    ares_socket_t fd;
    struct ig_discover_s *d;
    struct watch_s *next;
} watch_t;

struct ig_discover_s {
    uv_loop_t *loop;
    char *name;
    int port; /* 0: the name's SRV records give each address's port */
    uint64_t interval_ms;
    ig_discover_cb cb;
    void *data;
    ares_channel ch;
    int ch_ok;
    uv_timer_t timer;   /* the next resolution */
    uv_timer_t retries; /* c-ares's timeouts */
    watch_t *watches;
    int handles;               /* open handles: the timers and the watches */
    int closing;               /* ig_discover_close ran: no callbacks */
    int pending;               /* lookups of this resolution not yet answered */
    int failed;                /* one of them failed: the resolution fails */
    ig_discover_addr_t *found; /* IG_DISCOVER_MAX_ADDRS */
    int nfound;
    unsigned answers, failures;
};

static void schedule(ig_discover_t *d, uint64_t ms);

/* ---- the answer ------------------------------------------------------------ */

static int cmp_found(const void *a, const void *b)
{
    const ig_discover_addr_t *x = a, *y = b;
    int c = strcmp(x->addr, y->addr);
    return c != 0 ? c : (x->port > y->port) - (x->port < y->port);
}

/* The end of a resolution, when its last lookup is answered: the whole set
 * goes to the callback, sorted and without duplicates; a failure keeps the
 * last set. */
static void lookup_done(ig_discover_t *d)
{
    if (--d->pending > 0 || d->closing)
        return;
    if (!d->failed) {
        qsort(d->found, (size_t)d->nfound, sizeof(d->found[0]), cmp_found);
        int n = 0;
        for (int i = 0; i < d->nfound; i++)
            if (n == 0 || cmp_found(&d->found[n - 1], &d->found[i]) != 0)
                d->found[n++] = d->found[i];
        d->answers++;
        d->cb(d->data, d->found, n);
    } else {
        d->failures++;
        if (d->failures == 1 || d->failures % 60 == 0)
            IG_WARN("discover %s: resolution failed (%u times); the last set stays", d->name,
                    d->failures);
    }
    schedule(d, d->interval_ms);
}

/* A name that does not exist, or has no record of the type, is an answer:
 * the empty set. */
static int authoritative(int status)
{
    return status == ARES_SUCCESS || status == ARES_ENOTFOUND || status == ARES_ENODATA;
}

typedef struct {
    ig_discover_t *d;
    int port;
} addr_query_t;

static void on_addrinfo(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
    addr_query_t *q = arg;
    ig_discover_t *d = q->d;
    (void)timeouts;
    if (!authoritative(status))
        d->failed = 1;
    for (struct ares_addrinfo_node *n = res ? res->nodes : NULL; n != NULL; n = n->ai_next) {
        const void *a = n->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)n->ai_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)n->ai_addr)->sin6_addr;
        if ((n->ai_family == AF_INET || n->ai_family == AF_INET6) &&
            d->nfound < IG_DISCOVER_MAX_ADDRS &&
            inet_ntop(n->ai_family, a, d->found[d->nfound].addr, 46) != NULL)
            d->found[d->nfound++].port = q->port;
    }
    if (res != NULL)
        ares_freeaddrinfo(res);
    free(q);
    lookup_done(d);
}

/* Asks for name's A and AAAA records, each to be an address at port. */
static void lookup_addrs(ig_discover_t *d, const char *name, int port)
{
    addr_query_t *q = malloc(sizeof(*q));
    d->pending++;
    if (q == NULL) {
        d->failed = 1;
        lookup_done(d);
        return;
    }
    q->d = d;
    q->port = port;
    struct ares_addrinfo_hints hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_flags = ARES_AI_NOSORT;
    ares_getaddrinfo(d->ch, name, NULL, &hints, on_addrinfo, q);
}

static void on_srv(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
    ig_discover_t *d = arg;
    (void)timeouts;
    struct ares_srv_reply *srv = NULL;
    if (status == ARES_SUCCESS && ares_parse_srv_reply(abuf, alen, &srv) != ARES_SUCCESS)
        status = ARES_EBADRESP;
    if (!authoritative(status))
        d->failed = 1;
    /* Each target's addresses at its port; the resolution ends with the
     * last of them (lookup_done counts this answer as one). */
    for (struct ares_srv_reply *s = srv; s != NULL && !d->closing; s = s->next)
        lookup_addrs(d, s->host, s->port);
    if (srv != NULL)
        ares_free_data(srv);
    lookup_done(d);
}

static void resolve_now(ig_discover_t *d)
{
    d->nfound = 0;
    d->failed = 0;
    d->pending = 1; /* this function's own, so that no answer ends it early */
    if (d->port > 0) {
        lookup_addrs(d, d->name, d->port);
    } else {
        d->pending++;
        ares_query(d->ch, d->name, CLASS_IN, TYPE_SRV, on_srv, d);
    }
    lookup_done(d);
}

/* ---- c-ares on the loop ------------------------------------------------------ */

static void arm_retries(ig_discover_t *d);

static void on_handle_closed(uv_handle_t *h)
{
    ig_discover_t *d = h->data;
    if (h->type == UV_POLL)
        free(h);
    if (--d->handles > 0)
        return;
    free(d->found);
    free(d->name);
    free(d);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    watch_t *w = (watch_t *)p;
    ig_discover_t *d = w->d;
    /* An error on the socket is c-ares's to see: it reads and fails. */
    int rd = status < 0 || (events & UV_READABLE), wr = status == 0 && (events & UV_WRITABLE);
    ares_process_fd(d->ch, rd ? w->fd : ARES_SOCKET_BAD, wr ? w->fd : ARES_SOCKET_BAD);
    arm_retries(d);
}

/* c-ares opens, watches and closes its sockets through this. */
static void on_sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
    ig_discover_t *d = data;
    watch_t **pw = &d->watches;
    while (*pw != NULL && (*pw)->fd != fd)
        pw = &(*pw)->next;
    watch_t *w = *pw;
    if (!readable && !writable) {
        if (w != NULL) {
            *pw = w->next;
            uv_poll_stop(&w->poll);
            uv_close((uv_handle_t *)&w->poll, on_handle_closed);
        }
        return;
    }
    if (w == NULL) {
        w = calloc(1, sizeof(*w));
        if (w == NULL || uv_poll_init_socket(d->loop, &w->poll, fd) != 0) {
            free(w); /* c-ares times the query out */
            return;
        }
        w->fd = fd;
        w->d = d;
        w->poll.data = d;
        w->next = d->watches;
        d->watches = w;
        d->handles++;
    }
    uv_poll_start(&w->poll, (readable ? UV_READABLE : 0) | (writable ? UV_WRITABLE : 0), on_poll);
}

static void on_retries(uv_timer_t *t)
{
    ig_discover_t *d = t->data;
    ares_process_fd(d->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    arm_retries(d);
}

/* The retry timer at c-ares's next deadline, or stopped when none. */
static void arm_retries(ig_discover_t *d)
{
    struct timeval tv;
    if (d->closing)
        return;
    if (ares_timeout(d->ch, NULL, &tv) == NULL) {
        uv_timer_stop(&d->retries);
        return;
    }
    uint64_t ms = (uint64_t)tv.tv_sec * 1000 + (uint64_t)(tv.tv_usec + 999) / 1000;
    uv_timer_start(&d->retries, on_retries, ms, 0);
}

static void on_timer(uv_timer_t *t)
{
    ig_discover_t *d = t->data;
    resolve_now(d);
    arm_retries(d);
}

static void schedule(ig_discover_t *d, uint64_t ms)
{
    if (!d->closing)
        uv_timer_start(&d->timer, on_timer, ms, 0);
}

/* ---- start and close ------------------------------------------------------- */

static int lib_rc;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

static void lib_init(void)
{
    lib_rc = ares_library_init(ARES_LIB_INIT_ALL);
}

/* The channel: 2 s per try, 2 tries; with a resolver, that server alone
 * and no hosts file ("b": DNS only). */
static int open_channel(ig_discover_t *d, const char *resolver)
{
    struct ares_options o;
    memset(&o, 0, sizeof(o));
    o.sock_state_cb = on_sock_state;
    o.sock_state_cb_data = d;
    o.timeout = QUERY_TIMEOUT_MS;
    o.tries = QUERY_TRIES;
    o.lookups = (char *)"b";
    int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES;
    if (resolver != NULL)
        mask |= ARES_OPT_LOOKUPS;
    pthread_once(&lib_once, lib_init);
    if (lib_rc != ARES_SUCCESS || ares_init_options(&d->ch, &o, mask) != ARES_SUCCESS)
        return IG_ENOMEM;
    d->ch_ok = 1;
    if (resolver != NULL && ares_set_servers_ports_csv(d->ch, resolver) != ARES_SUCCESS)
        return IG_EINVAL;
    return 0;
}

int ig_discover_start(ig_discover_t **out, uv_loop_t *loop, const ig_discover_spec_t *spec,
                      ig_discover_cb cb, void *data)
{
    if (spec->port < 0 || spec->port > 65535)
        return IG_EINVAL;
    ig_discover_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return IG_ENOMEM;
    d->loop = loop;
    d->name = strdup(spec->name);
    d->found = calloc(IG_DISCOVER_MAX_ADDRS, sizeof(d->found[0]));
    d->port = spec->port;
    d->interval_ms = spec->interval_ms > 0 ? spec->interval_ms : 10000;
    d->cb = cb;
    d->data = data;
    int rc = IG_ENOMEM;
    if (d->name == NULL || d->found == NULL || (rc = open_channel(d, spec->resolver)) != 0) {
        if (d->ch_ok)
            ares_destroy(d->ch);
        free(d->found);
        free(d->name);
        free(d);
        return rc;
    }
    uv_timer_init(loop, &d->timer);
    uv_timer_init(loop, &d->retries);
    d->timer.data = d;
    d->retries.data = d;
    d->handles = 2;
    on_timer(&d->timer);
    *out = d;
    return 0;
}

void ig_discover_close(ig_discover_t *d)
{
    if (d == NULL || d->closing)
        return;
    d->closing = 1;
    /* Ends the lookups in flight (their callbacks see closing) and closes
     * c-ares's sockets, which closes their watches. */
    ares_destroy(d->ch);
    uv_close((uv_handle_t *)&d->timer, on_handle_closed);
    uv_close((uv_handle_t *)&d->retries, on_handle_closed);
}

unsigned ig_discover_answers(const ig_discover_t *d)
{
    return d->answers;
}

unsigned ig_discover_failures(const ig_discover_t *d)
{
    return d->failures;
}
