/*
 * The gateway's documents: GET /load (this region's aggregate, for peer
 * gateways; the codec is api/load.c), GET /status (pools, instances,
 * devices, autoscaler decisions, sites, the chart's history), GET /v1/models
 * and GET / (the status page of page.c).
 */
#include "gateway_internal.h"
#include "infergate/api.h"
#include "infergate/error.h"
#include "infergate/kv_feed.h"
#include "infergate/load.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A model with versions lists them: {"version", "weight", "share"}, the
 * share being its part of the requests that pin none. */
static void add_versions(const ig_config_t *cfg, json_t *data)
{
    size_t k;
    json_t *entry;
    json_array_foreach(data, k, entry)
    {
        const char *id = json_string_value(json_object_get(entry, "id"));
        double total = 0;
        for (size_t i = 0; id != NULL && i < cfg->nmodels; i++) {
            if (cfg->models[i].version != NULL && strcmp(cfg->models[i].name, id) == 0)
                total += cfg->models[i].weight;
        }
        json_t *versions = json_array();
        for (size_t i = 0; id != NULL && versions != NULL && i < cfg->nmodels; i++) {
            const ig_config_model_t *m = &cfg->models[i];
            if (m->version == NULL || strcmp(m->name, id) != 0)
                continue;
            json_array_append_new(versions, json_pack("{s:s, s:f, s:f}", "version", m->version,
                                                      "weight", m->weight, "share",
                                                      total > 0 ? m->weight / total : 0.0));
        }
        if (versions != NULL && json_array_size(versions) > 0)
            json_object_set_new(entry, "versions", versions);
        else
            json_decref(versions);
    }
}

void ig_gateway_models(ig_http_req_t *req, void *data)
{
    ig_gateway_t *gw = data;
    const char *ids[256];
    int n = 0;
    const ig_config_t *cfg = gw->cfg;
    for (size_t i = 0; i < cfg->nmodels && n < 256; i++) {
        int dup = 0; /* the versions of a rollout share a name */
        for (int j = 0; j < n && !dup; j++)
            dup = strcmp(ids[j], cfg->models[i].name) == 0;
        if (!dup && ig__gateway_model_known(gw, cfg->models[i].name))
            ids[n++] = cfg->models[i].name;
    }
    for (int s = 0; s < gw->nsites; s++) {
        for (int i = 0; i < ig_site_nmodels(gw->sites[s]) && n < 256; i++) {
            const char *id = ig_site_model(gw->sites[s], i);
            int dup = 0;
            for (int j = 0; j < n && !dup; j++)
                dup = strcmp(ids[j], id) == 0;
            if (!dup)
                ids[n++] = id;
        }
    }
    json_t *doc = ig_api_models_json(ids, n, (long long)time(NULL), "infergate");
    add_versions(cfg, json_object_get(doc, "data"));
    ig_api_respond_json(req, 200, doc);
}

/* Sums what the local instances report. Sites are left out on purpose: a
 * peer that counted our sites would count itself back. */
void ig_gateway_load(ig_http_req_t *req, void *data)
{
    ig_gateway_t *gw = data;
    ig_load_t l;
    ig_load_init(&l);
    l.has = IG_LOAD_GATEWAY_FIELDS;
    l.region = gw->region;
    l.waiting = ig_proxy_queued(gw->proxy);
    l.inflight = ig_proxy_inflight(gw->proxy);
    double est_wait = -1;
    double ttft = -1; /* our own predicted TTFT of an empty prompt, best instance */
    uint64_t now = uv_hrtime();
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        int pool_ready = 0;
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            if (ig_instance_state(in) != IG_INSTANCE_READY)
                continue;
            l.ready_instances++;
            pool_ready = 1;
            ig_router_upstream_t *u = ig_instance_route(in);
            l.waiting += u->reported_waiting;
            l.running += u->inflight;
            /* One request runs on one instance: the rate it sees is the
             * best instance's, not the sum. */
            if (u->reported_prefill_tps > l.prefill_tokens_per_s)
                l.prefill_tokens_per_s = u->reported_prefill_tps;
            double c = ig_router_cost(ig_proxy_router(gw->proxy), u, 0, now);
            if (ttft < 0 || c < ttft)
                ttft = c;
            l.max_num_seqs += u->slots;
            if (est_wait < 0 || u->reported_wait_s < est_wait)
                est_wait = u->reported_wait_s;
            const ig_load_t *il = ig_instance_load(in);
            if (il->has & IG_LOAD_DECODE_TPS)
                l.decode_tokens_per_s += il->decode_tokens_per_s;
        }
        if (pool_ready) {
            int dup = 0;
            for (int j = 0; j < l.nmodels && !dup; j++)
                dup = strcmp(l.models[j], ig_pool_model(pool)) == 0;
            if (!dup && l.nmodels < IG_LOAD_MAX_MODELS)
                l.models[l.nmodels++] = ig_pool_model(pool);
        }
    }
    l.est_wait_s = est_wait < 0 ? 0.0 : est_wait;
    /* What a peer adds to its round trip to us: our best instance's
     * predicted time to first token, inner hop included. */
    l.ttft_s = ttft < 0 ? 0.0 : ttft;
    ig_api_respond_json(req, 200, ig_load_encode(&l));
}

/* The pool's device slots: which instance holds each. New reference. */
static json_t *status_devices(ig_pool_t *pool)
{
    json_t *devs = json_array();
    for (int i = 0; i < ig_pool_size(pool); i++) {
        ig_instance_t *in = ig_pool_instance(pool, i);
        int used = ig_instance_holds_device(in);
        json_t *d = json_pack("{s:s, s:s, s:o}", "device", ig_instance_device(in), "state",
                              used ? "used" : "free", "instance",
                              used ? json_string(ig_instance_name(in)) : json_null());
        if (ig_instance_threads(in) > 0)
            json_object_set_new(d, "threads", json_integer(ig_instance_threads(in)));
        json_array_append_new(devs, d);
    }
    return devs;
}

static json_t *status_decisions(const ig_scaler_t *sc, const ig_pool_t *pool)
{
    json_t *arr = json_array();
    const ig_scaler_record_t *r;
    for (int k = 0; (r = ig_scaler_record(sc, pool, k)) != NULL; k++) {
        json_array_append_new(
            arr,
            json_pack("{s:I, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f}", "unix_ms",
                      (json_int_t)r->unix_ms, "direction", r->direction, "reason", r->reason,
                      "limit", r->limit, "current", r->current, "ready", r->ready, "desired",
                      r->desired, "raw", r->raw, "available_devices", r->free_devices, "load",
                      r->load, "stable_load", r->stable_load, "panic_load", r->panic_load));
    }
    return arr;
}

static json_t *status_autoscale(const ig_autoscale_params_t *a)
{
    if (a == NULL)
        return json_object();
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "target_queue_depth",
                     a->target_queue_depth, "stable_window_s", a->stable_window_s, "panic_window_s",
                     a->panic_window_s, "panic_threshold", a->panic_threshold, "max_scale_up_rate",
                     a->max_scale_up_rate, "max_scale_down_rate", a->max_scale_down_rate,
                     "scale_down_delay_s", a->scale_down_delay_s, "scale_to_zero_after_s",
                     a->scale_to_zero_after_s);
}

static json_t *status_history(const ig_gateway_t *gw);
/* The adaptive concurrency limit of an upstream and why it last moved, the
 * concurrency the router believes it has, added to its /status object. */
/* An upstream's price and what its answers cost per 1M generated tokens
 * lately (null: unpriced, or nothing generated); adds its spend rate to
 * *rate. */
static void status_cost(json_t *o, ig_router_upstream_t *u, const ig_price_t *p, uint64_t now,
                        double *rate)
{
    static const char *const kinds[] = {"none", "per_hour", "per_token"};
    if (!json_is_object(o))
        return;
    double per_1m = ig_cost_meter_per_1m(&u->cost, now);
    json_object_set_new(o, "price", json_string(kinds[p->kind]));
    json_object_set_new(o, "cost_per_1m_output_tokens",
                        p->kind != IG_PRICE_NONE && isfinite(per_1m) ? json_real(per_1m)
                                                                     : json_null());
    if (p->kind != IG_PRICE_NONE)
        *rate += ig_cost_meter_rate(&u->cost, now);
}

/* The buckets by the attempts of ours in flight when one began that have
 * samples, as [rif, samples, seconds]. */
static json_t *rif_buckets(const int *n, const double *mean)
{
    json_t *a = json_array();
    for (int k = 0; k < IG_ROUTER_RIF_BUCKETS; k++) {
        if (n[k] > 0)
            json_array_append_new(a, json_pack("[i, i, f]", k, n[k], mean[k]));
    }
    return a;
}

static void status_limit(json_t *o, ig_gateway_t *gw, const ig_router_upstream_t *u)
{
    const ig_router_t *r = ig_proxy_router(gw->proxy);
    if (!json_is_object(o))
        return;
    json_object_set_new(o, "concurrency_limit", json_integer(ig_router_limit(r, u)));
    json_object_set_new(o, "limit_reason",
                        json_string(u->limit_reason ? u->limit_reason : "initial"));
    json_object_set_new(o, "limit_changes", json_integer((json_int_t)u->limit_changes));
    json_object_set_new(o, "limit_w_s", json_real(u->limit_w_s));
    json_object_set_new(o, "limit_baseline_s", json_real(u->limit_base_s));
    json_object_set_new(o, "limit_throughput_per_s", json_real(u->limit_x_per_s));
    json_object_set_new(o, "concurrency", json_real(ig_router_concurrency(u)));
    /* What the learned concurrency is fitted to: the mean hold time by the
     * attempts of ours in flight when one began. */
    json_object_set_new(o, "hold_by_rif", rif_buckets(u->rif_n, u->rif_hold_s));
    json_object_set_new(o, "hold_base_s", json_real(u->hold_base_s));
    json_object_set_new(o, "hold_svc_s", json_real(u->hold_svc_s));
    /* The same by times to first token (streams), and the C of a wait for
     * a place seen there (0: none), which lowers the hold's. */
    json_object_set_new(o, "first_token_by_rif", rif_buckets(u->wait_rif_n, u->wait_rif_s));
    json_object_set_new(o, "first_token_c", json_real(u->wait_c));
    json_object_set_new(o, "order_c", json_real(ig_router_order_c(u, uv_hrtime())));
    /* The learned time to first token less the RTT and the predicted wait
     * (the cost's prefill part), and how many answers it has seen. */
    json_object_set_new(o, "service_s", json_real(u->svc_samples > 0 ? u->svc_s : 0.0));
    json_object_set_new(o, "service_samples", json_integer((json_int_t)u->svc_samples));
}

/* "prefix_index": "exact" while the worker's KV events are live, else
 * "approximate", and what the subscription knows (docs/routing.md). */
static void status_kv_index(json_t *o, const ig_instance_t *in)
{
    const ig_kv_feed_t *f = ig_instance_kv_feed(in);
    ig_kv_feed_info_t fi;
    if (o == NULL)
        return;
    if (f == NULL) {
        json_object_set_new(o, "prefix_index", json_string("approximate"));
        return;
    }
    ig_kv_feed_info(f, &fi);
    json_object_set_new(o, "prefix_index", json_string(fi.live ? "exact" : "approximate"));
    json_object_set_new(o, "kv_events",
                        json_pack("{s:b, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:s, s:s}", "live",
                                  fi.live, "blocks", fi.blocks, "capacity", fi.capacity,
                                  "block_size", fi.block_size, "seq", (json_int_t)fi.seq,
                                  "snapshots", (json_int_t)fi.snapshots, "losses",
                                  (json_int_t)fi.losses, "loads", (json_int_t)fi.loads, "epoch",
                                  fi.epoch, "last_error", fi.last_error));
}

/* A site's row of /status; its spend added to *spend. */
static json_t *status_site(ig_gateway_t *gw, ig_site_t *site, uint64_t now, double *spend)
{
    ig_router_upstream_t *u = ig_site_route(site);
    json_t *models = json_array();
    for (int i = 0; i < ig_site_nmodels(site); i++)
        json_array_append_new(models, json_string(ig_site_model(site, i)));
    json_t *row =
        json_pack("{s:s, s:s, s:b, s:b, s:f, s:i, s:o, s:b}", "name", ig_site_name(site), "region",
                  ig_site_region(site) ? ig_site_region(site) : "", "up", ig_site_up(site), "peer",
                  ig_site_is_peer(site), "rtt_s", u->rtt_s, "inflight", u->inflight, "models",
                  models, "eligible", ig_router_eligible(u, now));
    status_limit(row, gw, u);
    ig_price_t price = ig__gateway_price_of(gw, ig_site_name(site), 1);
    status_cost(row, u, &price, now, spend);
    json_object_set_new(row, "rtt_probes", json_integer((json_int_t)ig_site_rtt_probes(site)));
    double running, waiting, age;
    const char *server = ig_site_metrics(site, &running, &waiting, &age);
    if (server != NULL)
        json_object_set_new(row, "metrics",
                            json_pack("{s:s, s:f, s:f, s:f}", "server", server, "running", running,
                                      "waiting", waiting, "age_s", age));
    return row;
}

void ig_gateway_status(ig_http_req_t *req, void *data)
{
    ig_gateway_t *gw = data;
    json_t *pools = json_array();
    uint64_t now = uv_hrtime();
    double spend = 0; /* USD per hour, the priced upstreams together */
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        ig_price_t price = ig__gateway_price_of(gw, ig_pool_name(pool), 0);
        json_t *insts = json_array();
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            ig_router_upstream_t *u = ig_instance_route(in);
            json_array_append_new(
                insts,
                json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:b}", "name",
                          ig_instance_name(in), "device", ig_instance_device(in), "state",
                          ig_instance_state_name(ig_instance_state(in)), "pid", ig_instance_pid(in),
                          "restarts", ig_instance_restarts(in), "inflight", u->inflight, "rtt_s",
                          u->rtt_s, "ttft_s", u->svc_s, "eligible", ig_router_eligible(u, now)));
            status_limit(json_array_get(insts, json_array_size(insts) - 1), gw, u);
            status_cost(json_array_get(insts, json_array_size(insts) - 1), u, &price, now, &spend);
            status_kv_index(json_array_get(insts, json_array_size(insts) - 1), in);
        }
        json_t *counts = json_object();
        static const ig_instance_state_t states[] = {IG_INSTANCE_STARTING, IG_INSTANCE_READY,
                                                     IG_INSTANCE_DRAINING, IG_INSTANCE_BACKOFF};
        for (size_t k = 0; k < sizeof(states) / sizeof(states[0]); k++)
            json_object_set_new(counts, ig_instance_state_name(states[k]),
                                json_integer(ig_pool_count(pool, states[k])));
        json_array_append_new(
            pools,
            json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:o, s:o, s:o, s:o, s:o}",
                      "name", ig_pool_name(pool), "model", ig_pool_model(pool), "min_instances",
                      ig_pool_min_instances(pool), "max_instances", ig_pool_max_instances(pool),
                      "desired_instances", ig_scaler_desired(gw->scaler, pool), "devices_used",
                      ig_pool_in_use(pool), "devices_free",
                      ig_pool_size(pool) - ig_pool_in_use(pool), "devices_available",
                      ig_pool_available(pool), "load",
                      gw->scaler ? ig_scaler_load(gw->scaler, pool) : 0.0, "instance_counts",
                      counts, "devices", status_devices(pool), "instances", insts, "autoscale",
                      status_autoscale(ig_scaler_params(gw->scaler, pool)), "decisions",
                      status_decisions(gw->scaler, pool)));
        /* What the autoscaler ranks the pool's capacity by (docs/autoscale.md). */
        double per_1m = gw->scaler ? ig_scaler_cost_per_1m(gw->scaler, pool) : NAN;
        json_object_set_new(json_array_get(pools, json_array_size(pools) - 1),
                            "capacity_cost_per_1m_output_tokens",
                            isnan(per_1m) ? json_null() : json_real(per_1m));
    }
    json_t *sites = json_array();
    for (int s = 0; s < gw->nsites; s++)
        json_array_append_new(sites, status_site(gw, gw->sites[s], now, &spend));
    json_t *doc =
        json_pack("{s:s, s:s, s:o, s:o, s:i, s:i}", "region", gw->region, "policy",
                  ig_route_policy_name(gw->cfg->routing.policy), "pools", pools, "sites", sites,
                  "inflight", ig_proxy_inflight(gw->proxy), "queued", ig_proxy_queued(gw->proxy));
    json_object_set_new(doc, "history", status_history(gw));
    json_object_set_new(doc, "spend_usd_per_hour", json_real(spend));
    ig_api_respond_json(req, 200, doc);
}

/* ---- the chart's history and the page ------------------------------------ */

/* One point of the status page's chart, every IG_STATUS_HISTORY_MS over
 * the last IG_STATUS_HISTORY points. */
#define IG_STATUS_HISTORY 150
#define IG_STATUS_HISTORY_MS 2000
typedef struct {
    long long unix_ms;
    int queued;    /* held by the proxy */
    int waiting;   /* waiting in the instances, as they last reported */
    double ttft_s; /* mean TTFT of the requests answered since the last point; -1: none */
} status_sample_t;

/* The chart's history: a ring of points, oldest at head, sampled by its
 * own timer. The gateway holds the pointer (gw->history), status.c the rest. */
struct ig__status_history_s {
    uv_timer_t timer;
    ig_gateway_t *gw;
    status_sample_t points[IG_STATUS_HISTORY];
    int n, head;
    double ttft_sum; /* the proxy's TTFT totals at the last point */
    long long ttft_count;
    void (*close_cb)(void *data);
    void *close_data;
};

static void on_history_timer(uv_timer_t *t)
{
    ig__status_history_t *h = t->data;
    ig_gateway_t *gw = h->gw;
    status_sample_t sm;
    sm.unix_ms = (long long)time(NULL) * 1000;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
        sm.unix_ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    sm.queued = ig_proxy_queued(gw->proxy);
    sm.waiting = 0;
    for (int p = 0; p < gw->npools; p++) {
        for (int i = 0; i < ig_pool_size(gw->pools[p]); i++) {
            ig_instance_t *in = ig_pool_instance(gw->pools[p], i);
            if (ig_instance_state(in) == IG_INSTANCE_READY)
                sm.waiting += ig_instance_route(in)->reported_waiting;
        }
    }
    /* The mean TTFT of the requests answered since the last point. */
    double sum;
    long long count;
    ig_proxy_ttft_totals(gw->proxy, &sum, &count);
    sm.ttft_s = count > h->ttft_count ? (sum - h->ttft_sum) / (double)(count - h->ttft_count) : -1;
    h->ttft_sum = sum;
    h->ttft_count = count;
    ig__gateway_cost_tick(gw);
    int slot = (h->head + h->n) % IG_STATUS_HISTORY;
    h->points[slot] = sm;
    if (h->n < IG_STATUS_HISTORY)
        h->n++;
    else
        h->head = (h->head + 1) % IG_STATUS_HISTORY;
}

int ig__status_history_start(ig_gateway_t *gw)
{
    ig__status_history_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return IG_ENOMEM;
    h->gw = gw;
    uv_timer_init(gw->loop, &h->timer);
    h->timer.data = h;
    uv_timer_start(&h->timer, on_history_timer, 0, IG_STATUS_HISTORY_MS);
    gw->history = h;
    return 0;
}

static void on_history_closed(uv_handle_t *handle)
{
    ig__status_history_t *h = handle->data;
    void (*cb)(void *) = h->close_cb;
    void *data = h->close_data;
    free(h);
    if (cb != NULL)
        cb(data);
}

void ig__status_history_close(ig_gateway_t *gw, void (*cb)(void *data), void *data)
{
    ig__status_history_t *h = gw->history;
    if (h == NULL) {
        if (cb != NULL)
            cb(data);
        return;
    }
    gw->history = NULL;
    h->close_cb = cb;
    h->close_data = data;
    uv_close((uv_handle_t *)&h->timer, on_history_closed);
}

/* The chart's points, oldest first. New reference. */
static json_t *status_history(const ig_gateway_t *gw)
{
    const ig__status_history_t *h = gw->history;
    json_t *arr = json_array();
    for (int k = 0; h != NULL && k < h->n; k++) {
        const status_sample_t *s = &h->points[(h->head + k) % IG_STATUS_HISTORY];
        json_array_append_new(arr,
                              json_pack("{s:I, s:i, s:i, s:o}", "unix_ms", (json_int_t)s->unix_ms,
                                        "queued", s->queued, "waiting", s->waiting, "ttft_s",
                                        s->ttft_s < 0 ? json_null() : json_real(s->ttft_s)));
    }
    return json_pack("{s:i, s:o}", "interval_ms", IG_STATUS_HISTORY_MS, "samples", arr);
}

void ig_gateway_page(ig_http_req_t *req, void *data)
{
    (void)data;
    ig_http_add_header(req, "Cache-Control", "no-cache");
    ig_http_respond(req, 200, "text/html; charset=utf-8", ig__status_page, ig__status_page_len);
}
