#ifndef IG_BENCHUTIL_H
#define IG_BENCHUTIL_H

/*
 * Helpers the bench tools (igbench, faultproxy, testupstream) share: a seeded
 * random generator, a precise timer queue on libuv, address parsing, an
 * intrusive list, a growable buffer and the command-line option walk.
 * Header-only (static inline) because every bench/<tool>/ folder builds into
 * its own executable and the build glob has no shared bench library.
 */
#include <uv.h>

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* ------------------------------------------------------------------------- */
/* Random numbers: splitmix64, deterministic for a seed.                     */
/* ------------------------------------------------------------------------- */

typedef struct {
    uint64_t s;
} igb_rng_t;

static inline void igb_rng_init(igb_rng_t *r, uint64_t seed)
{
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
}

static inline uint64_t igb_rng_next(igb_rng_t *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double igb_rng_double(igb_rng_t *r)
{
    return (double)(igb_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Exponential with the given mean. */
static inline double igb_rng_exp(igb_rng_t *r, double mean)
{
    return -mean * log(1.0 - igb_rng_double(r));
}

/* ------------------------------------------------------------------------- */
/* Distributions given as text: "N", "fixed:N", "uniform:A:B", "exp:MEAN",   */
/* "choice:A@W,B@W,..." (weights optional, default equal).                   */
/* ------------------------------------------------------------------------- */

#define IGB_DIST_MAX_CHOICES 16

typedef enum { IGB_DIST_FIXED, IGB_DIST_UNIFORM, IGB_DIST_EXP, IGB_DIST_CHOICE } igb_dist_kind_t;

typedef struct {
    igb_dist_kind_t kind;
    double a, b;
    int n;
    double val[IGB_DIST_MAX_CHOICES];
    double cum[IGB_DIST_MAX_CHOICES]; /* cumulative weights, normalised to 1 */
} igb_dist_t;

/* Parses a distribution spec; 0 on success, -1 when malformed. */
static inline int igb_dist_parse(const char *s, igb_dist_t *d)
{
    char *end;
    memset(d, 0, sizeof(*d));
    if (strncmp(s, "fixed:", 6) == 0)
        s += 6;
    if (strncmp(s, "uniform:", 8) == 0) {
        d->kind = IGB_DIST_UNIFORM;
        d->a = strtod(s + 8, &end);
        if (*end != ':')
            return -1;
        d->b = strtod(end + 1, &end);
        return (*end || d->b < d->a || d->a < 0) ? -1 : 0;
    }
    if (strncmp(s, "exp:", 4) == 0) {
        d->kind = IGB_DIST_EXP;
        d->a = strtod(s + 4, &end);
        return (*end || d->a < 0) ? -1 : 0;
    }
    if (strncmp(s, "choice:", 7) == 0) {
        double total = 0;
        d->kind = IGB_DIST_CHOICE;
        s += 7;
        while (*s) {
            if (d->n == IGB_DIST_MAX_CHOICES)
                return -1;
            d->val[d->n] = strtod(s, &end);
            if (end == s || d->val[d->n] < 0)
                return -1;
            double w = 1.0;
            if (*end == '@') {
                s = end + 1;
                w = strtod(s, &end);
                if (end == s || w <= 0)
                    return -1;
            }
            total += w;
            d->cum[d->n++] = total;
            if (*end == ',')
                end++;
            else if (*end)
                return -1;
            s = end;
        }
        if (d->n == 0)
            return -1;
        for (int i = 0; i < d->n; i++)
            d->cum[i] /= total;
        return 0;
    }
    d->kind = IGB_DIST_FIXED;
    d->a = strtod(s, &end);
    return (end == s || *end || d->a < 0) ? -1 : 0;
}

static inline double igb_dist_sample(const igb_dist_t *d, igb_rng_t *r)
{
    switch (d->kind) {
    case IGB_DIST_UNIFORM:
        return d->a + (d->b - d->a) * igb_rng_double(r);
    case IGB_DIST_EXP:
        return igb_rng_exp(r, d->a);
    case IGB_DIST_CHOICE: {
        double u = igb_rng_double(r);
        for (int i = 0; i < d->n; i++)
            if (u < d->cum[i])
                return d->val[i];
        return d->val[d->n - 1];
    }
    default:
        return d->a;
    }
}

/* ------------------------------------------------------------------------- */
/* Timer queue: a binary min-heap of deadlines (uv_hrtime nanoseconds) on    */
/* one timerfd watched by uv_poll. libuv's own timers have a 1 ms grain,     */
/* too coarse for delays that must be right within a few hundred µs.         */
/* ------------------------------------------------------------------------- */

typedef struct igb_tq_entry_s igb_tq_entry_t;
typedef void (*igb_tq_cb)(igb_tq_entry_t *e);

struct igb_tq_entry_s {
    uint64_t due; /* uv_hrtime() value at which cb runs */
    uint64_t seq; /* ties keep insertion order */
    int idx;      /* position in the heap, -1 when not queued */
    igb_tq_cb cb;
};

typedef struct {
    uv_poll_t poll;
    int fd;
    igb_tq_entry_t **heap;
    int n, cap;
    uint64_t seq;
    uint64_t armed;   /* deadline the timerfd is set to, 0 when disarmed */
    uint64_t spin_ns; /* wake this much early and spin to the deadline */
} igb_tq_t;

static inline int igb__tq_less(const igb_tq_entry_t *a, const igb_tq_entry_t *b)
{
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static inline void igb__tq_swap(igb_tq_t *q, int i, int j)
{
    igb_tq_entry_t *t = q->heap[i];
    q->heap[i] = q->heap[j];
    q->heap[j] = t;
    q->heap[i]->idx = i;
    q->heap[j]->idx = j;
}

static inline void igb__tq_up(igb_tq_t *q, int i)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!igb__tq_less(q->heap[i], q->heap[p]))
            break;
        igb__tq_swap(q, i, p);
        i = p;
    }
}

static inline void igb__tq_down(igb_tq_t *q, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->n && igb__tq_less(q->heap[l], q->heap[m]))
            m = l;
        if (r < q->n && igb__tq_less(q->heap[r], q->heap[m]))
            m = r;
        if (m == i)
            break;
        igb__tq_swap(q, i, m);
        i = m;
    }
}

static inline void igb__tq_arm(igb_tq_t *q)
{
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    uint64_t due = q->n ? q->heap[0]->due : 0;
    if (due == q->armed)
        return;
    q->armed = due;
    if (due > q->spin_ns)
        due -= q->spin_ns;
    if (due) {
        /* uv_hrtime reads CLOCK_MONOTONIC, so an absolute deadline matches. */
        if (due < 1)
            due = 1;
        its.it_value.tv_sec = (time_t)(due / 1000000000ull);
        its.it_value.tv_nsec = (long)(due % 1000000000ull);
    }
    timerfd_settime(q->fd, TFD_TIMER_ABSTIME, &its, NULL);
}

static inline void igb_tq_remove(igb_tq_t *q, igb_tq_entry_t *e)
{
    if (e->idx < 0)
        return;
    int i = e->idx;
    q->n--;
    if (i != q->n) {
        q->heap[i] = q->heap[q->n];
        q->heap[i]->idx = i;
        igb__tq_up(q, i);
        igb__tq_down(q, q->heap[i]->idx);
    }
    e->idx = -1;
    igb__tq_arm(q);
}

/* Queues e to run cb at the absolute time due (uv_hrtime ns). An entry
 * already queued is moved. Returns 0 or -ENOMEM. */
static inline int igb_tq_add(igb_tq_t *q, igb_tq_entry_t *e, uint64_t due, igb_tq_cb cb)
{
    if (e->idx >= 0)
        igb_tq_remove(q, e);
    if (q->n == q->cap) {
        int cap = q->cap ? q->cap * 2 : 64;
        igb_tq_entry_t **h = realloc(q->heap, (size_t)cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        q->heap = h;
        q->cap = cap;
    }
    e->due = due;
    e->seq = q->seq++;
    e->cb = cb;
    e->idx = q->n;
    q->heap[q->n++] = e;
    igb__tq_up(q, e->idx);
    igb__tq_arm(q);
    return 0;
}

static inline void igb_tq_entry_init(igb_tq_entry_t *e)
{
    memset(e, 0, sizeof(*e));
    e->idx = -1;
}

static inline void igb__tq_on_poll(uv_poll_t *p, int status, int events)
{
    igb_tq_t *q = (igb_tq_t *)p->data;
    uint64_t ticks;
    ssize_t r = read(q->fd, &ticks, sizeof(ticks));
    (void)r;
    q->armed = 0;
    /* Bounded: entries queued by callbacks for "now" run on this pass, but
     * each callback is expected to queue work in the future. */
    for (int guard = 0; q->n && guard < 100000; guard++) {
        igb_tq_entry_t *e = q->heap[0];
        uint64_t now = uv_hrtime();
        if (e->due > now + q->spin_ns)
            break;
        /* Waking from idle on a virtual machine is late by 0.1-4 ms now and
         * then; the early wake-up and this spin hide that from deadlines. */
        while (e->due > now)
            now = uv_hrtime();
        igb_tq_remove(q, e);
        e->cb(e);
    }
    igb__tq_arm(q);
}

/* Starts a timer queue on loop. 0 or a negative errno / libuv code. */
static inline int igb_tq_start(uv_loop_t *loop, igb_tq_t *q)
{
    memset(q, 0, sizeof(*q));
    q->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (q->fd < 0)
        return -errno;
    int rc = uv_poll_init(loop, &q->poll, q->fd);
    if (rc == 0) {
        q->poll.data = q;
        rc = uv_poll_start(&q->poll, UV_READABLE, igb__tq_on_poll);
    }
    return rc;
}

static inline void igb__tq_closed(uv_handle_t *h)
{
    igb_tq_t *q = (igb_tq_t *)h->data;
    close(q->fd);
    free(q->heap);
    q->heap = NULL;
}

/* Stops the queue; pending entries never run. */
static inline void igb_tq_close(igb_tq_t *q)
{
    uv_close((uv_handle_t *)&q->poll, igb__tq_closed);
}

/* ------------------------------------------------------------------------- */
/* Addresses: "HOST:PORT", "[V6]:PORT", "unix:PATH". HOST may be "localhost" */
/* or a numeric address; other names are resolved with getaddrinfo.          */
/* ------------------------------------------------------------------------- */

typedef struct {
    int is_unix;
    char path[108];
    struct sockaddr_storage ss;
} igb_addr_t;

static inline int igb_addr_parse(const char *s, igb_addr_t *a)
{
    memset(a, 0, sizeof(*a));
    if (strncmp(s, "unix:", 5) == 0) {
        if (strlen(s + 5) == 0 || strlen(s + 5) >= sizeof(a->path))
            return -1;
        a->is_unix = 1;
        strcpy(a->path, s + 5);
        return 0;
    }
    char host[256];
    const char *colon;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':' || (size_t)(rb - s - 1) >= sizeof(host))
            return -1;
        memcpy(host, s + 1, (size_t)(rb - s - 1));
        host[rb - s - 1] = 0;
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            return -1;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535 || end == colon + 1)
        return -1;
    if (host[0] == 0 || strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&a->ss) == 0)
        return 0;
    if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)&a->ss) == 0)
        return 0;
    uv_getaddrinfo_t gai;
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (uv_getaddrinfo(uv_default_loop(), &gai, NULL, host, NULL, &hints) != 0)
        return -1;
    memcpy(&a->ss, gai.addrinfo->ai_addr, gai.addrinfo->ai_addrlen);
    uv_freeaddrinfo(gai.addrinfo);
    if (a->ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&a->ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)&a->ss)->sin6_port = htons((uint16_t)port);
    return 0;
}

/* True for loopback targets: 127.0.0.0/8, ::1, or a unix socket. */
static inline int igb_addr_is_local(const igb_addr_t *a)
{
    if (a->is_unix)
        return 1;
    if (a->ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&a->ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (a->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
        static const unsigned char lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        return memcmp(&in6->sin6_addr, lo, 16) == 0;
    }
    return 0;
}

/* Writes "HOST:PORT" of a bound TCP handle into out. */
static inline void igb_tcp_name(uv_tcp_t *t, char *out, size_t len)
{
    struct sockaddr_storage ss;
    int n = sizeof(ss);
    char ip[64] = "?";
    int port = 0;
    if (uv_tcp_getsockname(t, (struct sockaddr *)&ss, &n) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(out, len, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, port);
}

/* A TCP or unix-socket stream, seen as any of its libuv types. */
typedef union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
} igb_stream_t;

/* ------------------------------------------------------------------------- */
/* Intrusive doubly linked list. The head is a sentinel (igb_list_init); a   */
/* link that is all zero (calloc) is not on a list, and removing it again is */
/* a no-op, so "is it queued" is igb_link_linked().                          */
/* ------------------------------------------------------------------------- */

typedef struct igb_link_s {
    struct igb_link_s *prev, *next;
} igb_link_t;

#define IGB_CONTAINER_OF(ptr, type, field) ((type *)(void *)((char *)(ptr)-offsetof(type, field)))

static inline void igb_list_init(igb_link_t *head)
{
    head->prev = head->next = head;
}

static inline int igb_list_empty(const igb_link_t *head)
{
    return head->next == head;
}

static inline int igb_link_linked(const igb_link_t *l)
{
    return l->next != NULL;
}

/* Appends l (not on a list) at the tail. */
static inline void igb_list_push(igb_link_t *head, igb_link_t *l)
{
    l->prev = head->prev;
    l->next = head;
    head->prev->next = l;
    head->prev = l;
}

static inline void igb_list_remove(igb_link_t *l)
{
    if (!l->next)
        return;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* The first link, NULL on an empty list. */
static inline igb_link_t *igb_list_first(const igb_link_t *head)
{
    return head->next == head ? NULL : head->next;
}

/* ------------------------------------------------------------------------- */
/* Growable buffer: bytes kept NUL-terminated for the string functions.      */
/* ------------------------------------------------------------------------- */

/* Appends n bytes at *len, growing *p to twice what it needs when it is too
 * small; -1 when out of memory or when that would pass max_cap bytes. */
static inline int igb_buf_append(char **p, size_t *len, size_t *cap, const char *at, size_t n,
                                 size_t max_cap)
{
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        if (c > max_cap)
            return -1;
        char *b = realloc(*p, c);
        if (!b)
            return -1;
        *p = b;
        *cap = c;
    }
    memcpy(*p + *len, at, n);
    *len += n;
    (*p)[*len] = 0;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Command-line options, walked in order: --help/-h, "--name VALUE", flags.  */
/* ------------------------------------------------------------------------- */

typedef struct {
    const char *prog; /* the prefix of every message: "igbench" */
    int argc;
    char **argv;
    int i;           /* argv index of the current option */
    const char *opt; /* the current option */
    void (*usage)(FILE *out);
} igb_opts_t;

static inline void igb_opts_init(igb_opts_t *o, const char *prog, int argc, char **argv,
                                 void (*usage)(FILE *out))
{
    memset(o, 0, sizeof(*o));
    o->prog = prog;
    o->argc = argc;
    o->argv = argv;
    o->usage = usage;
}

/* Moves to the next option (o->opt): 1, or 0 at the end of argv, or -1
 * after --help or -h printed the usage to stdout (the tool then exits 0). */
static inline int igb_opts_next(igb_opts_t *o)
{
    if (++o->i >= o->argc)
        return 0;
    o->opt = o->argv[o->i];
    if (!strcmp(o->opt, "--help") || !strcmp(o->opt, "-h")) {
        o->usage(stdout);
        return -1;
    }
    return 1;
}

/* Takes the current option's value; NULL, after "PROG: OPT needs a value",
 * when argv has none. */
static inline const char *igb_opt_value(igb_opts_t *o)
{
    if (o->i + 1 >= o->argc) {
        fprintf(stderr, "%s: %s needs a value\n", o->prog, o->opt);
        return NULL;
    }
    return o->argv[++o->i];
}

/* In a tool's main: sets v to the current option's value, or returns 2 (the
 * exit status of bad usage) when there is none. */
#define IGB_NEED(o, v)                                                                             \
    do {                                                                                           \
        if (!((v) = igb_opt_value(o)))                                                             \
            return 2;                                                                              \
    } while (0)

/* Takes the value as a number (atof) in [lo, hi]: 0, or -1 after "PROG: OPT
 * must be LO..HI" (or the missing-value message). */
static inline int igb_opt_range(igb_opts_t *o, double lo, double hi, double *out)
{
    const char *v = igb_opt_value(o);
    if (!v)
        return -1;
    *out = atof(v);
    if (*out < lo || *out > hi) {
        fprintf(stderr, "%s: %s must be %g..%g\n", o->prog, o->opt, lo, hi);
        return -1;
    }
    return 0;
}

/* Takes the value as one of the names in choices ("a|b|c"): its index, or
 * -1 after "PROG: OPT a|b|c" (or the missing-value message). */
static inline int igb_opt_choice(igb_opts_t *o, const char *choices)
{
    const char *v = igb_opt_value(o);
    if (!v)
        return -1;
    size_t n = strlen(v);
    int k = 0;
    for (const char *c = choices; *c; k++) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncmp(c, v, n) == 0)
            return k;
        c += bar ? len + 1 : len;
    }
    fprintf(stderr, "%s: %s %s\n", o->prog, o->opt, choices);
    return -1;
}

/* Reports the current option as unknown; returns 2. */
static inline int igb_opt_unknown(const igb_opts_t *o)
{
    fprintf(stderr, "%s: unknown option '%s' (see --help)\n", o->prog, o->opt);
    return 2;
}

/* The options igbench and testupstream share, tried after their own:
 * --spin-us US (0..10000, how long the timer queue spins before a deadline)
 * and --quiet. 0 when the current option was one of them; else 2 (the exit
 * status of bad usage) after the message for a bad value or an unknown option. */
static inline int igb_opt_shared(igb_opts_t *o, double *spin_us, int *quiet)
{
    if (!strcmp(o->opt, "--spin-us"))
        return igb_opt_range(o, 0, 10000, spin_us) == 0 ? 0 : 2;
    if (!strcmp(o->opt, "--quiet")) {
        *quiet = 1;
        return 0;
    }
    return igb_opt_unknown(o);
}

/* The libuv alloc callback of every tool: one static slab per tool, since a
 * single-threaded loop is done with each read before the next one. */
static inline void igb_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char slab[65536];
    buf->base = slab;
    buf->len = sizeof(slab);
}

static inline double igb_now_s(void)
{
    return (double)uv_hrtime() / 1e9;
}

#endif
