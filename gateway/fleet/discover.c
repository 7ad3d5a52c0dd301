/*
 * DNS discovery (see include/infergate/discover.h): a timer, and one
 * resolution at a time, through uv_getaddrinfo or through our own DNS
 * client over uv_udp when a resolver is configured.
 */
#include "infergate/discover.h"
#include "infergate/error.h"
#include "infergate/log.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUERY_TIMEOUT_MS 2000
#define QTYPE_A 1
#define QTYPE_AAAA 28

struct ig_discover_s {
    uv_loop_t *loop;
    char *name;
    uint64_t interval_ms;
    int use_udp;
    struct sockaddr_storage server;
    ig_discover_cb cb;
    void *data;
    uv_timer_t timer; /* the next resolution, or the UDP answers' deadline */
    uv_udp_t udp;
    uv_getaddrinfo_t gai;
    int gai_busy;  /* a lookup runs on the thread pool */
    int udp_busy;  /* queries sent, answers awaited */
    int closing;   /* ig_discover_close ran: no callbacks */
    int handles;   /* open handles (timer, udp) */
    uint16_t id_a; /* ids of the queries in flight */
    uint16_t id_aaaa;
    int got_a, got_aaaa; /* each: 0 waiting, 1 answered, -1 failed */
    char (*addrs)[46];   /* IG_DISCOVER_MAX_ADDRS of this resolution */
    int naddrs;
    unsigned answers, failures;
    uint32_t rng;
};

/* ---- the wire format ----------------------------------------------------- */

int ig_dns_query(uint8_t *buf, int cap, uint16_t id, const char *name, uint16_t qtype)
{
    int n = 0;
    if (cap < 12)
        return -1;
    uint8_t hdr[12] = {(uint8_t)(id >> 8), (uint8_t)id, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
    memcpy(buf, hdr, 12);
    n = 12;
    const char *p = name;
    while (*p != '\0') {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        if (len == 0 || len > 63 || n + 1 + (int)len + 5 > cap)
            return -1;
        buf[n++] = (uint8_t)len;
        memcpy(buf + n, p, len);
        n += (int)len;
        p += len;
        if (*p == '.')
            p++;
    }
    if (n + 5 > cap || n == 12)
        return -1;
    buf[n++] = 0;
    buf[n++] = (uint8_t)(qtype >> 8);
    buf[n++] = (uint8_t)qtype;
    buf[n++] = 0;
    buf[n++] = 1; /* class IN */
    return n;
}

/* Skips a (possibly compressed) name at off; the offset after it, or -1. */
static int skip_name(const uint8_t *buf, int len, int off)
{
    for (int labels = 0; labels < 128; labels++) {
        if (off >= len)
            return -1;
        uint8_t b = buf[off];
        if (b == 0)
            return off + 1;
        if ((b & 0xC0) == 0xC0)
            return off + 2 <= len ? off + 2 : -1;
        if ((b & 0xC0) != 0)
            return -1;
        off += 1 + b;
    }
    return -1;
}

int ig_dns_parse(const uint8_t *buf, int len, uint16_t id, char (*addrs)[46], int max, int *n)
{
    if (len < 12 || ((buf[0] << 8) | buf[1]) != id || !(buf[2] & 0x80))
        return -1;
    int rcode = buf[3] & 0x0F;
    if (rcode == 3)
        return 1;
    if (rcode != 0 || (buf[2] & 0x02)) /* an error, or truncated */
        return -1;
    int qd = (buf[4] << 8) | buf[5], an = (buf[6] << 8) | buf[7];
    int off = 12;
    for (int i = 0; i < qd; i++) {
        if ((off = skip_name(buf, len, off)) < 0 || off + 4 > len)
            return -1;
        off += 4;
    }
    for (int i = 0; i < an; i++) {
        if ((off = skip_name(buf, len, off)) < 0 || off + 10 > len)
            return -1;
        int type = (buf[off] << 8) | buf[off + 1];
        int klass = (buf[off + 2] << 8) | buf[off + 3];
        int rdlen = (buf[off + 8] << 8) | buf[off + 9];
        off += 10;
        if (off + rdlen > len)
            return -1;
        int family = type == QTYPE_A && rdlen == 4       ? AF_INET
                     : type == QTYPE_AAAA && rdlen == 16 ? AF_INET6
                                                         : 0;
        if (klass == 1 && family != 0 && *n < max) {
            if (inet_ntop(family, buf + off, addrs[*n], 46) != NULL)
                (*n)++;
        }
        off += rdlen; /* a CNAME comes with its target's records */
    }
    return 0;
}

/* ---- one resolution ------------------------------------------------------ */

static int cmp_addr(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static void schedule(ig_discover_t *d, uint64_t ms);

/* The end of a resolution: an answer goes to the callback, sorted and
 * without duplicates; a failure keeps the last set. */
static void finish(ig_discover_t *d, int ok)
{
    if (d->closing)
        return;
    if (ok) {
        qsort(d->addrs, (size_t)d->naddrs, sizeof(d->addrs[0]), cmp_addr);
        const char *list[IG_DISCOVER_MAX_ADDRS];
        int n = 0;
        for (int i = 0; i < d->naddrs; i++) {
            if (n == 0 || strcmp(list[n - 1], d->addrs[i]) != 0)
                list[n++] = d->addrs[i];
        }
        d->answers++;
        d->cb(d->data, list, n);
    } else {
        d->failures++;
        if (d->failures == 1 || d->failures % 60 == 0)
            IG_WARN("discover %s: resolution failed (%u times); the last set stays", d->name,
                    d->failures);
    }
    schedule(d, d->interval_ms);
}

static void on_gai(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    ig_discover_t *d = req->data;
    d->gai_busy = 0;
    if (d->closing) {
        uv_freeaddrinfo(res);
        if (d->handles == 0) {
            free(d->addrs);
            free(d->name);
            free(d);
        }
        return;
    }
    d->naddrs = 0;
    for (struct addrinfo *ai = res; status == 0 && ai != NULL; ai = ai->ai_next) {
        const void *a = ai->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
            d->naddrs < IG_DISCOVER_MAX_ADDRS &&
            inet_ntop(ai->ai_family, a, d->addrs[d->naddrs], 46) != NULL)
            d->naddrs++;
    }
    uv_freeaddrinfo(res);
    /* No such name is an answer too: the empty set. */
    finish(d, status == 0 || status == UV_EAI_NONAME || status == UV_EAI_NODATA);
}

static void on_udp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char slab[4096]; /* one loop thread; the answer is parsed at once */
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void udp_done_maybe(ig_discover_t *d)
{
    if (d->got_a == 0 || d->got_aaaa == 0)
        return;
    d->udp_busy = 0;
    uv_timer_stop(&d->timer);
    finish(d, d->got_a > 0 || d->got_aaaa > 0);
}

static void on_udp_recv(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf,
                        const struct sockaddr *addr, unsigned flags)
{
    ig_discover_t *d = h->data;
    (void)flags;
    if (nread <= 0 || addr == NULL || !d->udp_busy || d->closing)
        return;
    const uint8_t *b = (const uint8_t *)buf->base;
    uint16_t id = nread >= 2 ? (uint16_t)((b[0] << 8) | b[1]) : 0;
    int *slot = id == d->id_a && d->got_a == 0         ? &d->got_a
                : id == d->id_aaaa && d->got_aaaa == 0 ? &d->got_aaaa
                                                       : NULL;
    if (slot == NULL)
        return; /* a late answer to an earlier try, or not for us */
    int rc = ig_dns_parse(b, (int)nread, id, d->addrs, IG_DISCOVER_MAX_ADDRS, &d->naddrs);
    *slot = rc >= 0 ? 1 : -1;
    udp_done_maybe(d);
}

static void on_udp_sent(uv_udp_send_t *req, int status)
{
    (void)status; /* a lost query is a timeout */
    free(req);
}

static void on_udp_timeout(uv_timer_t *t)
{
    ig_discover_t *d = t->data;
    if (d->got_a == 0)
        d->got_a = -1;
    if (d->got_aaaa == 0)
        d->got_aaaa = -1;
    udp_done_maybe(d);
}

static int send_query(ig_discover_t *d, uint16_t id, uint16_t qtype)
{
    typedef struct {
        uv_udp_send_t req;
        uint8_t buf[512];
    } send_t;
    send_t *s = malloc(sizeof(*s));
    if (s == NULL)
        return IG_ENOMEM;
    int len = ig_dns_query(s->buf, sizeof(s->buf), id, d->name, qtype);
    if (len < 0) {
        free(s);
        return IG_EINVAL;
    }
    uv_buf_t b = uv_buf_init((char *)s->buf, (unsigned)len);
    int rc = uv_udp_send(&s->req, &d->udp, &b, 1, (const struct sockaddr *)&d->server, on_udp_sent);
    if (rc != 0)
        free(s);
    return rc;
}

static uint16_t next_id(ig_discover_t *d)
{
    d->rng = d->rng * 1103515245u + 12345u;
    return (uint16_t)(d->rng >> 16);
}

static void resolve_now(ig_discover_t *d)
{
    d->naddrs = 0;
    if (!d->use_udp) {
        struct addrinfo hints;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        d->gai.data = d;
        if (uv_getaddrinfo(d->loop, &d->gai, on_gai, d->name, NULL, &hints) == 0) {
            d->gai_busy = 1;
            return;
        }
        finish(d, 0);
        return;
    }
    d->id_a = next_id(d);
    d->id_aaaa = (uint16_t)(d->id_a ^ 0x5a5a);
    d->got_a = d->got_aaaa = 0;
    d->udp_busy = 1;
    if (send_query(d, d->id_a, QTYPE_A) != 0)
        d->got_a = -1;
    if (send_query(d, d->id_aaaa, QTYPE_AAAA) != 0)
        d->got_aaaa = -1;
    if (d->got_a < 0 && d->got_aaaa < 0) {
        d->udp_busy = 0;
        finish(d, 0);
        return;
    }
    uv_timer_start(&d->timer, on_udp_timeout, QUERY_TIMEOUT_MS, 0);
}

static void on_timer(uv_timer_t *t)
{
    resolve_now(t->data);
}

static void schedule(ig_discover_t *d, uint64_t ms)
{
    if (!d->closing)
        uv_timer_start(&d->timer, on_timer, ms, 0);
}

/* ---- start and close ----------------------------------------------------- */

static int parse_server(const char *s, struct sockaddr_storage *out)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (colon == NULL)
        return IG_EINVAL;
    int port = atoi(colon + 1);
    size_t hlen = (size_t)(colon - s);
    if (port <= 0 || port > 65535 || hlen == 0 || hlen >= sizeof(host))
        return IG_EINVAL;
    if (s[0] == '[' && hlen > 2 && s[hlen - 1] == ']') {
        memcpy(host, s + 1, hlen - 2);
        host[hlen - 2] = '\0';
        return uv_ip6_addr(host, port, (struct sockaddr_in6 *)out) == 0 ? 0 : IG_EINVAL;
    }
    memcpy(host, s, hlen);
    host[hlen] = '\0';
    return uv_ip4_addr(host, port, (struct sockaddr_in *)out) == 0 ? 0 : IG_EINVAL;
}

int ig_discover_start(ig_discover_t **out, uv_loop_t *loop, const ig_discover_spec_t *spec,
                      ig_discover_cb cb, void *data)
{
    ig_discover_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return IG_ENOMEM;
    d->loop = loop;
    d->name = strdup(spec->name);
    d->addrs = calloc(IG_DISCOVER_MAX_ADDRS, sizeof(d->addrs[0]));
    d->interval_ms = spec->interval_ms > 0 ? spec->interval_ms : 10000;
    d->cb = cb;
    d->data = data;
    d->rng = (uint32_t)uv_hrtime();
    int rc = IG_ENOMEM;
    if (d->name == NULL || d->addrs == NULL)
        goto fail;
    if (spec->resolver != NULL) {
        memset(&d->server, 0, sizeof(d->server));
        if ((rc = parse_server(spec->resolver, &d->server)) != 0)
            goto fail;
        d->use_udp = 1;
    }
    uv_timer_init(loop, &d->timer);
    d->timer.data = d;
    d->handles = 1;
    if (d->use_udp) {
        uv_udp_init(loop, &d->udp);
        d->udp.data = d;
        d->handles++;
        uv_udp_recv_start(&d->udp, on_udp_alloc, on_udp_recv);
    }
    resolve_now(d);
    *out = d;
    return 0;
fail:
    free(d->addrs);
    free(d->name);
    free(d);
    return rc;
}

static void on_handle_closed(uv_handle_t *h)
{
    ig_discover_t *d = h->data;
    if (--d->handles > 0 || d->gai_busy)
        return; /* a lookup on the thread pool frees it when it ends */
    free(d->addrs);
    free(d->name);
    free(d);
}

void ig_discover_close(ig_discover_t *d)
{
    if (d == NULL || d->closing)
        return;
    d->closing = 1;
    if (d->gai_busy)
        uv_cancel((uv_req_t *)&d->gai); /* its callback still runs */
    uv_close((uv_handle_t *)&d->timer, on_handle_closed);
    if (d->use_udp)
        uv_close((uv_handle_t *)&d->udp, on_handle_closed);
}

unsigned ig_discover_answers(const ig_discover_t *d)
{
    return d->answers;
}

unsigned ig_discover_failures(const ig_discover_t *d)
{
    return d->failures;
}
