/*
 * The gateway of one region, composed from its config: the proxy, the
 * pools and their autoscaler driver, the sites (see
 * include/infergate/gateway.h). The /load, /status and /v1/models
 * documents are in status.c; the autoscaler driver is fleet/scaler.c.
 */
#include "gateway_internal.h"
#include "infergate/gguf.h"
#include "infergate/api.h"
#include "infergate/cli.h"
#include "infergate/devices.h"
#include "infergate/engine.h" /* ig_engine_kv_dtype_name */
#include "infergate/error.h"
#include "infergate/keys.h"
#include "infergate/kv_feed.h"
#include "infergate/log.h"
#include "infergate/prefix.h"
#include "infergate/tls.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- model files ------------------------------------------------------- */

/* Generates a preset model into its path when the directory lacks one. */
static int ensure_model(const ig_config_model_t *m, char *err, size_t errlen)
{
    char probe[1024];
    if (m->path == NULL || ig_gguf_is_gguf(m->path)) /* a GGUF file is the whole model */
        return 0;
    snprintf(probe, sizeof(probe), "%s/config.json", m->path);
    if (access(probe, R_OK) == 0)
        return 0;
    if (m->preset == NULL) {
        snprintf(err, errlen, "model '%s': %s has no config.json (and no preset to generate)",
                 m->name, m->path);
        return IG_ENOENT;
    }
    IG_INFO("model %s: generating preset '%s' into %s", m->name, m->preset, m->path);
    char *argv[] = {"mkmodel", "--preset", m->preset, "--out", m->path, NULL};
    if (ig_cmd_mkmodel(5, argv) != 0) {
        snprintf(err, errlen, "model '%s': generating preset '%s' into %s failed", m->name,
                 m->preset, m->path);
        return IG_EMODEL;
    }
    return 0;
}

/* ---- pool events and the resolver --------------------------------------- */

static void publish_instances(ig_gateway_t *gw, ig_pool_t *pool)
{
    static const ig_instance_state_t states[] = {IG_INSTANCE_STARTING, IG_INSTANCE_READY,
                                                 IG_INSTANCE_DRAINING, IG_INSTANCE_BACKOFF};
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
        ig_metric_set(gw->m_instances, ig_pool_count(pool, states[i]), ig_pool_name(pool),
                      ig_instance_state_name(states[i]));
}

int ig__gateway_ensure_model(const ig_config_model_t *m, char *err, size_t errlen)
{
    return ensure_model(m, err, errlen);
}

static void kick_versions(ig_gateway_t *gw, ig_pool_t *pool);

static void on_pool_event(ig_pool_t *pool, ig_instance_t *inst, void *data)
{
    ig_gateway_t *gw = data;
    /* A pool a reload is starting or retiring shares its name with the one
     * that routes: only the routed one publishes its instances. */
    if (!ig__gateway_routes_pool(gw, pool))
        return;
    publish_instances(gw, pool);
    if (gw->scaler != NULL)
        ig_scaler_pool_event(gw->scaler, pool, inst);
    if (inst != NULL && ig_instance_state(inst) == IG_INSTANCE_READY) {
        kick_versions(gw, pool);
        /* The scaler retries held requests for the pools it drives; a
         * discovered pool's new instance must do it here. */
        if (ig_pool_discovered(pool))
            ig_proxy_kick(gw->proxy, ig_pool_model(pool));
    }
}

/* ---- model versions (a rollout) ----------------------------------------- */

/* The version of the model a routed pool serves (NULL: the model has none). */
static const char *pool_version(const ig_gateway_t *gw, const ig_pool_t *pool)
{
    const ig_config_t *cfg = gw->cfg;
    for (size_t i = 0; i < cfg->npools; i++) {
        if (strcmp(cfg->pools[i].name, ig_pool_name(pool)) == 0)
            return cfg->pools[i].version;
    }
    return NULL;
}

/* 1 when the config gives the model versions. */
static int has_versions(const ig_gateway_t *gw, const char *model)
{
    for (size_t i = 0; i < gw->cfg->nmodels; i++) {
        const ig_config_model_t *m = &gw->cfg->models[i];
        if (m->version != NULL && strcmp(m->name, model) == 0)
            return 1;
    }
    return 0;
}

/* A routing key is the model's name, or "name@version" for a model with
 * versions (names of such models have no '@'). Writes the name into buf
 * and returns the version, or NULL. */
static const char *split_key(const ig_gateway_t *gw, const char *key, char *buf, size_t cap)
{
    const char *at = strrchr(key, '@');
    size_t n = strlen(key), m = at != NULL ? (size_t)(at - key) : n;
    if (cap == 0)
        return NULL;
    if (m >= cap)
        m = cap - 1;
    memcpy(buf, key, m);
    buf[m] = '\0';
    if (at == NULL || !has_versions(gw, buf)) {
        if (n >= cap)
            n = cap - 1;
        memcpy(buf, key, n);
        buf[n] = '\0';
        return NULL;
    }
    return at + 1;
}

/* 1 when a routed pool serves this version of the model. */
static int version_routed(const ig_gateway_t *gw, const char *model, const char *version)
{
    for (int p = 0; p < gw->npools; p++) {
        const char *v = pool_version(gw, gw->pools[p]);
        if (v != NULL && strcmp(v, version) == 0 && strcmp(ig_pool_model(gw->pools[p]), model) == 0)
            return 1;
    }
    return 0;
}

static double draw_unit(ig_gateway_t *gw)
{
    /* xorshift64*: a split by weight needs no more than this */
    uint64_t x = gw->rng ? gw->rng : (uv_hrtime() | 1);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    gw->rng = x;
    return (double)((x * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

/*
 * The routing key of a request for model: the name, or for a model with
 * versions "name@version" of the version the request pins with the
 * x-infergate-model-version header, else of one drawn by weight among
 * the versions a routed pool serves (all weights 0: evenly). *version
 * is that version (borrowed from the config) or NULL. 0, or -1 with a 404
 * in e when the pinned version is not served.
 */
static int route_key(ig_gateway_t *gw, ig_http_req_t *req, const char *model, char *key, size_t cap,
                     const char **version, ig_api_error_t *e)
{
    const ig_config_t *cfg = gw->cfg;
    const char *pin = ig_http_req_header(req, IG_GATEWAY_VERSION_HEADER);
    const ig_config_model_t *cand[64];
    int n = 0;
    double total = 0;
    *version = NULL;
    snprintf(key, cap, "%s", model);
    for (size_t i = 0; i < cfg->nmodels && n < 64; i++) {
        const ig_config_model_t *m = &cfg->models[i];
        if (m->version == NULL || strcmp(m->name, model) != 0 ||
            !version_routed(gw, model, m->version))
            continue;
        if (pin != NULL && strcmp(pin, m->version) == 0) {
            *version = m->version;
            snprintf(key, cap, "%s@%s", model, m->version);
            return 0;
        }
        cand[n++] = m;
        total += m->weight;
    }
    if (pin != NULL) {
        ig_api_error(e, 404, "model", "the model '%s' has no version '%s' that is served", model,
                     pin);
        e->code = "model_version_not_found";
        return -1;
    }
    if (n == 0)
        return 0;
    double x = draw_unit(gw) * (total > 0 ? total : n);
    int k = 0;
    for (; k < n - 1; k++) {
        x -= total > 0 ? cand[k]->weight : 1;
        if (x < 0)
            break;
    }
    *version = cand[k]->version;
    snprintf(key, cap, "%s@%s", model, cand[k]->version);
    return 0;
}

/* Held requests of a versioned model wait under their version's key: an
 * instance that became ready retries those too. */
static void kick_versions(ig_gateway_t *gw, ig_pool_t *pool)
{
    const char *v = pool_version(gw, pool);
    if (v == NULL)
        return;
    char key[512];
    snprintf(key, sizeof(key), "%s@%s", ig_pool_model(pool), v);
    ig_proxy_kick(gw->proxy, key);
}

void ig__gateway_kick_versions(ig_gateway_t *gw, ig_pool_t *pool)
{
    kick_versions(gw, pool);
}

/* The upstreams of a routing key (a model, or model@version); a request
 * (note) is counted by the scaler. */
ig_price_t ig__gateway_price_of(const ig_gateway_t *gw, const char *name, int is_site)
{
    const ig_config_t *cfg = gw->cfg;
    ig_price_t none = {IG_PRICE_NONE, 0, 0, 0};
    for (size_t i = 0; !is_site && i < cfg->npools; i++)
        if (strcmp(cfg->pools[i].name, name) == 0)
            return cfg->pools[i].price;
    for (size_t i = 0; is_site && i < cfg->nsites; i++)
        if (strcmp(cfg->sites[i].name, name) == 0)
            return cfg->sites[i].price;
    return none;
}

/* The scaler's view of a pool's price (the config in force). */
static ig_price_t scaler_price(void *data, const ig_pool_t *pool)
{
    return ig__gateway_price_of(data, ig_pool_name(pool), 0);
}

static int targets_of(ig_gateway_t *gw, const char *key, ig_proxy_target_t *out, int max,
                      int *starting, int note)
{
    int n = 0;
    uint64_t now = uv_hrtime();
    char model[512];
    const char *version = split_key(gw, key, model, sizeof(model));
    *starting = 0;
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        if (strcmp(ig_pool_model(pool), model) != 0)
            continue;
        if (version != NULL) {
            const char *v = pool_version(gw, pool);
            if (v == NULL || strcmp(v, version) != 0)
                continue;
        }
        /* Scaled to zero (or its last instance is on its way out): a
         * request is what wakes the pool up; it is held meanwhile. */
        if (note && ig_scaler_request(gw->scaler, pool, now))
            *starting |= ig_pool_count(pool, IG_INSTANCE_READY) == 0;
        ig_price_t price = ig__gateway_price_of(gw, ig_pool_name(pool), 0);
        for (int i = 0; i < ig_pool_size(pool) && n < max; i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            ig_instance_state_t st = ig_instance_state(in);
            if (st == IG_INSTANCE_STARTING || st == IG_INSTANCE_BACKOFF)
                *starting = 1;
            if (st == IG_INSTANCE_STOPPED)
                continue;
            out[n].client = ig_instance_upstream(in);
            out[n].route = ig_instance_route(in);
            out[n].is_site = 0;
            out[n].price = price;
            n++;
        }
    }
    /* Sites serve a model, not one of its versions. */
    for (int s = 0; s < gw->nsites && n < max && version == NULL; s++) {
        if (!ig_site_serves(gw->sites[s], model))
            continue;
        out[n].client = ig_site_upstream(gw->sites[s]);
        out[n].route = ig_site_route(gw->sites[s]);
        out[n].is_site = 1;
        out[n].price = ig__gateway_price_of(gw, ig_site_name(gw->sites[s]), 1);
        n++;
    }
    return n;
}

static int resolve(void *data, const char *model, ig_proxy_target_t *out, int max, int *starting)
{
    return targets_of(data, model, out, max, starting, 1);
}

/* 1 when the model is served by a pool or named by a site. */
static int model_known(ig_gateway_t *gw, const char *model)
{
    for (int p = 0; p < gw->npools; p++) {
        if (strcmp(ig_pool_model(gw->pools[p]), model) == 0)
            return 1;
    }
    for (int s = 0; s < gw->nsites; s++) {
        if (ig_site_serves(gw->sites[s], model))
            return 1;
    }
    return 0;
}

int ig__gateway_model_known(ig_gateway_t *gw, const char *model)
{
    return model_known(gw, model);
}

/* ---- what the config asks of the proxy, the pools and the sites -------- */

void ig__gateway_proxy_opts(const ig_config_t *cfg, ig_proxy_opts_t *po)
{
    ig_proxy_opts_default(po);
    po->router.policy = cfg->routing.policy;
    po->router.retry_ratio = cfg->routing.retry_budget;
    po->router.max_retries = (int)cfg->routing.max_retries;
    if (cfg->routing.eject.consecutive_failures > 0)
        po->router.eject_consecutive = (int)cfg->routing.eject.consecutive_failures;
    if (cfg->routing.eject.base_ejection_s > 0)
        po->router.eject_base_s = cfg->routing.eject.base_ejection_s;
    po->hedge = cfg->routing.hedge.enabled;
    po->hedge_budget = cfg->routing.hedge.budget;
    po->hedge_quantile = cfg->routing.hedge.delay_quantile;
    if (cfg->routing.queue_size > 0)
        po->queue_size = (int)cfg->routing.queue_size;
    if (cfg->routing.queue_timeout_ms > 0)
        po->queue_timeout_ms = cfg->routing.queue_timeout_ms;
    po->first_token_timeout_ms = cfg->routing.first_token_timeout_ms;
    po->objective_cost = cfg->routing.objective_cost;
    po->slo_ttft_s = cfg->routing.slo_ttft_ms / 1000.0;
    /* The adaptive limit, the RTT probe, exploration and the tail term
     * (routing.concurrency_limit, routing.rtt_probe_ms,
     * routing.explore_ratio, routing.tail_weight, routing.wait_weight); a
     * config not from the parser has zeros there and keeps the router's
     * defaults. */
    if (cfg->routing.concurrency_limit.max > 0) {
        po->router.limit_initial = cfg->routing.concurrency_limit.initial;
        po->router.limit_min = cfg->routing.concurrency_limit.min;
        po->router.limit_max =
            cfg->routing.concurrency_limit.enabled ? cfg->routing.concurrency_limit.max : 0;
        po->router.rtt_probe_s = (double)cfg->routing.rtt_probe_ms / 1000.0;
        po->router.explore_ratio = cfg->routing.explore_ratio;
        po->router.tail_weight = cfg->routing.tail_weight;
        po->router.wait_weight = cfg->routing.wait_weight;
    }
}

void ig__gateway_upstream_opts(const ig_config_t *cfg, ig_upstream_opts_t *uo)
{
    ig_upstream_opts_default(uo);
    if (cfg->routing.connect_timeout_ms)
        uo->connect_timeout_ms = cfg->routing.connect_timeout_ms;
    if (cfg->routing.first_token_timeout_ms)
        uo->first_byte_timeout_ms = cfg->routing.first_token_timeout_ms;
    if (cfg->routing.idle_timeout_ms)
        uo->keepalive_idle_ms = cfg->routing.idle_timeout_ms;
    if (cfg->routing.total_timeout_ms)
        uo->total_timeout_ms = cfg->routing.total_timeout_ms;
}

void ig__gateway_autoscale_params(const ig_config_pool_t *cp, ig_autoscale_params_t *ap)
{
    ig_autoscale_params_default(ap);
    ap->target_queue_depth = cp->autoscale.target_queue_depth;
    ap->stable_window_s = cp->autoscale.stable_window_s;
    ap->panic_window_s = cp->autoscale.panic_window_s;
    ap->panic_threshold = cp->autoscale.panic_threshold;
    ap->max_scale_up_rate = cp->autoscale.max_scale_up_rate;
    ap->scale_down_delay_s = cp->autoscale.scale_down_delay_s;
    ap->scale_to_zero_after_s = cp->autoscale.scale_to_zero_after_s;
    ap->min_instances = (int)cp->min_instances;
    ap->max_instances = (int)cp->max_instances;
}

int ig__gateway_pool_start(ig_gateway_t *gw, const ig_config_t *cfg, size_t i, ig_pool_t **out,
                           char *err, size_t errlen)
{
    const ig_config_pool_t *cp = &cfg->pools[i];
    const ig_config_model_t *m = &cfg->models[cp->model_index];
    int cpu_share = ig_devices_cpu_share(cfg, sysconf(_SC_NPROCESSORS_ONLN));
    ig_upstream_opts_t uo;
    ig__gateway_upstream_opts(cfg, &uo);
    const char *devices[64];
    int nd = 0;
    for (size_t d = 0; d < cp->ndevices && nd < 64; d++)
        devices[nd++] = cp->devices[d].spec;
    ig_pool_spec_t ps;
    memset(&ps, 0, sizeof(ps));
    ps.name = cp->name;
    ps.model = cp->model;
    ps.model_dir = m->path;
    ps.quantize = m->quantize;
    ps.exe = gw->exe;
    ps.run_dir = gw->run_dir;
    ps.devices = devices;
    ps.ndevices = nd;
    ps.threads = cp->threads > 0 ? (int)cp->threads : cpu_share;
    ps.min_instances = (int)cp->min_instances;
    ps.max_instances = (int)cp->max_instances;
    ps.kv_blocks = (int)cp->batching.kv_blocks;
    ps.block_size = (int)cp->batching.block_size;
    ps.max_batched_tokens = (int)cp->batching.max_batched_tokens;
    ps.itl_target_ms = cp->batching.itl_target_ms ? (int)cp->batching.itl_target_ms : -1;
    ps.max_num_seqs = (int)cp->batching.max_num_seqs;
    ps.max_waiting = (int)cp->batching.max_waiting;
    if (cp->batching.kv_dtype != IG_DTYPE_F32)
        ps.kv_dtype = ig_engine_kv_dtype_name(cp->batching.kv_dtype);
    ps.max_prompt_tokens = (int)cfg->limits.max_prompt_tokens;
    /* Workers log warnings and errors; their access lines would repeat
     * the gateway's and the readiness and load polls would drown them. */
    ps.log_level = ig_log_level() == IG_LOG_DEBUG ? "debug" : "warn";
    ps.router = ig_proxy_router(gw->proxy);
    ps.upstream = &uo; /* the same deadlines as sites */
    ps.generation = gw->generation;
    if (cp->discover.dns != NULL) {
        ps.discover_dns = cp->discover.dns;
        ps.discover_port = cp->discover.port;
        ps.discover_interval_ms = (uint64_t)(cp->discover.interval_s * 1000.0 + 0.5);
        ps.discover_resolver = cp->discover.resolver;
    }
    int rc = ig_pool_start(out, gw->loop, &ps, on_pool_event, gw);
    if (rc != 0) {
        snprintf(err, errlen, "pool '%s': cannot start: %s", cp->name, ig_strerror(rc));
        return rc;
    }
    publish_instances(gw, *out);
    return 0;
}

int ig__gateway_routes_pool(const ig_gateway_t *gw, const ig_pool_t *pool)
{
    for (int p = 0; p < gw->npools; p++) {
        if (gw->pools[p] == pool)
            return 1;
    }
    return 0;
}

/* ---- start and close ---------------------------------------------------- */

static void gateway_free(ig_gateway_t *gw)
{
    if (gw->own_run_dir)
        rmdir(gw->run_dir); /* empty once the workers removed their sockets */
    free(gw->pools);
    free(gw->sites);
    free(gw->exe);
    for (int i = 0; i < gw->npmodels; i++)
        ig_tokenizer_free(gw->pmodels[i].tok);
    free(gw->pmodels);
    free(gw);
}

/* Loads the tokenizer of every model a pool serves (the first pool's block
 * size); a model without a path or whose tokenizer does not load is
 * routed by the prefixes of its token-id prompts only (their hashes need
 * only the block size), with a warning. One already in gw->pmodels for the same path and
 * block size is moved over rather than read again. */
void ig__gateway_prefix_models(ig_gateway_t *gw, const ig_config_t *cfg)
{
    gw_prefix_model_t *old = gw->pmodels;
    int nold = gw->npmodels;
    gw->pmodels = calloc(cfg->nmodels ? cfg->nmodels : 1, sizeof(*gw->pmodels));
    gw->npmodels = 0;
    for (size_t i = 0; i < cfg->nmodels && gw->pmodels != NULL; i++) {
        const ig_config_model_t *m = &cfg->models[i];
        const ig_config_pool_t *cp = NULL;
        for (size_t p = 0; p < cfg->npools && cp == NULL; p++)
            if (cfg->pools[p].model_index == i)
                cp = &cfg->pools[p];
        if (cp == NULL)
            continue;
        gw_prefix_model_t *pm = &gw->pmodels[gw->npmodels];
        pm->model = m->name;
        pm->path = m->path;
        pm->block_size = cp->batching.block_size > 0 ? (int)cp->batching.block_size : 16;
        for (int o = 0; o < nold && pm->tok == NULL; o++) {
            if (old[o].tok != NULL && m->path != NULL && strcmp(old[o].path, m->path) == 0 &&
                old[o].block_size == pm->block_size) {
                pm->tok = old[o].tok;
                old[o].tok = NULL;
            }
        }
        char err[256] = "";
        if (m->path == NULL)
            snprintf(err, sizeof(err), "the model has no path");
        if (pm->tok == NULL &&
            (m->path == NULL || ig_tokenizer_load(m->path, &pm->tok, err, sizeof(err)) != 0)) {
            /* Token-id prompts need only the block size to be hashed. */
            IG_WARN("model %s: no tokenizer here (%s): prefix-aware routing for token-id prompts "
                    "only",
                    m->name, err);
            pm->tok = NULL;
        }
        pm->style = pm->tok ? ig_chat_detect(ig_tokenizer_chat_template(pm->tok)) : 0;
        gw->npmodels++;
    }
    for (int o = 0; o < nold; o++)
        ig_tokenizer_free(old[o].tok);
    free(old);
}

/* The block size a model's workers report in their KV event snapshots (the
 * first live one: what their caches are cut at), else the pool's config. */
static int prefix_block_size(const ig_gateway_t *gw, const gw_prefix_model_t *pm)
{
    for (int p = 0; p < gw->npools; p++) {
        if (strcmp(ig_pool_model(gw->pools[p]), pm->model) != 0)
            continue;
        for (int i = 0; i < ig_pool_size(gw->pools[p]); i++) {
            const ig_kv_feed_t *f = ig_instance_kv_feed(ig_pool_instance(gw->pools[p], i));
            ig_kv_feed_info_t fi;
            if (f == NULL)
                continue;
            ig_kv_feed_info(f, &fi);
            if (fi.live && fi.block_size > 0)
                return fi.block_size;
        }
    }
    return pm->block_size;
}

static const gw_prefix_model_t *prefix_model(const ig_gateway_t *gw, const char *model)
{
    for (int i = 0; i < gw->npmodels; i++)
        if (strcmp(gw->pmodels[i].model, model) == 0)
            return &gw->pmodels[i];
    return NULL;
}

int ig__gateway_site_start(ig_gateway_t *gw, const ig_config_site_t *cs,
                           const ig_upstream_opts_t *uo, ig_site_t **out, char *err, size_t errlen)
{
    ig_site_spec_t ss;
    memset(&ss, 0, sizeof(ss));
    ss.name = cs->name;
    ss.url = cs->url;
    ss.region = cs->region;
    ss.models = (const char *const *)cs->models;
    ss.nmodels = (int)cs->nmodels;
    ss.router = ig_proxy_router(gw->proxy);
    /* Its own TLS context and credentials (docs/security.md). */
    ig_upstream_opts_t so = *uo;
    ig_tls_ctx_t *tls = NULL;
    char auth[1024];
    int rc;
    if (cs->https &&
        (rc = ig_tls_client_ctx_new(&tls, cs->tls.ca_file, cs->tls.insecure, err, errlen))) {
        char why[512];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "site '%s': %s", cs->name, why);
        return rc;
    }
    if (cs->tls.insecure)
        IG_WARN("site %s: tls.insecure: its certificate is not verified", cs->name);
    so.tls = tls;
    so.tls_server_name = cs->tls.server_name;
    if (cs->api_key != NULL) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", cs->api_key);
        so.headers = auth;
    }
    ss.upstream = &so;
    rc = ig_site_start(out, gw->loop, &ss);
    ig_tls_ctx_unref(tls); /* the upstream holds its own reference */
    if (rc != 0)
        snprintf(err, errlen, "site '%s': cannot start: %s", cs->name, ig_strerror(rc));
    return rc;
}

/* ---- cost ------------------------------------------------------------------ */

static ig_metric_t *m_cost, *m_cost_idle, *m_cost_per_1m;

static void cost_metrics_register(void)
{
    if (m_cost != NULL)
        return;
    m_cost = ig_metrics_counter("infergate_cost_usd_total",
                                "Estimated cost of the answers served, in USD, by upstream, model "
                                "and API key name (\"none\" without keys). Unpriced upstreams "
                                "count nothing.",
                                "upstream,model,key");
    m_cost_idle = ig_metrics_counter("infergate_cost_idle_usd_total",
                                     "Capacity paid by the hour that no answer used, in USD.",
                                     "upstream");
    m_cost_per_1m = ig_metrics_gauge(
        "infergate_cost_per_1m_output_tokens",
        "USD per million generated tokens over the last 5 minutes, idle capacity included.",
        "upstream");
}

/* The proxy's report of one answer's cost. */
static void on_cost(void *data, ig_http_req_t *req, const char *upstream, const char *model,
                    double usd)
{
    (void)data;
    if (isnan(usd))
        return;
    ig_key_use_t *use = req != NULL ? ig_http_req_get_data(req) : NULL;
    ig_key_t *key = use != NULL ? ig_key_use_key(use) : NULL;
    ig_metric_add(m_cost, usd, upstream, model, key != NULL ? ig_key_policy(key)->name : "none");
    if (key != NULL)
        ig_key_charge(key, usd, time(NULL));
}

/* One upstream's idle capacity since the last tick, and its cost per 1M. */
static void cost_tick_one(ig_router_upstream_t *u, const ig_price_t *price, uint64_t now)
{
    double idle = ig_cost_meter_idle(&u->cost, price, now);
    if (idle > 0)
        ig_metric_add(m_cost_idle, idle, u->name);
    double per_1m = ig_cost_meter_per_1m(&u->cost, now);
    if (price->kind != IG_PRICE_NONE && isfinite(per_1m))
        ig_metric_set(m_cost_per_1m, per_1m, u->name);
}

void ig__gateway_cost_tick(ig_gateway_t *gw)
{
    uint64_t now = uv_hrtime();
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        ig_price_t price = ig__gateway_price_of(gw, ig_pool_name(pool), 0);
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            /* Paid while it runs: an instance not started costs nothing. */
            ig_instance_state_t st = ig_instance_state(in);
            ig_price_t paid = price;
            if (st == IG_INSTANCE_STOPPED || st == IG_INSTANCE_BACKOFF)
                paid.kind = IG_PRICE_NONE;
            cost_tick_one(ig_instance_route(in), &paid, now);
        }
    }
    for (int s = 0; s < gw->nsites; s++) {
        ig_price_t price = ig__gateway_price_of(gw, ig_site_name(gw->sites[s]), 1);
        cost_tick_one(ig_site_route(gw->sites[s]), &price, now);
    }
}

int ig_gateway_start(ig_gateway_t **out, uv_loop_t *loop, const ig_config_t *cfg, const char *exe,
                     const char *run_dir, char *err, size_t errlen)
{
    int rc = IG_ENOMEM;
    ig_gateway_t *gw = calloc(1, sizeof(*gw));
    if (gw == NULL)
        return IG_ENOMEM;
    gw->loop = loop;
    gw->cfg = cfg;
    gw->exe = strdup(exe);
    size_t k = 0;
    for (const char *r = cfg->region; r && *r && k + 1 < sizeof(gw->region); r++) {
        if (isalnum((unsigned char)*r) || *r == '-' || *r == '_' || *r == '.')
            gw->region[k++] = *r;
    }
    gw->region[k] = '\0';
    ig__reload_metrics_init();
    gw->m_instances = ig_metrics_gauge("infergate_pool_instances",
                                       "Instances of each pool by state.", "pool,state");
    gw->pools = calloc(cfg->npools ? cfg->npools : 1, sizeof(ig_pool_t *));
    gw->sites = calloc(cfg->nsites ? cfg->nsites : 1, sizeof(ig_site_t *));
    if (gw->pools == NULL || gw->sites == NULL || gw->exe == NULL)
        goto fail;

    if (run_dir != NULL) {
        snprintf(gw->run_dir, sizeof(gw->run_dir), "%s", run_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(gw->run_dir, sizeof(gw->run_dir), "%s/infergate-XXXXXX", tmp ? tmp : "/tmp");
        if (mkdtemp(gw->run_dir) == NULL) {
            snprintf(err, errlen, "cannot create a socket directory under %s", tmp ? tmp : "/tmp");
            rc = IG_EIO;
            goto fail;
        }
        gw->own_run_dir = 1;
    }

    for (size_t i = 0; i < cfg->nmodels; i++) {
        if ((rc = ensure_model(&cfg->models[i], err, errlen)) != 0)
            goto fail;
    }

    ig__gateway_prefix_models(gw, cfg);

    ig_proxy_opts_t po;
    ig__gateway_proxy_opts(cfg, &po);
    if ((rc = ig_proxy_start(&gw->proxy, loop, &po, resolve, gw)) != 0)
        goto fail;
    cost_metrics_register();
    ig_proxy_on_cost(gw->proxy, on_cost, gw);

    if ((rc = ig_scaler_start(&gw->scaler, loop, gw->proxy, (int)cfg->npools)) != 0)
        goto fail;
    ig_scaler_on_price(gw->scaler, scaler_price, gw);

    ig_upstream_opts_t uo;
    ig__gateway_upstream_opts(cfg, &uo);

    for (size_t i = 0; i < cfg->npools; i++) {
        if ((rc = ig__gateway_pool_start(gw, cfg, i, &gw->pools[gw->npools], err, errlen)) != 0)
            goto fail_started;
        ig_autoscale_params_t ap;
        ig__gateway_autoscale_params(&cfg->pools[i], &ap);
        /* A discovered pool is scaled by whatever runs its instances. */
        if (cfg->pools[i].discover.dns == NULL)
            ig_scaler_add(gw->scaler, gw->pools[gw->npools], &ap);
        gw->npools++;
    }
    for (size_t i = 0; i < cfg->nsites; i++) {
        if ((rc = ig__gateway_site_start(gw, &cfg->sites[i], &uo, &gw->sites[gw->nsites], err,
                                         errlen)) != 0)
            goto fail_started;
        gw->nsites++;
    }
    ig__status_history_start(gw);
    *out = gw;
    return 0;
fail_started:
    /* Handles exist now: close through the loop like a normal stop. */
    ig_gateway_close(gw, 0, NULL, NULL);
    return rc;
fail:
    if (gw->scaler != NULL)
        ig_scaler_close(gw->scaler, NULL, NULL);
    if (gw->proxy != NULL)
        ig_proxy_close(gw->proxy, NULL, NULL);
    gateway_free(gw);
    return rc;
}

static void on_part_closed(void *data)
{
    ig_gateway_t *gw = data;
    if (--gw->pending_closes > 0)
        return;
    void (*cb)(void *) = gw->close_cb;
    void *cb_data = gw->close_data;
    gateway_free(gw);
    if (cb != NULL)
        cb(cb_data);
}

void ig_gateway_close(ig_gateway_t *gw, uint64_t grace_ms, void (*cb)(void *data), void *data)
{
    gw->close_cb = cb;
    gw->close_data = data;
    gw->pending_closes = 1 + gw->npools + gw->nsites + 1 + (gw->scaler != NULL) + 1;
    gw->pending_closes += ig__reload_pending(gw);
    ig__status_history_close(gw, on_part_closed, gw);
    ig__reload_close(gw, grace_ms, on_part_closed, gw);
    if (gw->scaler != NULL) {
        ig_scaler_t *sc = gw->scaler;
        gw->scaler = NULL; /* pool events from here on start nothing */
        ig_scaler_close(sc, on_part_closed, gw);
    }
    ig_proxy_close(gw->proxy, on_part_closed, gw);
    for (int i = 0; i < gw->nsites; i++)
        ig_site_close(gw->sites[i], on_part_closed, gw);
    for (int i = 0; i < gw->npools; i++)
        ig_pool_close(gw->pools[i], grace_ms, on_part_closed, gw);
    on_part_closed(gw); /* the extra count keeps gw alive through the loop */
}

/* ---- readiness ---------------------------------------------------------- */

int ig_gateway_ready(ig_gateway_t *gw, char *reason, size_t len)
{
    uint64_t now = uv_hrtime();
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        for (int i = 0; i < ig_pool_size(pool); i++) {
            if (ig_router_eligible(ig_instance_route(ig_pool_instance(pool, i)), now))
                return 1;
        }
    }
    for (int s = 0; s < gw->nsites; s++) {
        if (ig_site_nmodels(gw->sites[s]) > 0 &&
            ig_router_eligible(ig_site_route(gw->sites[s]), now))
            return 1;
    }
    /* A pool scaled to zero on purpose serves: its first request is held
     * while an instance starts. Reporting not-ready here would keep away
     * the very traffic that wakes it. */
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        if (ig_pool_min_instances(pool) == 0 && ig_pool_live(pool) == 0 &&
            ig_pool_count(pool, IG_INSTANCE_DRAINING) + ig_pool_available(pool) > 0)
            return 1;
    }
    if (gw->npools == 0 && gw->nsites == 0)
        snprintf(reason, len, "no pools and no sites are configured");
    else if (gw->npools > 0)
        snprintf(reason, len, "no instance is ready yet and no site can serve");
    else
        snprintf(reason, len, "no site is up");
    return 0;
}

/* ---- the OpenAI endpoints ----------------------------------------------- */

/* A cheap prompt-length estimate for the cost model: about four bytes a
 * token for text; exact for token ids. The worker counts for real. */
static int estimate_tokens(const ig_api_request_t *r)
{
    size_t n = 0;
    for (int i = 0; i < r->nprompts; i++)
        n += r->prompts[i].text ? r->prompts[i].text_len / 4 + 1 : (size_t)r->prompts[i].nids;
    for (int i = 0; i < r->nmessages; i++)
        n += strlen(r->messages[i].content) / 4 + 4;
    return n > 1 << 20 ? 1 << 20 : (int)n;
}

/* ---- priority and admission by predicted wait --------------------------- */

/* The request's priority: its key's (standard without keys), or a less
 * urgent one named by x-infergate-priority; a header never raises it. */
static int request_priority(ig_http_req_t *req, const ig_key_t *key)
{
    static const char *const names[] = {"critical", "standard", "sheddable"};
    int prio = key != NULL ? ig_key_policy(key)->priority : IG_PRIORITY_STANDARD;
    const char *h = ig_http_req_header(req, "x-infergate-priority");
    for (int i = 0; h != NULL && i < 3; i++) {
        if (strcasecmp(h, names[i]) == 0 && i > prio)
            prio = i;
    }
    return prio;
}

/*
 * The shortest wait, in seconds, a new request of priority for model can
 * expect: the router's predicted wait of the best eligible upstream, plus
 * the requests the gateway holds ahead of it over the upstreams' combined
 * service rate (slots over the time a request holds one). Negative when
 * nothing is known yet (no eligible upstream, or none measured): then
 * nothing is refused on a guess.
 */
static double predicted_wait(ig_gateway_t *gw, const char *model, int priority, int local_only)
{
    ig_proxy_target_t t[64];
    int starting = 0;
    int n = targets_of(gw, model, t, 64, &starting, 0); /* a look, not a request */
    ig_router_t *router = ig_proxy_router(gw->proxy);
    uint64_t now = uv_hrtime();
    double best = -1, rate = 0;
    for (int i = 0; i < n; i++) {
        const ig_router_upstream_t *u = t[i].route;
        if ((local_only && t[i].is_site) || !ig_router_eligible(u, now))
            continue;
        double w = ig_router_wait(router, u, now);
        if (best < 0 || w < best)
            best = w;
        double hold = u->occupancy_s > 0 ? u->occupancy_s : u->svc_s;
        if (hold > 0)
            rate += (u->slots > 0 ? u->slots : 1) / hold;
    }
    int ahead = ig_proxy_queued_ahead(gw->proxy, model, priority);
    if (best >= 0 && ahead > 0) {
        if (rate <= 0)
            return -1;
        best += ahead / rate;
    }
    return best;
}

/* The request's queueing budget in ms: limits.max_queue_wait_ms of its
 * priority, or the x-infergate-deadline-ms it carries when shorter (0:
 * none). */
static uint64_t queue_budget_ms(ig_gateway_t *gw, ig_http_req_t *req, int priority)
{
    uint64_t budget = gw->cfg->limits.max_queue_wait_ms[priority];
    const char *h = ig_http_req_header(req, "x-infergate-deadline-ms");
    if (h != NULL) {
        char *end;
        unsigned long long d = strtoull(h, &end, 10);
        if (end != h && *end == '\0' && d > 0 && (budget == 0 || d < budget))
            budget = d;
    }
    return budget;
}

static ig_metric_t *m_admission;


/*
 * What the gateway reads of one API request to admit and route it; the
 * body itself goes upstream as the client sent it (docs/routing.md, "What
 * the gateway changes in a forwarded body").
 */
typedef struct {
    const char *path;  /* the client's path, which the upstream gets too */
    const char *model; /* as the body names it */
    int stream;
    int prompt_tokens; /* an estimate; exact below when the gateway tokenizes */
    int outputs;       /* answers generated: choices (n, or best_of) x prompts */
    int max_tokens;    /* per answer; 0: not given (up to the upstream) */
    /* The body fields that cap an answer's tokens, the first added when a
     * key's limit caps a body that names none (NULL: nothing generated). */
    const char *const *cap_fields;
    int ncap_fields;
    /* The whole parse of a completion or chat body where the gateway reads
     * the prompt (token ids, prefix hashes), else NULL. */
    const ig_api_request_t *r;
} gw_call_t;

/* Reserves the key's tokens for the call; caps the answers' max tokens in
 * *body when the bucket holds less than they ask (so that a stream ends
 * cleanly, finish_reason "length", at the limit). 0, or an error in e. */
static int reserve_tokens(ig_http_req_t *req, ig_key_use_t *use, const gw_call_t *c,
                          const char **body, size_t *len, char **edited, ig_api_error_t *e)
{
    int outputs = c->outputs;
    int per = c->max_tokens > 0 ? c->max_tokens : 1 << 20;
    int asked = outputs == 0 ? 0 : per > (1 << 24) / outputs ? 1 << 24 : per * outputs;
    int prompts =
        c->r != NULL && c->r->kind == IG_API_COMPLETION && c->r->nprompts > 1 ? c->r->nprompts : 1;
    ig_key_limit_t tok, why;
    int allowed =
        ig_key_use_reserve(use, uv_hrtime(), c->prompt_tokens * prompts, asked, &tok, &why);
    if (allowed < 0 || allowed < outputs) {
        int ra = (int)ceil(why.retry_after > 0 ? why.retry_after : 1);
        ig_key_limit_headers(req, &why);
        ig_api_error(e, 429, NULL, "token limit of this API key reached; retry after %d s", ra);
        e->code = "rate_limit_exceeded";
        e->retry_after_s = ra; /* the Retry-After header */
        return IG_EFULL;
    }
    ig_key_limit_headers(req, &tok);
    if (allowed >= asked || c->ncap_fields == 0)
        return 0;
    int rc =
        ig_api_body_cap(*body, *len, c->cap_fields, c->ncap_fields, allowed / outputs, edited, len);
    if (rc != 0)
        return ig_api_error_oom(e);
    *body = *edited;
    return 0;
}

/*
 * Admits one parsed request and hands it to the proxy: the key's model
 * list and tokens, the operator's prompt limit, the forwarded mark, the
 * priority, admission by predicted wait, the version and the prefix
 * hashes. 0 when the proxy took the request, else an error in e for the
 * caller to answer.
 */
static int admit_and_forward(ig_gateway_t *gw, ig_http_req_t *req, const gw_call_t *c,
                             ig_api_error_t *e)
{
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    char *edited = NULL;
    int rc = IG_EINVAL;
    if (!model_known(gw, c->model)) {
        ig_api_error(e, 404, "model", "the model '%s' does not exist", c->model);
        e->code = "model_not_found";
        return IG_EINVAL;
    }
    /* The key's policy: its models, its tokens (serve.c authenticated it and
     * took its request token). */
    ig_key_use_t *use = ig_http_req_get_data(req);
    ig_key_t *key = use != NULL ? ig_key_use_key(use) : NULL;
    if (key != NULL && !ig_key_allows_model(key, c->model)) {
        ig_api_error(e, 403, "model", "this API key may not use the model '%s'", c->model);
        e->type = "permission_error";
        e->code = "model_not_allowed";
        return IG_EINVAL;
    }
    if (key != NULL && (rc = reserve_tokens(req, use, c, &body, &len, &edited, e)) != 0)
        return rc;
    /* Token ids count exactly here, so an over-long one never takes an
     * upstream's time; text is counted by the worker that tokenizes it. */
    for (int i = 0; c->r != NULL && i < c->r->nprompts; i++) {
        if (c->r->prompts[i].text == NULL &&
            (rc = ig_api_check_prompt_limit(c->r, c->r->prompts[i].nids,
                                            (int)gw->cfg->limits.max_prompt_tokens, e)) != 0)
            goto fail;
    }
    /* Once there are keys, only a peer gateway's key may say "forwarded,
     * serve it here": from anyone else the mark is ignored (and never passed
     * on: the proxy writes its own), or a client could pin itself to this
     * region's pools. Without keys anyone is trusted, the mark included
     * (it is what stops two regions from forwarding in a loop). */
    int trusted = gw->cfg->napi_keys == 0 || (key != NULL && ig_key_policy(key)->peer);
    int local_only = trusted && ig_http_req_header(req, "x-infergate-forwarded") != NULL;
    /* Admission by predicted wait: a request that would wait longer than
     * its budget is told so now, not after the wait. */
    int priority = request_priority(req, key);
    uint64_t budget = queue_budget_ms(gw, req, priority);
    if (budget > 0) {
        double wait = predicted_wait(gw, c->model, priority, local_only);
        if (wait * 1000.0 > (double)budget) {
            static const char *const pn[] = {"critical", "standard", "sheddable"};
            if (m_admission == NULL)
                m_admission = ig_metrics_counter(
                    "infergate_admission_rejections_total",
                    "Requests refused at once because their predicted wait exceeded their "
                    "budget, by priority.",
                    "priority");
            ig_metric_add(m_admission, 1, pn[priority]);
            ig_api_error(e, 429, NULL,
                         "the predicted wait for model '%s' (%.0f ms) exceeds this request's "
                         "budget (%llu ms); retry later",
                         c->model, wait * 1000.0, (unsigned long long)budget);
            e->code = "predicted_wait_exceeds_budget";
            e->retry_after_s = (int)ceil(wait - (double)budget / 1000.0);
            rc = IG_EINVAL;
            goto fail;
        }
    }
    char route_name[512];
    const char *version;
    if ((rc = route_key(gw, req, c->model, route_name, sizeof(route_name), &version, e)) != 0)
        goto fail;
    if (version != NULL)
        ig_http_add_header(req, IG_GATEWAY_VERSION_HEADER, version);
    ig_proxy_call_t call;
    memset(&call, 0, sizeof(call));
    call.model = route_name; /* the body names the model; the key picks the version */
    call.path = c->path;
    call.stream = c->stream;
    call.prompt_tokens = c->prompt_tokens;
    call.body = body;
    call.len = len;
    call.local_only = local_only;
    call.priority = priority;
    /* Admitted on a prediction: one that turns out a little short is
     * still served rather than dropped at its budget; twice the budget is
     * the most it is held. */
    call.max_queue_ms = budget * 2;
    call.region = gw->region[0] ? gw->region : NULL;
    /* The first prompt's tokens as its worker will prefill them: an exact
     * count for the cost, and its block hashes for the prefix index. */
    const gw_prefix_model_t *pm = c->r != NULL ? prefix_model(gw, c->model) : NULL;
    int *ids = NULL, nids = 0;
    uint64_t *hashes = NULL;
    int ids_only = c->r != NULL && c->r->kind != IG_API_CHAT && c->r->nprompts > 0 &&
                   c->r->prompts[0].text == NULL;
    if (pm && (pm->tok || ids_only) &&
        ig_prefix_prompt_tokens(pm->tok, pm->style, c->r, 0, &ids, &nids, NULL, 0) == 0) {
        int bs = prefix_block_size(gw, pm);
        int cap = nids / bs + 1;
        if ((hashes = malloc(sizeof(uint64_t) * (size_t)cap)) != NULL) {
            call.nprefix = ig_prefix_hashes(ig_prefix_seed(c->model), ids, nids, bs, hashes, cap);
            call.prefix_hashes = hashes;
            call.block_size = bs;
        }
        if (c->r->kind == IG_API_CHAT || c->r->nprompts == 1)
            call.prompt_tokens = nids;
    }
    free(ids);
    call.session_id = ig_http_req_header(req, "x-session-id");
    long long out = (long long)c->max_tokens * (c->outputs > 0 ? c->outputs : 1);
    call.output_tokens = out > (1 << 24) ? 1 << 24 : (int)out;
    /* A client may tighten the TTFT SLO of the cost objective, never loosen it. */
    const char *slo = ig_http_req_header(req, "x-infergate-slo-ttft-ms");
    if (slo != NULL) {
        char *end;
        double ms = strtod(slo, &end);
        if (end != slo && *end == '\0' && ms > 0 && isfinite(ms))
            call.slo_ttft_s = ms / 1000.0;
    }
    ig_proxy_handle(gw->proxy, req, &call);
    free(hashes);
    free(edited);
    return 0;
fail:
    free(edited);
    return rc;
}

static void handle_openai(ig_gateway_t *gw, ig_http_req_t *req, ig_api_kind_t kind)
{
    static const char *const completion_cap[] = {"max_tokens"};
    static const char *const chat_cap[] = {"max_completion_tokens", "max_tokens"};
    size_t len, prompt_bytes;
    const char *body = ig_http_req_body(req, &len);
    ig_api_request_t r;
    ig_api_error_t e;
    int rc = ig_api_peek(kind, body, len, &r, &prompt_bytes, &e);
    if (rc < 0) {
        ig_api_respond_error(req, &e);
        return;
    }
    /* The prompt itself is read only where the gateway needs its tokens:
     * token ids, or prefix-aware routing with the model's tokenizer. */
    const gw_prefix_model_t *pm = r.model != NULL ? prefix_model(gw, r.model) : NULL;
    int whole = rc == 1 || (pm != NULL && pm->tok != NULL);
    if (whole) {
        ig_api_request_dispose(&r);
        if (ig_api_parse(kind, body, len, &r, &e) != 0) {
            ig_api_respond_error(req, &e);
            return;
        }
    }
    size_t guess = prompt_bytes / 4 + 1;
    gw_call_t c = {
        .path = kind == IG_API_CHAT ? "/v1/chat/completions" : "/v1/completions",
        .model = r.model,
        .stream = r.stream,
        .prompt_tokens = whole ? estimate_tokens(&r) : guess > 1 << 20 ? 1 << 20 : (int)guess,
        .outputs = (r.best_of > r.n ? r.best_of : r.n) *
                   (kind == IG_API_CHAT || r.nprompts < 1 ? 1 : r.nprompts),
        .max_tokens = r.max_tokens,
        .cap_fields = kind == IG_API_CHAT ? chat_cap : completion_cap,
        .ncap_fields = kind == IG_API_CHAT ? 2 : 1,
        .r = whole ? &r : NULL,
    };
    if (r.model == NULL)
        ig_api_error(&e, 400, "model", "you must provide a model parameter");
    if (r.model == NULL || admit_and_forward(gw, req, &c, &e) != 0)
        ig_api_respond_error(req, &e);
    ig_api_request_dispose(&r);
}

void ig_gateway_completions(ig_gateway_t *gw, ig_http_req_t *req)
{
    handle_openai(gw, req, IG_API_COMPLETION);
}

void ig_gateway_chat(ig_gateway_t *gw, ig_http_req_t *req)
{
    handle_openai(gw, req, IG_API_CHAT);
}

void ig_gateway_routed(ig_gateway_t *gw, ig_http_req_t *req, ig_api_routed_kind_t kind)
{
    static const char *const responses_cap[] = {"max_output_tokens"};
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    ig_api_routed_t r;
    ig_api_error_t e;
    if (ig_api_parse_routed(kind, body, len, &r, &e) != 0) {
        ig_api_respond_error(req, &e);
        return;
    }
    gw_call_t c = {
        .path = ig_api_routed_path(kind),
        .model = r.model,
        .stream = r.stream,
        .prompt_tokens = r.input_tokens,
        .outputs = kind == IG_API_RESPONSES ? 1 : 0,
        .max_tokens = r.max_tokens,
        .cap_fields = kind == IG_API_RESPONSES ? responses_cap : NULL,
        .ncap_fields = kind == IG_API_RESPONSES ? 1 : 0,
    };
    if (admit_and_forward(gw, req, &c, &e) != 0)
        ig_api_respond_error(req, &e);
    ig_api_routed_dispose(&r);
}
