/*
 * The gateway of one region, composed from its config: the proxy, the
 * pools and their autoscaler driver, the sites (see
 * include/infergate/gateway.h). The OpenAI entry is openai.c; the
 * upstreams of a routing key targets.c; model versions versions.c; what
 * answers cost spend.c; the /load, /status and /v1/models documents
 * status.c; a reload reload.c; the autoscaler driver is fleet/scaler.c.
 */
#include "gateway_internal.h"
#include "infergate/gguf.h"
#include "infergate/cli.h"
#include "infergate/devices.h"
#include "infergate/engine.h" /* ig_engine_kv_dtype_name */
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/tls.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- pool events --------------------------------------------------------- */

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

static int routes_pool(const ig_gateway_t *gw, const ig_pool_t *pool);

static void on_pool_event(ig_pool_t *pool, ig_instance_t *inst, void *data)
{
    ig_gateway_t *gw = data;
    /* A pool a reload is starting or retiring shares its name with the one
     * that routes: only the routed one publishes its instances. */
    if (!routes_pool(gw, pool))
        return;
    publish_instances(gw, pool);
    if (gw->scaler != NULL)
        ig_scaler_pool_event(gw->scaler, pool, inst);
    if (inst != NULL && ig_instance_state(inst) == IG_INSTANCE_READY) {
        ig__gateway_kick_versions(gw, pool);
        ig__gateway_tokenizer_kick(gw);
        /* The scaler retries held requests for the pools it drives; a
         * discovered pool's new instance must do it here. */
        if (ig_pool_discovered(pool))
            ig_proxy_kick(gw->proxy, ig_pool_model(pool));
    }
}

/* ---- what the config asks of the proxy, the pools and the sites -------- */

static void proxy_opts(const ig_config_t *cfg, ig_proxy_opts_t *po)
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
     * routing.explore_ratio, routing.tail_weight); a
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
    }
}

static void upstream_opts(const ig_config_t *cfg, ig_upstream_opts_t *uo)
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
    upstream_opts(cfg, &uo);
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

/* 1 when the pool is one of gw->pools (routed). */
static int routes_pool(const ig_gateway_t *gw, const ig_pool_t *pool)
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
    ig_metrics_detach(gw);
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
static void prefix_models(ig_gateway_t *gw, const ig_config_t *cfg)
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
            snprintf(err, sizeof(err),
                     "the model has no path; its workers' tokenizer is fetched once one is ready");
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


void ig__gateway_set_config(ig_gateway_t *gw, const ig_config_t *cfg)
{
    if (gw->proxy != NULL) {
        ig_proxy_opts_t po;
        proxy_opts(cfg, &po);
        ig_proxy_set_opts(gw->proxy, &po);
    }
    /* Sanitised: the region goes into a header. */
    size_t k = 0;
    for (const char *r = cfg->region; r && *r && k + 1 < sizeof(gw->region); r++) {
        if (isalnum((unsigned char)*r) || *r == '-' || *r == '_' || *r == '.')
            gw->region[k++] = *r;
    }
    gw->region[k] = '\0';
    gw->cfg = cfg;
    prefix_models(gw, cfg);
    ig__gateway_tokenizer_kick(gw);
}

int ig__gateway_site_start(ig_gateway_t *gw, const ig_config_t *cfg, const ig_config_site_t *cs,
                           ig_site_t **out, char *err, size_t errlen)
{
    ig_upstream_opts_t uo;
    upstream_opts(cfg, &uo);
    ig_site_spec_t ss;
    memset(&ss, 0, sizeof(ss));
    ss.name = cs->name;
    ss.url = cs->url;
    ss.region = cs->region;
    ss.models = (const char *const *)cs->models;
    ss.nmodels = (int)cs->nmodels;
    ss.router = ig_proxy_router(gw->proxy);
    /* Its own TLS context and credentials (docs/security.md). */
    ig_upstream_opts_t so = uo;
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

/* The scaler's view of a pool's price (the config in force). */
static ig_price_t scaler_price(void *data, const ig_pool_t *pool)
{
    return ig__gateway_price_of(data, ig_pool_name(pool), 0);
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

    ig__gateway_set_config(gw, cfg);

    ig_proxy_opts_t po;
    proxy_opts(cfg, &po);
    if ((rc = ig_proxy_start(&gw->proxy, loop, &po, ig__gateway_resolve, gw)) != 0)
        goto fail;
    ig__gateway_cost_metrics_register();
    ig__gateway_upstream_gauges(gw);
    ig_proxy_on_cost(gw->proxy, ig__gateway_on_cost, gw);

    if ((rc = ig_scaler_start(&gw->scaler, loop, gw->proxy, (int)cfg->npools)) != 0)
        goto fail;
    ig_scaler_on_price(gw->scaler, scaler_price, gw);

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
        if ((rc = ig__gateway_site_start(gw, cfg, &cfg->sites[i], &gw->sites[gw->nsites], err,
                                         errlen)) != 0)
            goto fail_started;
        gw->nsites++;
    }
    if ((rc = ig__status_history_start(gw)) != 0)
        goto fail_started;
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
    ig__gateway_tokenizer_close(gw);
    gw->pending_closes = 1 + gw->npools + gw->nsites + 1 + (gw->scaler != NULL) + 1;
    const ig__gateway_part_t *reload = gw->reload_part;
    gw->pending_closes += reload != NULL ? reload->pending(gw) : 0;
    ig__status_history_close(gw, on_part_closed, gw);
    if (reload != NULL)
        reload->close(gw, grace_ms, on_part_closed, gw);
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

