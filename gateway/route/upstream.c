/*
 * The upstream client: keep-alive HTTP/1.1 connection pools on libuv +
 * llhttp (see include/infergate/upstream.h).
 *
 * A connection carries one request at a time. Its one timer serves the
 * request's deadlines while busy, a failure that must not be reported from
 * inside the caller's own call, and the keep-alive idle close while pooled,
 * so a request needs no handle of its own and is freed right after its
 * done callback. The timer is moved only to an earlier time: a deadline
 * that is cleared or pushed later leaves it running, and when it fires it
 * is set again for whatever deadline stands then (conn_deadline), so a
 * request on a pooled connection costs no timer operation.
 *
 * Nothing is freed inside the parser: llhttp's callbacks only record (the
 * message completed, a user callback asked to end the request), and
 * on_read acts on that once llhttp_execute or llhttp_finish has returned.
 * A request's user callbacks run with r->in_cb raised; ending it meanwhile
 * (cancel, close of the upstream) is recorded and carried out at that same
 * safe point.
 *
 * Names are resolved with uv_getaddrinfo on the loop's thread pool, never
 * blocking the loop. A connection that needs an address waits for it (its
 * connect deadline runs meanwhile); see conn_connect for when a name is
 * resolved again.
 */
#include "infergate/upstream.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/tls.h"

#include "base/list.h"
#include "upstream_internal.h"

#include <llhttp.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void ig_upstream_opts_default(ig_upstream_opts_t *o)
{
    o->connect_timeout_ms = 2000;
    o->first_byte_timeout_ms = 60000;
    o->idle_timeout_ms = 30000;
    o->total_timeout_ms = 600000;
    o->max_idle_connections = 64;
    o->keepalive_idle_ms = 30000;
    o->max_response_header_bytes = 64 * 1024;
    o->resolve_ttl_ms = 30000;
    o->max_connections = 0;
    o->idle_trim_ms = 1000;
    o->tls = NULL;
    o->tls_server_name = NULL;
    o->headers = NULL;
}

static void conn_close(conn_t *c);
static void req_finish(ig_upstream_req_t *r, int err);
static void pending_kick(ig_upstream_t *u);
static void req_send(ig_upstream_req_t *r);
static void on_trim(uv_timer_t *t);
static int conn_start(ig_upstream_req_t *r);
static void conn_connect(conn_t *c);

/* ---- the upstream ------------------------------------------------------- */

/* "HOST[:PORT]" or "[V6][:PORT]": the port defaults to 80, as http:// says
 * (443 for https://). */
static int parse_host_port(ig_upstream_t *u, char *hostport)
{
    char *host = hostport;
    char *port = NULL;
    if (host[0] == '[') {
        char *end = strchr(host, ']');
        if (end == NULL || (end[1] != ':' && end[1] != '\0'))
            return IG_EINVAL;
        if (end[1] == ':')
            port = end + 2;
        *end = '\0';
        host++;
    } else {
        port = strchr(host, ':');
        if (port != NULL) {
            if (strchr(port + 1, ':') != NULL)
                return IG_EINVAL; /* a bare IPv6 address needs brackets */
            *port++ = '\0';
        }
    }
    long pv = u->https ? 443 : 80;
    if (port != NULL) {
        char *end;
        pv = *port >= '0' && *port <= '9' ? strtol(port, &end, 10) : 0;
        if (pv < 1 || pv > 65535 || *end != '\0')
            return IG_EINVAL;
    }
    if (*host == '\0')
        return IG_EINVAL;
    if (u->https && (u->tls_name = strdup(host)) == NULL)
        return IG_ENOMEM;
    snprintf(u->port, sizeof(u->port), "%ld", pv);
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    if (uv_ip4_addr(host, (int)pv, &a4) == 0) {
        memcpy(&u->addrs[0], &a4, sizeof(a4));
        u->naddrs = 1;
    } else if (strchr(host, ':') != NULL && uv_ip6_addr(host, (int)pv, &a6) == 0) {
        memcpy(&u->addrs[0], &a6, sizeof(a6));
        u->naddrs = 1;
    } else {
        u->resolve_name = strdup(host);
        if (u->resolve_name == NULL)
            return IG_ENOMEM;
    }
    return 0;
}

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
    else if (strncmp(hp, "https://", 8) == 0 && (u->https = 1))
        hp += 8;
    else if (strstr(hp, "://") != NULL)
        return IG_EINVAL; /* other schemes: not spoken here */
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
    return parse_host_port(u, hostport);
}

static void upstream_free(ig_upstream_t *u)
{
    free(u->name);
    free(u->host);
    free(u->prefix);
    free(u->unix_path);
    free(u->resolve_name);
    free(u->tls_name);
    free(u->headers);
    ig_tls_ctx_unref(u->tls_ctx);
    free(u);
}

static void resolve_start(ig_upstream_t *u);

/* https: the context to verify with and the name to check; opts.headers. */
static int tls_setup(ig_upstream_t *u)
{
    char err[256];
    if (u->opts.headers != NULL && (u->headers = strdup(u->opts.headers)) == NULL)
        return IG_ENOMEM;
    if (!u->https)
        return 0;
    if (u->opts.tls_server_name != NULL) {
        free(u->tls_name);
        if ((u->tls_name = strdup(u->opts.tls_server_name)) == NULL)
            return IG_ENOMEM;
    }
    if (u->opts.tls != NULL) {
        ig_tls_ctx_ref(u->opts.tls);
        u->tls_ctx = u->opts.tls;
    } else if (ig_tls_client_ctx_new(&u->tls_ctx, NULL, 0, err, sizeof(err)) != 0) {
        IG_ERROR("upstream %s: %s", u->name, err);
        return IG_EINVAL;
    }
    return 0;
}

int ig_upstream_start(ig_upstream_t **out, uv_loop_t *loop, const char *name, const char *address,
                      const ig_upstream_opts_t *opts)
{
    ig_upstream_t *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return IG_ENOMEM;
    ig_list_init(&u->idle);
    ig_list_init(&u->reqs);
    ig_list_init(&u->addr_wait);
    ig_list_init(&u->pending);
    u->loop = loop;
    u->name = strdup(name);
    if (opts != NULL)
        u->opts = *opts;
    else
        ig_upstream_opts_default(&u->opts);
    int rc = u->name ? parse_address(u, address) : IG_ENOMEM;
    if (rc != 0)
        goto fail;
    if ((rc = tls_setup(u)) != 0)
        goto fail;
    u->max_conns = u->opts.max_connections;
    /* The trim timer does not keep the loop alive: it only tidies. */
    uv_timer_init(loop, &u->trim_timer);
    u->trim_timer.data = u;
    u->trim_open = 1;
    u->window_ns = uv_hrtime();
    uv_timer_start(&u->trim_timer, on_trim, 100, 100);
    uv_unref((uv_handle_t *)&u->trim_timer);
    /* Look the name up now, so that the first request finds it known. */
    if (u->resolve_name != NULL)
        resolve_start(u);
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

int ig_upstream_resolved(const ig_upstream_t *u)
{
    return u->is_unix || u->naddrs > 0;
}

static void maybe_finish_close(ig_upstream_t *u)
{
    if (!u->closing || u->nconns > 0 || !ig_list_empty(&u->reqs) || u->nheld > 0 || u->trim_open)
        return;
    void (*cb)(void *) = u->close_cb;
    void *data = u->close_data;
    upstream_free(u);
    if (cb != NULL)
        cb(data);
}

static void on_trim_closed(uv_handle_t *h)
{
    ig_upstream_t *u = h->data;
    u->trim_open = 0;
    maybe_finish_close(u);
}

void ig_upstream_close(ig_upstream_t *u, void (*cb)(void *data), void *data)
{
    u->closing = 1;
    u->close_cb = cb;
    u->close_data = data;
    if (u->resolving != NULL) {
        /* The lookup may be running already; its answer is then dropped. */
        u->resolving->up = NULL;
        uv_cancel((uv_req_t *)&u->resolving->req);
        u->resolving = NULL;
    }
    /* A request inside one of its callbacks is unlinked at once and ended
     * when the callback returns, so this loop always shortens the list. */
    ig_list_t *n;
    while ((n = ig_list_first(&u->reqs)) != NULL)
        req_finish(IG_LIST_DATA(n, ig_upstream_req_t, node), IG_ECANCELED);
    while ((n = ig_list_pop_front(&u->idle)) != NULL) {
        u->nidle--;
        conn_close(IG_LIST_DATA(n, conn_t, idle_node));
    }
    uv_close((uv_handle_t *)&u->trim_timer, on_trim_closed);
    maybe_finish_close(u);
}

/* ---- names and addresses ------------------------------------------------- */

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    resolve_t *rs = req->data;
    ig_upstream_t *u = rs->up;
    free(rs);
    if (u == NULL) { /* closed meanwhile */
        uv_freeaddrinfo(res);
        return;
    }
    u->resolving = NULL;
    int n = 0;
    for (struct addrinfo *ai = status == 0 ? res : NULL; ai != NULL && n < MAX_ADDRS;
         ai = ai->ai_next) {
        if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
            ai->ai_addrlen <= sizeof(u->addrs[0]))
            memcpy(&u->addrs[n++], ai->ai_addr, ai->ai_addrlen);
    }
    uv_freeaddrinfo(res);
    uint64_t now = uv_hrtime();
    if (n > 0) {
        if (u->resolve_fail_ns != 0 || u->resolved_ns == 0)
            IG_INFO("upstream %s: %s resolves (%d address%s)", u->name, u->resolve_name, n,
                    n == 1 ? "" : "es");
        u->naddrs = n;
        u->cur_addr = 0;
        u->addr_failures = 0;
        u->resolved_ns = now;
        u->resolve_fail_ns = 0;
    } else {
        if (u->resolve_fail_ns == 0)
            IG_WARN("upstream %s: cannot resolve %s: %s%s", u->name, u->resolve_name,
                    status != 0 ? uv_strerror(status) : "no address",
                    u->naddrs > 0 ? " (keeping the last answer)" : "");
        u->resolve_fail_ns = now;
        /* The last good answer, if any, serves until a lookup succeeds. */
        u->addr_failures = 0;
    }
    u->stale = 0;
    /* Every waiting connection connects now, or fails: an address is there
     * or the lookup failed, so conn_connect decides without waiting again. */
    ig_list_t list, *w;
    ig_list_move(&list, &u->addr_wait);
    while ((w = ig_list_pop_front(&list)) != NULL) {
        conn_t *c = IG_LIST_DATA(w, conn_t, wait_node);
        c->waiting_addr = 0;
        conn_connect(c);
    }
}

static void resolve_start(ig_upstream_t *u)
{
    if (u->resolving != NULL || u->closing)
        return;
    resolve_t *rs = calloc(1, sizeof(*rs));
    if (rs == NULL)
        return; /* the waiting connections meet their connect deadline */
    rs->up = u;
    rs->req.data = rs;
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM; /* no AI_ADDRCONFIG: it hides localhost on a bare host */
    u->resolving = rs;
    int rc = uv_getaddrinfo(u->loop, &rs->req, on_resolved, u->resolve_name, u->port, &hints);
    if (rc != 0) {
        u->resolving = NULL;
        free(rs);
        IG_WARN("upstream %s: cannot resolve %s: %s", u->name, u->resolve_name, uv_strerror(rc));
        u->resolve_fail_ns = uv_hrtime();
    }
}

/* A connect to one of the addresses failed (refused, unreachable, timed
 * out): new connections try the next one; once all have failed the name is
 * resolved again before the next connect. */
static void note_connect_failed(ig_upstream_t *u, int index)
{
    if (u->is_unix || u->resolve_name == NULL || u->naddrs == 0)
        return;
    if (index == u->cur_addr)
        u->cur_addr = (u->cur_addr + 1) % u->naddrs;
    if (++u->addr_failures >= u->naddrs)
        u->stale = 1;
}

/* ---- connections --------------------------------------------------------- */

static void conn_on_handle_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->handles_open > 0)
        return;
    ig_upstream_t *u = c->up;
    u->nconns--;
    u->nclosing--;
    free(c);
    maybe_finish_close(u);
}

static void wait_remove(conn_t *c)
{
    if (!ig_list_linked(&c->wait_node))
        return;
    ig_list_remove(&c->wait_node);
    c->waiting_addr = 0;
}

/* Closes a connection that is not in the idle list. */
static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    c->up->nclosing++;
    if (c->waiting_addr)
        wait_remove(c);
    if (c->req != NULL && c->req->conn == c)
        c->req->conn = NULL;
    c->req = NULL;
    ig_tls_stream_close(c->tls);
    c->tls = NULL;
    uv_close((uv_handle_t *)&c->timer, conn_on_handle_closed);
    uv_close(&c->h.handle, conn_on_handle_closed);
    /* Room under the cap: the oldest waiting request connects. */
    pending_kick(c->up);
}

static void idle_remove(ig_upstream_t *u, conn_t *c)
{
    if (!ig_list_linked(&c->idle_node))
        return;
    ig_list_remove(&c->idle_node);
    u->nidle--;
}

static void on_conn_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    uv_timer_cb cb = c->deadline_cb;
    if (cb == NULL)
        return; /* cleared since it was set: the timer stays off */
    uint64_t now = uv_now(t->loop);
    if (now < c->deadline_ms) { /* pushed later since it was set */
        c->timer_due_ms = c->deadline_ms;
        uv_timer_start(t, on_conn_timer, c->deadline_ms - now, 0);
        return;
    }
    c->deadline_cb = NULL;
    cb(t);
}

/* The connection's deadline becomes ms from now, when cb runs (with the
 * timer, as a uv_timer_cb would); the timer is set only when it is off or
 * due later than that. */
static void conn_deadline(conn_t *c, uv_timer_cb cb, uint64_t ms)
{
    uint64_t at = uv_now(c->timer.loop) + ms;
    c->deadline_ms = at;
    c->deadline_cb = cb;
    if (!uv_is_active((uv_handle_t *)&c->timer) || c->timer_due_ms > at) {
        c->timer_due_ms = at;
        uv_timer_start(&c->timer, on_conn_timer, ms, 0);
    }
}

static void conn_deadline_clear(conn_t *c)
{
    c->deadline_cb = NULL;
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

/* ---- the cap and the trim ------------------------------------------------ */

static unsigned live_conns(const ig_upstream_t *u)
{
    return u->nconns - u->nclosing;
}

static int at_cap(const ig_upstream_t *u)
{
    return u->max_conns > 0 && live_conns(u) >= u->max_conns;
}

static void note_busy(ig_upstream_t *u)
{
    unsigned busy = live_conns(u) - u->nidle;
    if (busy > u->peak_busy)
        u->peak_busy = busy;
}

/*
 * How many requests on fresh connections (other than c) look unread: no
 * byte back yet, and sent before the one that just ended on c (sent at
 * sent_ns; 0 when none did), or waiting longer than twice the upstream's
 * usual time to first byte. A server that serves a fixed number of
 * connections at a time (a thread each, as llama.cpp's llama-server and
 * many Python servers do) has not even read them: they sit in its accept
 * backlog behind our idle keep-alive connections, which pin its threads.
 * Closing a connection that has nothing to carry gives a thread to the
 * oldest one waiting. A server with its own queue may just be slow to
 * answer; then the close costs one reconnect. Once such a wait was seen
 * (backlog_seen), every request waiting on a fresh connection counts.
 */
static int unread_requests(const ig_upstream_t *u, const conn_t *c, uint64_t sent_ns,
                           uint64_t now_ns)
{
    uint64_t patience = (uint64_t)(2e9 * u->ttfb_ewma_s) + 10000000ULL;
    int n = 0;
    ig_list_t *it;
    IG_LIST_FOREACH(it, &u->reqs)
    {
        const ig_upstream_req_t *o = IG_LIST_DATA(it, ig_upstream_req_t, node);
        if (o->conn != NULL && o->conn != c && !o->conn->reused && !o->got_bytes &&
            o->t_sent_ns != 0 &&
            (o->t_sent_ns < sent_ns || (u->ttfb_ewma_s > 0 && now_ns - o->t_sent_ns > patience)))
            n++;
    }
    return n;
}

/* Gives a pooled connection to the oldest request waiting under the cap
 * and connects new ones while the cap allows. No callback fires inside. */
static void pending_kick(ig_upstream_t *u)
{
    if (u->kicking || u->closing)
        return;
    u->kicking = 1;
    ig_list_t *n;
    while ((n = ig_list_first(&u->pending)) != NULL && (u->nidle > 0 || !at_cap(u))) {
        ig_upstream_req_t *r = IG_LIST_DATA(n, ig_upstream_req_t, pend_node);
        ig_list_remove(n);
        r->t_start_ns = uv_hrtime(); /* its connect time starts now */
        if (conn_start(r) != 0) {
            ig_list_push_front(&u->pending, &r->pend_node); /* no memory: later */
            break;
        }
    }
    u->kicking = 0;
}

/* Every 100 ms: waiting requests past their deadline fail, an idle
 * connection is closed for each request that looks unread, and idle
 * connections beyond the most that were busy in the last window or two are
 * closed, the least recently used first (the idle list is most recent
 * first, so the tail). */
static void on_trim(uv_timer_t *t)
{
    ig_upstream_t *u = t->data;
    uint64_t now = uv_hrtime();
    /* The expired ones move to a list of their own first: their done
     * callbacks may send or cancel other requests of this upstream. */
    ig_list_t expired, *it, *tmp;
    ig_list_init(&expired);
    IG_LIST_FOREACH_SAFE(it, tmp, &u->pending)
    {
        ig_upstream_req_t *r = IG_LIST_DATA(it, ig_upstream_req_t, pend_node);
        if (now - r->t_start_ns > u->opts.first_byte_timeout_ms * 1000000ULL) {
            ig_list_remove(&r->pend_node);
            ig_list_push_back(&expired, &r->pend_node);
        }
    }
    while ((it = ig_list_first(&expired)) != NULL) {
        ig_upstream_req_t *r = IG_LIST_DATA(it, ig_upstream_req_t, pend_node);
        ig_list_remove(it);
        req_finish(r, IG_ECONNECT); /* nothing was sent: safe to retry */
    }
    if (u->closing)
        return;
    /* Idle connections while requests sit unread: let them in. */
    int unread = u->nidle > 0 ? unread_requests(u, NULL, 0, now) : 0;
    if (unread > 0 && !u->backlog_seen) {
        /* From now on a connection that comes free with nothing to carry
         * is closed while any fresh one waits for its first byte. */
        IG_INFO("upstream %s: requests wait unread while connections idle; "
                "closing idle connections for them",
                u->name);
        u->backlog_seen = 1;
    }
    while (unread-- > 0 && u->nidle > 0) {
        conn_t *c = IG_LIST_DATA(ig_list_last(&u->idle), conn_t, idle_node);
        idle_remove(u, c);
        conn_close(c);
    }
    if (u->opts.idle_trim_ms == 0)
        return;
    if (now - u->window_ns >= u->opts.idle_trim_ms * 1000000ULL) {
        u->peak_prev = u->peak_busy;
        u->peak_busy = live_conns(u) - u->nidle;
        u->window_ns = now;
    }
    unsigned need = u->peak_busy > u->peak_prev ? u->peak_busy : u->peak_prev;
    while (u->nidle > 0 && live_conns(u) > need) {
        conn_t *c = IG_LIST_DATA(ig_list_last(&u->idle), conn_t, idle_node);
        idle_remove(u, c);
        conn_close(c);
    }
}

void ig_upstream_set_max_connections(ig_upstream_t *u, unsigned max)
{
    u->max_conns = max;
    while (max > 0 && u->nidle > 0 && live_conns(u) > max) {
        conn_t *c = IG_LIST_DATA(ig_list_last(&u->idle), conn_t, idle_node);
        idle_remove(u, c);
        conn_close(c);
    }
    pending_kick(u);
}

unsigned ig_upstream_idle_connections(const ig_upstream_t *u)
{
    return u->nidle;
}

unsigned ig_upstream_waiting(const ig_upstream_t *u)
{
    return (unsigned)ig_list_count(&u->pending);
}

/*
 * Puts a connection whose response completed back into the pool, most
 * recently used first (LIFO: the warm connections carry the traffic and
 * the cold ones age out by the trim), or hands it straight to the oldest
 * request waiting under the cap. Closed instead when the server asked, the
 * pool is full, the cap was lowered below the open connections, or nothing
 * waits for it while a request looks unread (see unread_requests()).
 */
static void conn_release(conn_t *c, int keep_alive)
{
    ig_upstream_t *u = c->up;
    uint64_t sent_ns = c->req != NULL ? c->req->t_sent_ns : 0;
    c->req = NULL;
    if (!keep_alive || u->closing || u->nidle >= u->opts.max_idle_connections ||
        (u->max_conns > 0 && live_conns(u) > u->max_conns) ||
        (ig_list_empty(&u->pending) &&
         unread_requests(u, c, u->backlog_seen ? UINT64_MAX : sent_ns, uv_hrtime()) > 0)) {
        conn_close(c);
        return;
    }
    /* A pooled connection keeps reading so that a server-side close is
     * noticed; any byte arriving while idle is a protocol error. */
    c->reused = 1;
    ig_list_t *n = ig_list_first(&u->pending);
    if (n != NULL) {
        ig_upstream_req_t *r = IG_LIST_DATA(n, ig_upstream_req_t, pend_node);
        ig_list_remove(n);
        conn_deadline_clear(c);
        c->req = r;
        r->conn = c;
        r->t_connected_ns = uv_hrtime();
        r->t_start_ns = r->t_connected_ns;
        note_busy(u);
        req_send(r);
        return;
    }
    ig_list_push_front(&u->idle, &c->idle_node);
    u->nidle++;
    conn_deadline(c, on_keepalive_timeout, u->opts.keepalive_idle_ms);
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
        phase_ms = r->up->opts.connect_timeout_ms; /* a pending lookup included */
    else if (!r->got_bytes)
        phase_ms = r->up->opts.first_byte_timeout_ms;
    else if (r->paused)
        phase_ms = 0; /* no idle deadline while the client holds us back */
    else
        phase_ms = r->up->opts.idle_timeout_ms;
    uint64_t total_ms = ms_until(now, r->deadline_ns);
    uint64_t ms = phase_ms != 0 && phase_ms < total_ms ? phase_ms : total_ms;
    conn_deadline(c, on_req_timeout, ms);
}

static void on_req_timeout(uv_timer_t *t)
{
    conn_t *c = t->data;
    ig_upstream_req_t *r = c->req;
    if (r == NULL)
        return;
    /* Before connecting, a timeout is a connect failure: retry-safe. */
    if (r->t_connected_ns == 0) {
        if (!c->waiting_addr)
            note_connect_failed(c->up, c->addr_index);
        req_finish(r, IG_ECONNECT);
        return;
    }
    req_finish(r, IG_ETIMEDOUT);
}

/*
 * The connection failed before any response byte: a pooled connection the
 * server had closed is replaced once by a fresh one (nothing reached the
 * server's application); otherwise the request ends with err.
 */
static void req_conn_lost(ig_upstream_req_t *r, conn_t *c, int err)
{
    if (!r->got_bytes && c->reused && !r->retried_fresh) {
        r->retried_fresh = 1;
        if (r->write != NULL) { /* canceled with the old connection */
            r->write->data = NULL;
            r->write = NULL;
        }
        conn_close(c);
        r->conn = NULL;
        r->t_connected_ns = 0;
        if (conn_start(r) != 0)
            req_finish(r, IG_ECONNECT);
        return;
    }
    req_finish(r, err);
}

static void on_conn_fail(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (c->req != NULL)
        req_conn_lost(c->req, c, c->fail_err);
}

/* Reports a failure found inside a call of the user (ig_upstream_request)
 * from the loop instead, so that no callback fires within that call. */
static void conn_fail_soon(conn_t *c, int err)
{
    c->fail_err = err;
    conn_deadline(c, on_conn_fail, 0);
}

/* ---- reading and writing ------------------------------------------------- */

/*
 * Acts on what the parser recorded for r, after llhttp_execute (e, with the
 * read ending at end) or llhttp_finish at the close (eof). Returns 1 when r
 * has ended (neither r nor its connection may be used for it again), 0
 * when it is still in flight.
 */
static int after_parse(conn_t *c, ig_upstream_req_t *r, llhttp_errno_t e, const char *end, int eof)
{
    if (r->end_pending) { /* ended from inside one of its own callbacks */
        req_finish(r, r->end_err);
        return 1;
    }
    if (c->msg_done) {
        c->msg_done = 0;
        /* A close-delimited body ends with the connection; otherwise the
         * connection is reused unless the server asked for a close, or sent
         * bytes past the response with no request to carry them. */
        int keep = c->msg_keep_alive && !eof && r->write == NULL;
        if (e == HPE_PAUSED) {
            const char *stop = llhttp_get_error_pos(&c->parser);
            llhttp_resume(&c->parser);
            if (stop != NULL && end != NULL && stop < end)
                keep = 0;
        }
        r->conn = NULL;
        conn_deadline_clear(c);
        /* The connection goes back before on_done, so that a request the
         * callback sends next can take it. */
        if (keep && !c->closing)
            conn_release(c, 1);
        else
            conn_close(c);
        req_finish(r, 0);
        return 1;
    }
    if (eof)
        return 0;
    if (e == HPE_OK) {
        req_arm_timer(r); /* the idle deadline restarts on progress */
        return 0;
    }
    req_finish(r, IG_EPARSE);
    return 1;
}

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
            /* A body delimited by the close (RFC 9112 section 6.3) ends
             * here: llhttp_finish completes it through on_message_complete. */
            llhttp_finish(&c->parser);
            if (after_parse(c, r, HPE_OK, NULL, 1))
                return;
        }
        req_conn_lost(r, c, r->got_bytes ? IG_ECLOSED : IG_ECONNECT);
        return;
    }
    if (!r->got_bytes) {
        r->got_bytes = 1;
        r->t_first_byte_ns = uv_hrtime();
        double ttfb = (double)(r->t_first_byte_ns - r->t_sent_ns) / 1e9;
        ig_upstream_t *u = c->up;
        u->ttfb_ewma_s = u->ttfb_ewma_s > 0 ? u->ttfb_ewma_s + 0.1 * (ttfb - u->ttfb_ewma_s) : ttfb;
    }
    llhttp_errno_t e = llhttp_execute(&c->parser, buf->base, (size_t)nread);
    after_parse(c, r, e, buf->base + nread, 0);
}

static void on_written(uv_write_t *w, int status)
{
    ig_upstream_req_t *r = w->data;
    free(w);
    if (r == NULL)
        return; /* the request finished while its bytes were in flight */
    r->write = NULL;
    if (status < 0 && r->conn != NULL && !r->got_bytes)
        req_conn_lost(r, r->conn, IG_ECONNECT);
}

/* Sends r's bytes on its connected connection. A failure is reported from
 * the loop (this runs inside ig_upstream_request for a pooled connection). */
static void req_send(ig_upstream_req_t *r)
{
    conn_t *c = r->conn;
    if (r->t_connected_ns == 0)
        r->t_connected_ns = uv_hrtime();
    r->t_sent_ns = uv_hrtime();
    req_arm_timer(r);
    int rc = ig_tls_stream_read_start(c->tls, &c->h.stream, on_alloc, on_read);
    if (rc != 0 && rc != UV_EALREADY) {
        conn_fail_soon(c, IG_ECONNECT);
        return;
    }
    uv_buf_t b = uv_buf_init(r->wbuf, (unsigned)r->wlen);
    /* Most requests fit the socket buffer at once. A uv_write would also
     * do, but its completion makes libuv re-arm the watcher, one epoll_ctl
     * per request; a pending remainder still goes by uv_write. */
    int n = ig_tls_stream_try_write(c->tls, &c->h.stream, &b);
    if (n == (int)b.len)
        return;
    if (n < 0 && n != UV_EAGAIN) {
        conn_fail_soon(c, IG_ECONNECT);
        return;
    }
    if (n > 0) {
        b.base += n;
        b.len -= (unsigned)n;
    }
    uv_write_t *w = malloc(sizeof(*w));
    if (w == NULL) {
        conn_fail_soon(c, IG_ECONNECT);
        return;
    }
    w->data = r;
    r->write = w;
    if (uv_write(w, &c->h.stream, &b, 1, on_written) != 0) {
        r->write = NULL;
        free(w);
        conn_fail_soon(c, IG_ECONNECT);
    }
}

/* https: the handshake ended; a failure is a failed connect. */
static void on_tls_ready(ig_tls_stream_t *ts, int status, void *data)
{
    conn_t *c = data;
    ig_upstream_req_t *r = c->req;
    if (c->closing || r == NULL)
        return;
    if (status != 0) {
        req_finish(r, IG_ECONNECT);
        return;
    }
    req_send(r);
}

static void on_connected(uv_connect_t *cr, int status)
{
    conn_t *c = cr->data;
    ig_upstream_req_t *r = c->req;
    if (c->closing || r == NULL)
        return;
    if (status < 0) {
        IG_DEBUG("upstream %s: connect: %s", c->up->name, uv_strerror(status));
        note_connect_failed(c->up, c->addr_index);
        req_finish(r, IG_ECONNECT);
        return;
    }
    c->up->addr_failures = 0;
    if (c->up->https) {
        if (ig_tls_stream_start(&c->tls, &c->h.stream, c->up->tls_ctx, c->up->tls_name, c->up->name,
                                on_tls_ready, c) != 0)
            req_finish(r, IG_ECONNECT);
        return;
    }
    req_send(r);
}

/*
 * Connects a new connection, or parks it until the name is resolved. A
 * name is looked up at init, again when its answer is older than
 * opts.resolve_ttl_ms (in the background: the old answer serves
 * meanwhile), and again before connecting once every address of the
 * answer has failed to connect (then the connection waits for the lookup).
 * With no address at all, a lookup that failed under RESOLVE_RETRY_NS ago
 * fails the connection without asking again.
 */
static void conn_connect(conn_t *c)
{
    ig_upstream_t *u = c->up;
    if (u->is_unix) {
        uv_pipe_connect(&c->connect, &c->h.pipe, u->unix_path, on_connected);
        return;
    }
    uint64_t now = uv_hrtime();
    int lookup_failed_lately =
        u->resolve_fail_ns != 0 && now - u->resolve_fail_ns < RESOLVE_RETRY_NS;
    if (u->resolve_name != NULL && (u->naddrs == 0 || u->stale) && !lookup_failed_lately) {
        c->waiting_addr = 1;
        ig_list_push_front(&u->addr_wait, &c->wait_node);
        resolve_start(u);
        if (u->resolving == NULL) { /* could not even ask */
            wait_remove(c);
            conn_fail_soon(c, IG_ECONNECT);
        }
        return;
    }
    if (u->naddrs == 0) {
        conn_fail_soon(c, IG_ECONNECT);
        return;
    }
    if (u->resolve_name != NULL && u->resolving == NULL && !lookup_failed_lately &&
        now - u->resolved_ns > u->opts.resolve_ttl_ms * 1000000ULL)
        resolve_start(u); /* refresh in the background */
    c->addr_index = u->cur_addr % u->naddrs;
    int rc = uv_tcp_connect(&c->connect, &c->h.tcp,
                            (const struct sockaddr *)&u->addrs[c->addr_index], on_connected);
    if (rc != 0) {
        note_connect_failed(u, c->addr_index);
        conn_fail_soon(c, IG_ECONNECT);
    }
}

/* Gives r a connection: a pooled one, or a new one being connected. No
 * callback of r fires inside; IG_ENOMEM when no connection could be made
 * at all. */
static int conn_start(ig_upstream_req_t *r)
{
    ig_upstream_t *u = r->up;
    ig_list_t *pooled = r->retried_fresh ? NULL : ig_list_pop_front(&u->idle);
    conn_t *c = pooled ? IG_LIST_DATA(pooled, conn_t, idle_node) : NULL;
    if (c != NULL) {
        u->nidle--;
        conn_deadline_clear(c);
        c->req = r;
        r->conn = c;
        r->t_connected_ns = uv_hrtime(); /* connected already: no connect time */
        r->t_start_ns = r->t_connected_ns;
        note_busy(u);
        req_send(r);
        return 0;
    }
    if (at_cap(u)) {
        /* The cap is reached: wait, in order, for a connection to come
         * free (conn_release, pending_kick); on_trim ends a long wait. */
        ig_list_push_back(&u->pending, &r->pend_node);
        return 0;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return IG_ENOMEM;
    c->up = u;
    int rc = u->is_unix ? uv_pipe_init(u->loop, &c->h.pipe, 0) : uv_tcp_init(u->loop, &c->h.tcp);
    if (rc != 0) {
        free(c);
        return IG_ENOMEM; /* neither init opens a socket: only memory can fail */
    }
    uv_timer_init(u->loop, &c->timer);
    c->handles_open = 2;
    c->h.handle.data = c;
    c->timer.data = c;
    c->connect.data = c;
    u->nconns++;
    llhttp_init(&c->parser, HTTP_RESPONSE, ig__upstream_parser_settings());
    c->parser.data = c;
    c->req = r;
    r->conn = c;
    note_busy(u);
    req_arm_timer(r);
    if (!u->is_unix)
        uv_tcp_nodelay(&c->h.tcp, 1);
    conn_connect(c);
    return 0;
}

/* ---- requests ------------------------------------------------------------ */

static int build_request(ig_upstream_req_t *r, const char *method, const char *path,
                         const char *extra, const char *body, size_t len)
{
    ig_upstream_t *u = r->up;
    size_t extra_len = (extra ? strlen(extra) : 0) + (u->headers ? strlen(u->headers) : 0);
    size_t cap =
        strlen(method) + strlen(u->prefix) + strlen(path) + strlen(u->host) + extra_len + len + 128;
    r->wbuf = malloc(cap);
    if (r->wbuf == NULL)
        return IG_ENOMEM;
    /* Written piece by piece, without printf: this runs for every request. */
    char clen[24];
    int cl = 0;
    size_t v = len;
    do {
        clen[sizeof(clen) - 1 - cl++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    const char *parts[] = {method,
                           " ",
                           u->prefix,
                           path,
                           " HTTP/1.1\r\nHost: ",
                           u->host,
                           "\r\nContent-Length: ",
                           NULL, /* the length */
                           "\r\nConnection: keep-alive\r\n",
                           u->headers ? u->headers : "",
                           extra ? extra : "",
                           "\r\n"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        const char *p = parts[i] != NULL ? parts[i] : clen + sizeof(clen) - cl;
        size_t l = parts[i] != NULL ? strlen(p) : (size_t)cl;
        if (n + l + len > cap)
            return IG_ENOMEM;
        memcpy(r->wbuf + n, p, l);
        n += l;
    }
    if (len > 0)
        memcpy(r->wbuf + n, body, len);
    r->wlen = (size_t)n + len;
    return 0;
}

static void req_unlink(ig_upstream_req_t *r)
{
    if (r->unlinked)
        return;
    r->unlinked = 1;
    ig_list_remove(&r->node);
}

int ig_upstream_request(ig_upstream_t *u, const char *method, const char *path,
                        const char *extra_headers, const char *body, size_t len,
                        const ig_upstream_cbs_t *cbs, void *data, ig_upstream_req_t **out)
{
    if (u->closing)
        return IG_ESTATE;
    ig_upstream_req_t *r = malloc(sizeof(*r));
    if (r == NULL)
        return IG_ENOMEM;
    memset(r, 0, offsetof(ig_upstream_req_t, name_off));
    r->up = u;
    r->cbs = *cbs;
    r->data = data;
    r->t_start_ns = uv_hrtime();
    r->deadline_ns = r->t_start_ns + u->opts.total_timeout_ms * 1000000ULL;
    int rc = build_request(r, method, path, extra_headers, body, len);
    if (rc != 0)
        goto fail;
    ig_list_push_front(&u->reqs, &r->node);
    if ((rc = conn_start(r)) != 0) {
        req_unlink(r);
        goto fail;
    }
    if (out != NULL)
        *out = r;
    return 0;
fail:
    free(r->wbuf);
    free(r);
    return rc;
}

/*
 * Ends a request: unlinks it, detaches it from its connection (closing the
 * connection: a completed response has been handed back by after_parse
 * already), fires on_done unless canceled, and frees it. Inside one of its
 * own callbacks the end is recorded instead and after_parse carries it out
 * once the callback has returned.
 */
static void req_finish(ig_upstream_req_t *r, int err)
{
    ig_upstream_t *u = r->up;
    if (r->finishing)
        return;
    conn_t *c = r->conn;
    /* A write still pending (the server answered before reading it all)
     * pins the buffer: closing the connection cancels the write before
     * wbuf is freed below. */
    if (r->write != NULL) {
        r->write->data = NULL;
        r->write = NULL;
    }
    if (c != NULL) {
        conn_deadline_clear(c);
        r->conn = NULL;
        conn_close(c);
    }
    if (r->in_cb > 0) {
        if (!r->end_pending) {
            r->end_pending = 1;
            r->end_err = err;
            req_unlink(r);
            u->nheld++;
        }
        return;
    }
    if (r->end_pending)
        u->nheld--;
    req_unlink(r);
    ig_list_remove(&r->pend_node); /* it waited under the cap */
    r->finishing = 1;
    if (!r->canceled && r->cbs.on_done != NULL)
        r->cbs.on_done(r, err, r->data);
    free(r->hbuf);
    free(r->wbuf);
    free(r);
    maybe_finish_close(u);
}

void ig_upstream_cancel(ig_upstream_req_t *r)
{
    if (r->canceled || r->finishing)
        return;
    r->canceled = 1;
    /* Closing the connection is what tells the worker the client is gone.
     * From inside r's own callback the rest waits for its return. */
    req_finish(r, IG_ECANCELED);
}

void ig_upstream_pause(ig_upstream_req_t *r)
{
    if (r->paused || r->conn == NULL)
        return;
    r->paused = 1;
    ig_tls_stream_read_stop(r->conn->tls, &r->conn->h.stream);
    req_arm_timer(r);
}

void ig_upstream_resume(ig_upstream_req_t *r)
{
    if (!r->paused || r->conn == NULL)
        return;
    r->paused = 0;
    ig_tls_stream_read_start(r->conn->tls, &r->conn->h.stream, on_alloc, on_read);
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
