/*
 * GET /metrics of the gateway: its own registry, then the metrics of every
 * local instance, pulled at scrape time, so that one scrape target shows
 * the whole region (docs/operations.md, "Observing").
 *
 * Each ready or draining instance is asked for its /metrics over its Unix
 * socket, all at once; whatever has not answered within
 * FEDERATE_TIMEOUT_MS is left out of this scrape (its
 * infergate_instance_scrape_up is 0). The infergate_worker_* families are
 * kept (nothing else of a worker: its HTTP counters would collide with the
 * gateway's own), each family's samples of every instance grouped under
 * one HELP and TYPE, each sample labelled pool and instance.
 *
 * The upstreams' own gauges (in flight, EWMAs, limits) are read from the
 * router's state at render time, not set on every attempt: a scrape sees
 * the upstreams that exist now, and a request pays nothing for them.
 */
#include "gateway_internal.h"
#include "infergate/api.h"
#include "infergate/devices.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/pool.h"
#include "infergate/proxy.h"
#include "infergate/site.h"
#include "infergate/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Short against Prometheus' default scrape timeout (10 s): a stuck worker
 * costs one scrape half a second, never the whole target. */
#define FEDERATE_TIMEOUT_MS 500
#define MAX_WORKER_METRICS_BYTES (4u << 20)
#define FAMILY_PREFIX "infergate_worker_"

typedef struct scrape_s scrape_t;

typedef struct {
    scrape_t *s;
    ig_upstream_req_t *ureq; /* NULL once ended */
    char pool[128];
    char instance[128];
    int status;
    int ok; /* a complete 200 came */
    char *body;
    size_t len, cap;
} target_t;

struct scrape_s {
    ig_http_req_t *req;
    uv_timer_t timer;
    int pending;
    int ntargets;
    target_t *t;
};

/* ---- text ----------------------------------------------------------------- */

/* One family of the merged worker metrics: its HELP and TYPE lines as the
 * first worker wrote them, then the relabelled samples of all. */
typedef struct {
    char name[128];
    char *help_line, *type_line; /* whole lines with their "\n"; malloc'ed */
    ig_strbuf_t samples;
} family_t;

typedef struct {
    family_t *f;
    int n, cap;
} families_t;

static family_t *family_of(families_t *fs, const char *name, size_t nlen)
{
    if (nlen >= sizeof(fs->f[0].name))
        return NULL;
    for (int i = 0; i < fs->n; i++) {
        if (strlen(fs->f[i].name) == nlen && memcmp(fs->f[i].name, name, nlen) == 0)
            return &fs->f[i];
    }
    if (fs->n == fs->cap) {
        int cap = fs->cap ? fs->cap * 2 : 32;
        family_t *nf = realloc(fs->f, (size_t)cap * sizeof(*nf));
        if (nf == NULL)
            return NULL;
        fs->f = nf;
        fs->cap = cap;
    }
    family_t *f = &fs->f[fs->n++];
    memset(f, 0, sizeof(*f));
    memcpy(f->name, name, nlen);
    f->name[nlen] = '\0';
    return f;
}

/* The metric name at the start of s[0..n) and its length. */
static size_t name_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s[i] != '{' && s[i] != ' ' && s[i] != '\t')
        i++;
    return i;
}

/* "name{pool="p",instance="i",a="b"} v" from "name{a="b"} v" or "name v". */
static void relabel(ig_strbuf_t *b, const target_t *t, const char *line, size_t n)
{
    size_t nl = name_len(line, n);
    ig_strbuf_put(b, line, nl);
    ig_strbuf_puts(b, "{pool=\"");
    ig_metrics_put_escaped(b, t->pool, 1);
    ig_strbuf_puts(b, "\",instance=\"");
    ig_metrics_put_escaped(b, t->instance, 1);
    ig_strbuf_put(b, "\"", 1);
    if (nl < n && line[nl] == '{') {
        if (nl + 1 < n && line[nl + 1] != '}')
            ig_strbuf_put(b, ",", 1);
        ig_strbuf_put(b, line + nl + 1, n - nl - 1);
    } else {
        ig_strbuf_put(b, "}", 1);
        ig_strbuf_put(b, line + nl, n - nl);
    }
    ig_strbuf_put(b, "\n", 1);
}

static char *dup_line(const char *s, size_t n)
{
    char *d = malloc(n + 2);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\n';
        d[n + 1] = '\0';
    }
    return d;
}

/* Files one worker's exposition text into the families. A sample belongs
 * to the family of the TYPE line above it (histogram samples carry the
 * _bucket, _sum and _count suffixes). */
static void merge(families_t *fs, const target_t *t)
{
    const char *p = t->body, *end = t->body + t->len;
    family_t *cur = NULL;
    char help_name[128] = "";
    const char *help = NULL;
    size_t help_n = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        size_t n = (size_t)(le - p);
        if (n >= 7 && memcmp(p, "# HELP ", 7) == 0) {
            size_t k = name_len(p + 7, n - 7);
            if (k < sizeof(help_name)) {
                memcpy(help_name, p + 7, k);
                help_name[k] = '\0';
                help = p;
                help_n = n;
            }
        } else if (n >= 7 && memcmp(p, "# TYPE ", 7) == 0) {
            size_t k = name_len(p + 7, n - 7);
            cur = NULL;
            if (k > strlen(FAMILY_PREFIX) &&
                memcmp(p + 7, FAMILY_PREFIX, strlen(FAMILY_PREFIX)) == 0)
                cur = family_of(fs, p + 7, k);
            if (cur != NULL && cur->type_line == NULL) {
                cur->type_line = dup_line(p, n);
                if (help != NULL && strcmp(help_name, cur->name) == 0)
                    cur->help_line = dup_line(help, help_n);
            }
        } else if (n > 0 && p[0] != '#' && cur != NULL) {
            size_t k = name_len(p, n);
            /* Only the family's own samples: name, or name_bucket/_sum/_count. */
            size_t fl = strlen(cur->name);
            if (k >= fl && memcmp(p, cur->name, fl) == 0)
                relabel(&cur->samples, t, p, n);
        }
        p = le + 1;
    }
}

static int cmp_family(const void *a, const void *b)
{
    return strcmp(((const family_t *)a)->name, ((const family_t *)b)->name);
}

/* ---- the scrape ------------------------------------------------------------ */

static void on_timer_closed(uv_handle_t *h)
{
    scrape_t *s = h->data;
    for (int i = 0; i < s->ntargets; i++)
        free(s->t[i].body);
    free(s->t);
    free(s);
}

static void finish(scrape_t *s)
{
    uv_timer_stop(&s->timer);
    size_t own_len = 0;
    char *own = ig_metrics_render(&own_len);
    ig_strbuf_t out = {0};
    families_t fs = {0};
    if (own != NULL)
        ig_strbuf_put(&out, own, own_len);
    else
        out.oom = 1;
    free(own);
    for (int i = 0; i < s->ntargets; i++) {
        if (s->t[i].ok)
            merge(&fs, &s->t[i]);
    }
    if (fs.n > 1)
        qsort(fs.f, (size_t)fs.n, sizeof(*fs.f), cmp_family);
    for (int i = 0; i < fs.n; i++) {
        family_t *f = &fs.f[i];
        if (f->help_line != NULL)
            ig_strbuf_puts(&out, f->help_line);
        if (f->type_line != NULL)
            ig_strbuf_puts(&out, f->type_line);
        if (f->samples.oom)
            out.oom = 1;
        else if (f->samples.buf != NULL)
            ig_strbuf_put(&out, f->samples.buf, f->samples.len);
        free(f->help_line);
        free(f->type_line);
        free(f->samples.buf);
    }
    free(fs.f);
    size_t gpu_len = 0;
    char *gpu = ig_devices_gpu_metrics(&gpu_len);
    if (gpu != NULL)
        ig_strbuf_put(&out, gpu, gpu_len);
    free(gpu);
    if (s->ntargets > 0) {
        ig_strbuf_puts(
            &out, "# HELP infergate_instance_scrape_up 1 when the instance's /metrics answered "
                  "within this scrape.\n# TYPE infergate_instance_scrape_up gauge\n");
        for (int i = 0; i < s->ntargets; i++) {
            ig_strbuf_t line = {0};
            ig_strbuf_puts(&line, "infergate_instance_scrape_up ");
            ig_strbuf_puts(&line, s->t[i].ok ? "1" : "0");
            if (line.oom) {
                out.oom = 1;
            } else {
                relabel(&out, &s->t[i], line.buf, line.len);
            }
            free(line.buf);
        }
    }
    if (out.oom) {
        ig_api_respond_oom(s->req);
    } else {
        ig_http_respond(s->req, 200, "text/plain; version=0.0.4", out.buf ? out.buf : "", out.len);
    }
    free(out.buf);
    s->req = NULL;
    uv_close((uv_handle_t *)&s->timer, on_timer_closed);
}

static void on_headers(ig_upstream_req_t *r, int status, int nheaders, const char *const *names,
                       const char *const *values, void *data)
{
    target_t *t = data;
    (void)r, (void)nheaders, (void)names, (void)values;
    t->status = status;
}

static void on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    target_t *t = data;
    (void)r;
    if (t->len + len > MAX_WORKER_METRICS_BYTES || t->status != 200) {
        t->status = -1;
        return;
    }
    if (t->len + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16384;
        while (cap < t->len + len + 1)
            cap *= 2;
        char *nb = realloc(t->body, cap);
        if (nb == NULL) {
            t->status = -1;
            return;
        }
        t->body = nb;
        t->cap = cap;
    }
    memcpy(t->body + t->len, buf, len);
    t->len += len;
    t->body[t->len] = '\0';
}

static void on_done(ig_upstream_req_t *r, int err, void *data)
{
    target_t *t = data;
    scrape_t *s = t->s;
    (void)r;
    t->ureq = NULL;
    t->ok = err == 0 && t->status == 200 && t->body != NULL;
    if (!t->ok)
        IG_DEBUG("metrics of %s left out of this scrape: %s", t->instance,
                 err ? ig_strerror(err) : "not a 200 answer");
    if (--s->pending == 0)
        finish(s);
}

static void on_timeout(uv_timer_t *timer)
{
    scrape_t *s = timer->data;
    for (int i = 0; i < s->ntargets; i++) {
        target_t *t = &s->t[i];
        if (t->ureq == NULL)
            continue;
        /* No callback fires after a cancel: this is the target's end. */
        ig_upstream_cancel(t->ureq);
        t->ureq = NULL;
        IG_DEBUG("metrics of %s left out of this scrape: no answer in %d ms", t->instance,
                 FEDERATE_TIMEOUT_MS);
        s->pending--;
    }
    finish(s);
}

void ig_gateway_metrics(ig_gateway_t *gw, ig_http_req_t *req)
{
    scrape_t *s = calloc(1, sizeof(*s));
    int n = 0;
    for (int p = 0; p < gw->npools; p++)
        n += ig_pool_size(gw->pools[p]);
    if (s == NULL || (n > 0 && (s->t = calloc((size_t)n, sizeof(*s->t))) == NULL)) {
        free(s);
        ig_api_respond_oom(req);
        return;
    }
    s->req = req;
    uv_timer_init(gw->loop, &s->timer);
    s->timer.data = s;
    static const ig_upstream_cbs_t cbs = {on_headers, on_body, on_done};
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            ig_instance_state_t st = ig_instance_state(in);
            if ((st != IG_INSTANCE_READY && st != IG_INSTANCE_DRAINING) ||
                ig_instance_upstream(in) == NULL)
                continue;
            target_t *t = &s->t[s->ntargets++];
            t->s = s;
            snprintf(t->pool, sizeof(t->pool), "%s", ig_pool_name(pool));
            snprintf(t->instance, sizeof(t->instance), "%s", ig_instance_name(in));
            if (ig_upstream_request(ig_instance_upstream(in), "GET", "/metrics", NULL, NULL, 0,
                                    &cbs, t, &t->ureq) == 0)
                s->pending++;
            else
                t->ureq = NULL;
        }
    }
    if (s->pending == 0) {
        finish(s);
        return;
    }
    uv_timer_start(&s->timer, on_timeout, FEDERATE_TIMEOUT_MS, 0);
}

/* ---- the upstreams' gauges ---------------------------------------------- */

typedef double upstream_value_fn(const ig_gateway_t *gw, const ig_router_upstream_t *u);

/* emit(value of u) for every site and every pool instance, labelled by the
 * upstream's name. */
static void each_upstream(ig_gateway_t *gw, upstream_value_fn *value, ig_metrics_emit_fn *emit,
                          void *ctx)
{
    for (int s = 0; s < gw->nsites; s++) {
        const ig_router_upstream_t *u = ig_site_route(gw->sites[s]);
        emit(ctx, &u->name, value(gw, u));
    }
    for (int p = 0; p < gw->npools; p++) {
        for (int i = 0; i < ig_pool_size(gw->pools[p]); i++) {
            const ig_router_upstream_t *u = ig_instance_route(ig_pool_instance(gw->pools[p], i));
            emit(ctx, &u->name, value(gw, u));
        }
    }
}

static double inflight_of(const ig_gateway_t *gw, const ig_router_upstream_t *u)
{
    (void)gw;
    return u->inflight;
}

static double rtt_of(const ig_gateway_t *gw, const ig_router_upstream_t *u)
{
    (void)gw;
    return u->rtt_s;
}

static double svc_of(const ig_gateway_t *gw, const ig_router_upstream_t *u)
{
    (void)gw;
    return u->svc_s;
}

static double limit_of(const ig_gateway_t *gw, const ig_router_upstream_t *u)
{
    return ig_proxy_upstream_limit(gw->proxy, u);
}

static double concurrency_of(const ig_gateway_t *gw, const ig_router_upstream_t *u)
{
    (void)gw;
    return ig_router_concurrency(u);
}

#define UPSTREAM_GAUGE(fn, value)                                                                  \
    static void fn(void *data, ig_metrics_emit_fn *emit, void *ctx)                                \
    {                                                                                              \
        each_upstream(data, value, emit, ctx);                                                     \
    }
UPSTREAM_GAUGE(collect_inflight, inflight_of)
UPSTREAM_GAUGE(collect_rtt, rtt_of)
UPSTREAM_GAUGE(collect_svc, svc_of)
UPSTREAM_GAUGE(collect_limit, limit_of)
UPSTREAM_GAUGE(collect_concurrency, concurrency_of)

void ig__gateway_upstream_gauges(ig_gateway_t *gw)
{
    static const struct {
        const char *name, *help;
        ig_metrics_collect_fn *collect;
    } g[] = {
        {"infergate_upstream_inflight", "Attempts in flight on each upstream.", collect_inflight},
        {"infergate_upstream_rtt_ewma_seconds", "Peak-EWMA round-trip time of each upstream.",
         collect_rtt},
        {"infergate_upstream_ttft_ewma_seconds",
         "EWMA of the service time to first token of each upstream.", collect_svc},
        {"infergate_upstream_concurrency_limit",
         "Adaptive limit of attempts in flight on each upstream.", collect_limit},
        {"infergate_upstream_concurrency",
         "Concurrency the router believes each upstream has (reported slots, else learned).",
         collect_concurrency},
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++)
        ig_metrics_gauge_collect(g[i].name, g[i].help, "upstream", g[i].collect, gw);
}
