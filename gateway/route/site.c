/*
 * Remote sites and their background probes (see include/infergate/site.h).
 */
#include "infergate/site.h"
#include "infergate/error.h"
#include "infergate/load.h"
#include "infergate/log.h"
#include "infergate/prom_text.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SITE_MODELS 64

/* PROBE_RTT is the cheap probe of an idle plain site (GET /health, timed
 * for its RTT only); the others are the liveness cycle, which for a plain
 * site ends with its /metrics while that has gauges we know. */
typedef enum { PROBE_LOAD, PROBE_HEALTH, PROBE_MODELS, PROBE_RTT, PROBE_METRICS } probe_kind_t;

/* The queue gauges of the servers a plain site may run: requests being
 * served and requests waiting for a slot, over every replica that sends
 * there (docs/routing.md, "A plain site's own load"). */
static const struct {
    const char *server, *running, *waiting;
} gauges[] = {
    {"vllm", "vllm:num_requests_running", "vllm:num_requests_waiting"},
    {"sglang", "sglang:num_running_reqs", "sglang:num_queue_reqs"},
    {"llama.cpp", "llamacpp:requests_processing", "llamacpp:requests_deferred"},
    {"tgi", "tgi_batch_current_size", "tgi_queue_size"},
};

struct ig_site_s {
    uv_loop_t *loop;
    char *name, *url, *region;
    char *models[MAX_SITE_MODELS];
    int nmodels;
    int fixed_models; /* from config: not replaced by discovery */
    ig_site_spec_t spec;
    ig_upstream_t *client;
    ig_router_upstream_t route;
    uv_timer_t timer;
    uv_timer_t rtt_timer;     /* checks ig_router_probe_due() every rtt_probe_s */
    int liveness_due;         /* the liveness timer fired while an RTT probe ran */
    ig_upstream_req_t *probe; /* the one probe in flight, of either kind */
    probe_kind_t kind;
    uint64_t sent_ns;
    int status;
    char *body;
    size_t len;
    int peer;       /* -1 unknown, 0 no, 1 yes */
    int metrics;    /* -1 unknown, 0 no gauges we know, else 1 + index into gauges */
    double running; /* from the last /metrics */
    double waiting;
    uint64_t metrics_at_ns;
    int failures;        /* probes failed in a row */
    uint64_t rtt_probes; /* cheap RTT probes answered (ig_site_rtt_probes) */
    int closing;
    int pending_closes;
    void (*close_cb)(void *data);
    void *close_data;
};

static void probe_send(ig_site_t *s, probe_kind_t kind);

/* "a, b, c" of the list, cut to fit. */
static void join_models(char *out, size_t cap, char *const *ids, int n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len + 1 < cap; i++) {
        int w = snprintf(out + len, cap - len, "%s%s", i ? ", " : "", ids[i]);
        if (w < 0)
            break;
        len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
    }
}

static int listed(char *const *ids, int n, const char *id)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(ids[i], id) == 0)
            return 1;
    }
    return 0;
}

/* Replaces the discovered models (config-fixed ones stay) and logs a
 * change: the site is followed, whatever it serves now. */
static void set_models(ig_site_t *s, const char *const *ids, int n)
{
    if (s->fixed_models)
        return;
    char *next[MAX_SITE_MODELS];
    int nn = 0;
    for (int i = 0; i < n && nn < MAX_SITE_MODELS; i++) {
        if (listed(next, nn, ids[i]))
            continue;
        if ((next[nn] = strdup(ids[i])) == NULL)
            break;
        nn++;
    }
    int same = nn == s->nmodels;
    for (int i = 0; same && i < nn; i++)
        same = listed(s->models, s->nmodels, next[i]);
    if (!same) {
        char now[512], was[512];
        join_models(now, sizeof(now), next, nn);
        join_models(was, sizeof(was), s->models, s->nmodels);
        IG_INFO("site %s: models now [%s] (were [%s])", s->name, now, was);
    }
    for (int i = 0; i < s->nmodels; i++)
        free(s->models[i]);
    memcpy(s->models, next, (size_t)nn * sizeof(next[0]));
    s->nmodels = nn;
}

/* GET /v1/models of an OpenAI-compatible site: {"data": [{"id": ...}]}. */
static void set_models_from(ig_site_t *s, json_t *arr)
{
    const char *ids[MAX_SITE_MODELS];
    int n = 0;
    size_t i;
    json_t *m;
    if (!json_is_array(arr))
        return;
    json_array_foreach(arr, i, m)
    {
        const char *id =
            json_is_string(m) ? json_string_value(m) : json_string_value(json_object_get(m, "id"));
        if (id != NULL && n < MAX_SITE_MODELS)
            ids[n++] = id;
    }
    set_models(s, ids, n);
}

static void mark(ig_site_t *s, int ok)
{
    if (ok) {
        if (!s->route.ready)
            IG_INFO("site %s: up (%s, %d models)", s->name,
                    s->peer == 1 ? "infergate peer" : "openai", s->nmodels);
        s->failures = 0;
        s->route.ready = 1;
        return;
    }
    if (++s->failures >= s->spec.probe_failures_down && s->route.ready) {
        IG_WARN("site %s: down after %d failed probes", s->name, s->failures);
        s->route.ready = 0;
    }
}

static void probe_on_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                             const char *const *values, void *data)
{
    ((ig_site_t *)data)->status = status;
}

static void probe_on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    ig_site_t *s = data;
    if (s->len + len > 256 * 1024)
        return;
    char *n = realloc(s->body, s->len + len + 1);
    if (n == NULL)
        return;
    memcpy(n + s->len, buf, len);
    s->len += len;
    n[s->len] = '\0';
    s->body = n;
}

static void on_probe_timer(uv_timer_t *t)
{
    ig_site_t *s = t->data;
    if (s->probe != NULL) {
        s->liveness_due = 1; /* after the RTT probe in flight */
        return;
    }
    probe_send(s, s->peer == 0 ? PROBE_HEALTH : PROBE_LOAD);
}

/* The cheap active probe (docs/routing.md, "Probes"): a plain site that is
 * up and idle gets one timed GET /health when the router says its RTT is
 * stale; never a second probe beside one in flight. */
static void on_rtt_timer(uv_timer_t *t)
{
    ig_site_t *s = t->data;
    if (s->closing || s->probe != NULL || s->peer != 0 || s->spec.router == NULL)
        return;
    if (ig_router_probe_due(s->spec.router, &s->route, uv_hrtime()))
        probe_send(s, PROBE_RTT);
}

/* A plain site's /metrics (NULL: it has none): the first server of gauges
 * whose waiting gauge it publishes gives the router the site's queue,
 * every replica's requests included. A site without one is not asked
 * again. */
static void read_metrics(ig_site_t *s, const char *text, size_t len, uint64_t now)
{
    int k = s->metrics > 0 ? s->metrics - 1 : 0;
    int n = (int)(sizeof(gauges) / sizeof(gauges[0]));
    double waiting = 0, running = 0;
    for (int tries = 0; text != NULL && tries < n; tries++, k = (k + 1) % n) {
        if (ig_prom_sum(text, len, gauges[k].waiting, &waiting) > 0) {
            if (s->metrics != k + 1)
                IG_INFO("site %s: its queue from /metrics (%s)", s->name, gauges[k].server);
            s->metrics = k + 1;
            ig_prom_sum(text, len, gauges[k].running, &running);
            s->running = running;
            s->waiting = waiting;
            s->metrics_at_ns = now;
            s->route.reported_waiting = waiting;
            s->route.reported_at_ns = now;
            return;
        }
    }
    if (s->metrics != 0)
        IG_INFO("site %s: no queue gauge in /metrics (vLLM, SGLang, llama.cpp, TGI); routing "
                "on this gateway's own counts",
                s->name);
    s->metrics = 0;
}

/* An infergate peer's /load report into the router's view of the site. */
static void apply_peer_load(ig_site_t *s, const ig_load_t *l, uint64_t now)
{
    s->peer = 1;
    s->route.prefix_peer = (l->has & IG_LOAD_REGION) != 0;
    if (l->has & IG_LOAD_WAITING)
        s->route.reported_waiting = l->waiting;
    if (l->has & IG_LOAD_EST_WAIT)
        s->route.reported_wait_s = l->est_wait_s;
    /* A peer's own predicted TTFT (its inner hop, queue and service)
     * is part of any request's wait there. */
    if ((l->has & IG_LOAD_TTFT) && l->ttft_s > s->route.reported_wait_s)
        s->route.reported_wait_s = l->ttft_s;
    if (l->has & IG_LOAD_PREFILL_TPS)
        s->route.reported_prefill_tps = l->prefill_tokens_per_s;
    if (l->has & IG_LOAD_MAX_NUM_SEQS)
        s->route.slots = l->max_num_seqs;
    s->route.reported_at_ns = now;
    if (l->has & IG_LOAD_MODELS)
        set_models(s, l->models, l->nmodels);
    /* A peer with no ready instance cannot serve now. */
    mark(s, !(l->has & IG_LOAD_READY_INSTANCES) || l->ready_instances > 0);
}

static void probe_on_done(ig_upstream_req_t *r, int err, void *data)
{
    ig_site_t *s = data;
    uint64_t now = uv_hrtime();
    s->probe = NULL;
    int ok = err == 0 && s->status == 200;
    json_t *doc = NULL;
    ig_load_t load;
    int load_rc = IG_EPARSE;
    ig_load_init(&load);
    if (ok && s->body != NULL && s->kind == PROBE_LOAD)
        load_rc = ig_load_decode(s->body, s->len, &load, NULL, 0);
    else if (ok && s->body != NULL && s->kind != PROBE_METRICS)
        doc = json_loads(s->body, 0, NULL);
    probe_kind_t next = -1;
    if (err == 0)
        ig_router_observe_probe_rtt(s->spec.router, &s->route, (double)(now - s->sent_ns) / 1e9,
                                    now);

    switch (s->kind) {
    case PROBE_LOAD:
        if (ok && load_rc != IG_EPARSE) {
            apply_peer_load(s, &load, now);
        } else if (err == 0 && s->peer != 1) {
            s->peer = 0; /* not an infergate: fall back to health + models */
            next = PROBE_HEALTH;
        } else {
            mark(s, 0);
        }
        break;
    case PROBE_HEALTH:
        if (ok)
            next = PROBE_MODELS;
        else
            mark(s, 0);
        break;
    case PROBE_RTT:
        if (!ok)
            mark(s, 0); /* a failed /health is a failed probe, whichever sent it */
        s->rtt_probes++;
        break;
    case PROBE_MODELS:
        /* Models named in the config need no list from the site; a site
         * whose models we must discover is down until it gives a list. */
        if (ok && json_is_object(doc))
            set_models_from(s, json_object_get(doc, "data"));
        mark(s, ok && (s->fixed_models || json_is_object(doc)));
        if (ok && s->metrics != 0)
            next = PROBE_METRICS;
        break;
    case PROBE_METRICS:
        read_metrics(s, ok ? s->body : NULL, ok ? s->len : 0, now);
        break;
    }
    json_decref(doc);
    ig_load_dispose(&load);
    free(s->body);
    s->body = NULL;
    s->len = 0;
    if (s->closing)
        return;
    if ((int)next >= 0)
        probe_send(s, next);
    else if (s->kind != PROBE_RTT)
        uv_timer_start(&s->timer, on_probe_timer, s->spec.probe_interval_ms, 0);
    else if (s->liveness_due) {
        s->liveness_due = 0;
        probe_send(s, s->peer == 0 ? PROBE_HEALTH : PROBE_LOAD);
    }
}

static void probe_send(ig_site_t *s, probe_kind_t kind)
{
    static const ig_upstream_cbs_t cbs = {probe_on_headers, probe_on_body, probe_on_done};
    static const char *paths[] = {"/load", "/health", "/v1/models", "/health", "/metrics"};
    s->kind = kind;
    s->status = 0;
    s->sent_ns = uv_hrtime();
    if (ig_upstream_request(s->client, "GET", paths[kind], NULL, NULL, 0, &cbs, s, &s->probe) !=
            0 &&
        kind != PROBE_RTT)
        uv_timer_start(&s->timer, on_probe_timer, s->spec.probe_interval_ms, 0);
}

static void site_free(ig_site_t *s)
{
    for (int i = 0; i < s->nmodels; i++)
        free(s->models[i]);
    free(s->name);
    free(s->url);
    free(s->region);
    free(s->body);
    free(s);
}

int ig_site_start(ig_site_t **out, uv_loop_t *loop, const ig_site_spec_t *spec)
{
    ig_site_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return IG_ENOMEM;
    s->loop = loop;
    s->spec = *spec;
    s->name = strdup(spec->name);
    s->url = strdup(spec->url);
    s->region = spec->region ? strdup(spec->region) : NULL;
    s->peer = -1;
    s->metrics = -1;
    if (s->spec.probe_interval_ms == 0)
        s->spec.probe_interval_ms = 1000;
    if (s->spec.probe_failures_down <= 0)
        s->spec.probe_failures_down = 2;
    for (int i = 0; i < spec->nmodels && i < MAX_SITE_MODELS; i++)
        s->models[s->nmodels++] = strdup(spec->models[i]);
    s->fixed_models = spec->nmodels > 0;
    int rc = IG_ENOMEM;
    if (s->name == NULL || s->url == NULL)
        goto fail;
    ig_router_upstream_init(&s->route, s->name, IG_ROUTER_SITE);
    ig_upstream_opts_t uo;
    if (spec->upstream != NULL)
        uo = *spec->upstream;
    else
        ig_upstream_opts_default(&uo);
    if ((rc = ig_upstream_start(&s->client, loop, s->name, s->url, &uo)) != 0)
        goto fail;
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    uv_timer_init(loop, &s->rtt_timer);
    s->rtt_timer.data = s;
    if (spec->router != NULL && spec->router->opts.rtt_probe_s > 0) {
        uint64_t every = (uint64_t)(spec->router->opts.rtt_probe_s * 1000.0 + 0.5);
        uv_timer_start(&s->rtt_timer, on_rtt_timer, every ? every : 1, every ? every : 1);
    }
    probe_send(s, PROBE_LOAD);
    *out = s;
    return 0;
fail:
    site_free(s);
    return rc;
}

static void site_maybe_closed(ig_site_t *s)
{
    if (--s->pending_closes > 0)
        return;
    void (*cb)(void *) = s->close_cb;
    void *data = s->close_data;
    site_free(s);
    if (cb != NULL)
        cb(data);
}

static void on_timer_closed(uv_handle_t *h)
{
    site_maybe_closed(h->data);
}

static void on_client_closed(void *data)
{
    site_maybe_closed(data);
}

void ig_site_close(ig_site_t *s, void (*cb)(void *data), void *data)
{
    s->closing = 1;
    s->close_cb = cb;
    s->close_data = data;
    s->pending_closes = 3;
    if (s->probe != NULL) {
        ig_upstream_cancel(s->probe);
        s->probe = NULL;
    }
    uv_close((uv_handle_t *)&s->timer, on_timer_closed);
    uv_close((uv_handle_t *)&s->rtt_timer, on_timer_closed);
    ig_upstream_close(s->client, on_client_closed, s);
}

const char *ig_site_name(const ig_site_t *s)
{
    return s->name;
}

const char *ig_site_region(const ig_site_t *s)
{
    return s->region;
}

int ig_site_is_peer(const ig_site_t *s)
{
    return s->peer == 1;
}

int ig_site_up(const ig_site_t *s)
{
    return s->route.ready;
}

int ig_site_serves(const ig_site_t *s, const char *model)
{
    for (int i = 0; i < s->nmodels; i++) {
        if (strcmp(s->models[i], model) == 0)
            return 1;
    }
    return 0;
}

int ig_site_nmodels(const ig_site_t *s)
{
    return s->nmodels;
}

const char *ig_site_model(const ig_site_t *s, int i)
{
    return i >= 0 && i < s->nmodels ? s->models[i] : NULL;
}

uint64_t ig_site_rtt_probes(const ig_site_t *s)
{
    return s->rtt_probes;
}

ig_upstream_t *ig_site_upstream(ig_site_t *s)
{
    return s->client;
}

ig_router_upstream_t *ig_site_route(ig_site_t *s)
{
    return &s->route;
}

const char *ig_site_metrics(const ig_site_t *s, double *running, double *waiting, double *age_s)
{
    if (s->metrics <= 0)
        return NULL;
    *running = s->running;
    *waiting = s->waiting;
    *age_s = (double)(uv_hrtime() - s->metrics_at_ns) / 1e9;
    return gauges[s->metrics - 1].server;
}
