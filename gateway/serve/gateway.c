/*
 * The gateway of one region: pools, sites and the proxy, built from the
 * config (see include/infergate/gateway.h).
 */
#include "infergate/gateway.h"
#include "infergate/api.h"
#include "infergate/autoscale.h"
#include "infergate/cli.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct pool_scaler_s pool_scaler_t;

struct ig_gateway_s {
    uv_loop_t *loop;
    const ig_config_t *cfg;
    char region[64]; /* sanitised: it goes into a header */
    char run_dir[512];
    int own_run_dir;
    ig_pool_t **pools;
    int npools;
    ig_site_t **sites;
    int nsites;
    ig_proxy_t *proxy;
    pool_scaler_t *scalers; /* one per pool */
    uv_timer_t tick;        /* load samples; every SAMPLES_PER_DECISION-th, a decision */
    int tick_started;
    unsigned ticks;
    uv_timer_t kick; /* held requests retried after an instance became ready */
    int kick_started;
    int pending_closes;
    void (*close_cb)(void *data);
    void *close_data;
    ig_metric_t *m_instances;
    ig_metric_t *m_decisions;
    ig_metric_t *m_desired;
};

/* Load is sampled every 100 ms and averaged into one sample per decision
 * (1 s): a time average of in-flight work, not one instant of it. */
#define SAMPLE_MS 100
#define SAMPLES_PER_DECISION 10
#define DECISIONS_KEPT 16 /* shown by GET /status */

/* One decision as GET /status shows it. */
typedef struct {
    int64_t unix_ms;
    const char *direction; /* static */
    const char *reason;    /* static */
    const char *limit;     /* static: the bound that cut the policy's count, or "none" */
    int current, ready, desired, raw, free_devices;
    double load, stable_load, panic_load;
} decision_rec_t;

/* The autoscaler state of one pool. */
struct pool_scaler_s {
    ig_autoscaler_t as;
    double acc; /* load samples since the last decision */
    int nacc;
    int desired;
    int wake; /* a request waits for a pool at zero whose device is still being freed */
    int kick; /* an instance became ready: retry the held requests */
    decision_rec_t rec[DECISIONS_KEPT]; /* ring, oldest first */
    int rec_head, rec_n;
};

/* ---- model files ------------------------------------------------------- */

/* Generates a preset model into its path when the directory lacks one. */
static int ensure_model(const ig_config_model_t *m, char *err, size_t errlen)
{
    char probe[1024];
    if (m->path == NULL)
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

static int pool_index(ig_gateway_t *gw, ig_pool_t *pool)
{
    for (int p = 0; p < gw->npools; p++) {
        if (gw->pools[p] == pool)
            return p;
    }
    return -1;
}

/* Instances that serve or will: starting, ready, or in backoff. */
static int pool_live(ig_pool_t *pool)
{
    return ig_pool_count(pool, IG_INSTANCE_STARTING) + ig_pool_count(pool, IG_INSTANCE_READY) +
           ig_pool_count(pool, IG_INSTANCE_BACKOFF);
}

static void record_decision(ig_gateway_t *gw, int p, const decision_rec_t *r)
{
    pool_scaler_t *ps = &gw->scalers[p];
    /* A hold that repeats every tick (delay, no device) is kept once. */
    if (ps->rec_n > 0) {
        decision_rec_t *last = &ps->rec[(ps->rec_head + ps->rec_n - 1) % DECISIONS_KEPT];
        if (strcmp(r->direction, "none") == 0 && strcmp(last->direction, "none") == 0 &&
            strcmp(last->reason, r->reason) == 0 && strcmp(last->limit, r->limit) == 0 &&
            last->desired == r->desired && last->current == r->current)
            return;
    }
    int slot = (ps->rec_head + ps->rec_n) % DECISIONS_KEPT;
    if (ps->rec_n == DECISIONS_KEPT)
        ps->rec_head = (ps->rec_head + 1) % DECISIONS_KEPT;
    else
        ps->rec_n++;
    ps->rec[slot] = *r;
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wakes a pool that has nothing serving or starting for a request: takes
 * back a draining instance or starts one. Returns 1 when the request can
 * be held because something is on its way. */
static int wake_pool(ig_gateway_t *gw, int p, const char *why)
{
    ig_pool_t *pool = gw->pools[p];
    pool_scaler_t *ps = &gw->scalers[p];
    if (pool_live(pool) > 0)
        return 1;
    int current = 0, free_devices = ig_pool_available(pool);
    if (ig_pool_scale_up(pool) == 0) {
        ps->wake = 0;
        ps->desired = ps->desired > 1 ? ps->desired : 1;
        IG_INFO("autoscale pool=%s: up 0 -> 1 (%s)", ig_pool_name(pool), why);
        ig_metric_add(gw->m_decisions, 1, ig_pool_name(pool), "up", why);
        ig_metric_set(gw->m_desired, ps->desired, ig_pool_name(pool));
        decision_rec_t r = {unix_ms(), "up", why, "none", current, 0, 1, 1, free_devices, 0, 0, 0};
        record_decision(gw, p, &r);
        return 1;
    }
    /* The device is still held by an instance on its way out: start one as
     * soon as it is free (on_pool_event). */
    if (ig_pool_stopping(pool) > 0) {
        if (!ps->wake)
            IG_INFO("autoscale pool=%s: a request waits for the device its last instance is "
                    "freeing",
                    ig_pool_name(pool));
        ps->wake = 1;
        return 1;
    }
    return 0;
}

static void on_kick(uv_timer_t *t)
{
    ig_gateway_t *gw = t->data;
    for (int p = 0; p < gw->npools; p++) {
        if (gw->scalers[p].kick) {
            gw->scalers[p].kick = 0;
            ig_proxy_kick(gw->proxy, ig_pool_model(gw->pools[p]));
        }
    }
}

static void on_pool_event(ig_pool_t *pool, ig_instance_t *inst, void *data)
{
    ig_gateway_t *gw = data;
    int p = pool_index(gw, pool);
    publish_instances(gw, pool);
    if (p < 0 || gw->proxy == NULL || !gw->kick_started)
        return; /* still starting up, or closing */
    ig_instance_state_t st = ig_instance_state(inst);
    /* An instance that became ready may take held requests. The retry runs
     * from the loop, not from inside whatever changed the state (which may
     * be the proxy itself, through resolve). */
    if (st == IG_INSTANCE_READY) {
        gw->scalers[p].kick = 1;
        uv_timer_start(&gw->kick, on_kick, 0, 0);
    }
    /* A device came free while requests wait for a pool at zero. */
    if (st == IG_INSTANCE_STOPPED && !ig_instance_holds_device(inst) &&
        (gw->scalers[p].wake || ig_proxy_queued_model(gw->proxy, ig_pool_model(pool)) > 0))
        wake_pool(gw, p, "from_zero");
}

static int resolve(void *data, const char *model, ig_proxy_target_t *out, int max, int *starting)
{
    ig_gateway_t *gw = data;
    int n = 0;
    uint64_t now = uv_hrtime();
    *starting = 0;
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        if (strcmp(ig_pool_model(pool), model) != 0)
            continue;
        ig_autoscaler_note_request(&gw->scalers[p].as, now);
        /* Scaled to zero (or its last instance is on its way out): a
         * request is what wakes the pool up; it is held meanwhile. */
        if (wake_pool(gw, p, "from_zero"))
            *starting |= ig_pool_count(pool, IG_INSTANCE_READY) == 0;
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
            n++;
        }
    }
    for (int s = 0; s < gw->nsites && n < max; s++) {
        if (!ig_site_serves(gw->sites[s], model))
            continue;
        out[n].client = ig_site_upstream(gw->sites[s]);
        out[n].route = ig_site_route(gw->sites[s]);
        out[n].is_site = 1;
        n++;
    }
    return n;
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

/* ---- start and close ---------------------------------------------------- */

/* ---- the autoscaler ------------------------------------------------------ */

/* In-flight requests of the pool's instances plus those the proxy holds
 * for its model: the waiting + running the autoscaler targets. */
static double pool_load(ig_gateway_t *gw, ig_pool_t *pool)
{
    double load = ig_proxy_queued_model(gw->proxy, ig_pool_model(pool));
    for (int i = 0; i < ig_pool_size(pool); i++)
        load += ig_instance_route(ig_pool_instance(pool, i))->inflight;
    return load;
}

static void autoscale_pool(ig_gateway_t *gw, int p, uint64_t now)
{
    ig_pool_t *pool = gw->pools[p];
    pool_scaler_t *ps = &gw->scalers[p];
    ig_autoscaler_t *as = &ps->as;
    double load = ps->nacc > 0 ? ps->acc / ps->nacc : pool_load(gw, pool);
    ps->acc = 0;
    ps->nacc = 0;
    int ready = ig_pool_count(pool, IG_INSTANCE_READY);
    int current = pool_live(pool);
    int avail = ig_pool_available(pool);
    ig_autoscaler_sample(as, now, load);
    ig_scale_decision_t d = ig_autoscaler_decide(as, now, current, ready, avail);
    ps->desired = d.desired;
    ig_metric_set(gw->m_desired, d.desired, ig_pool_name(pool));
    decision_rec_t r;
    r.unix_ms = unix_ms();
    r.direction = ig_scale_direction_name(d.direction);
    r.reason = d.reason;
    r.limit = d.limit;
    r.current = current;
    r.ready = ready;
    r.desired = d.desired;
    r.raw = d.raw;
    r.free_devices = avail;
    r.load = load;
    r.stable_load = d.stable_load;
    r.panic_load = d.panic_load;
    /* Changes, and holds worth seeing (a delay, no device, the max); a
     * repeated hold is kept once. */
    if (d.direction != IG_SCALE_NONE ||
        (strcmp(d.limit, "none") != 0 && strcmp(d.limit, "min_instances") != 0))
        record_decision(gw, p, &r);
    if (d.direction == IG_SCALE_NONE)
        return;
    IG_INFO("autoscale pool=%s: %s %d -> %d (%s, limit %s; load %.2f, stable load %.2f, panic "
            "load %.2f, ready %d, available devices %d, target %.1f)",
            ig_pool_name(pool), ig_scale_direction_name(d.direction), current, d.desired, d.reason,
            d.limit, load, d.stable_load, d.panic_load, ready, avail, as->p.target_queue_depth);
    ig_metric_add(gw->m_decisions, 1, ig_pool_name(pool), ig_scale_direction_name(d.direction),
                  d.reason);
    for (int k = current; k < d.desired; k++) {
        if (ig_pool_scale_up(pool) != 0)
            break;
    }
    for (int k = d.desired; k < current; k++) {
        /* Drain what costs least to lose: a crashed one waiting to restart,
         * then one still starting, then the ready one with the fewest
         * requests in flight. */
        int best = -1, best_load = 0;
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            ig_instance_state_t st = ig_instance_state(in);
            int l;
            if (st == IG_INSTANCE_BACKOFF)
                l = 0;
            else if (st == IG_INSTANCE_STARTING)
                l = 1;
            else if (st == IG_INSTANCE_READY)
                l = 2 + ig_instance_route(in)->inflight;
            else
                continue;
            if (best < 0 || l < best_load) {
                best = i;
                best_load = l;
            }
        }
        if (best < 0 || ig_pool_drain(pool, best) != 0)
            break;
    }
}

static void on_tick(uv_timer_t *t)
{
    ig_gateway_t *gw = t->data;
    uint64_t now = uv_hrtime();
    int decide = ++gw->ticks % SAMPLES_PER_DECISION == 0;
    for (int p = 0; p < gw->npools; p++) {
        pool_scaler_t *ps = &gw->scalers[p];
        ps->acc += pool_load(gw, gw->pools[p]);
        ps->nacc++;
        if (decide)
            autoscale_pool(gw, p, now);
    }
}

static void gateway_free(ig_gateway_t *gw)
{
    free(gw->scalers);
    if (gw->own_run_dir)
        rmdir(gw->run_dir); /* empty once the workers removed their sockets */
    free(gw->pools);
    free(gw->sites);
    free(gw);
}

int ig_gateway_cpu_share(const ig_config_t *cfg, long cores)
{
    int slots = 0;
    for (size_t i = 0; i < cfg->npools; i++) {
        const ig_config_pool_t *cp = &cfg->pools[i];
        int plain = 0;
        for (size_t d = 0; d < cp->ndevices; d++)
            plain += strcmp(cp->devices[d].spec, "cpu") == 0;
        if (cp->threads == 0)
            slots += plain < (int)cp->max_instances ? plain : (int)cp->max_instances;
    }
    return slots > 0 && cores > slots ? (int)(cores / slots) : 1;
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
    size_t k = 0;
    for (const char *r = cfg->region; r && *r && k + 1 < sizeof(gw->region); r++) {
        if (isalnum((unsigned char)*r) || *r == '-' || *r == '_' || *r == '.')
            gw->region[k++] = *r;
    }
    gw->region[k] = '\0';
    gw->m_instances = ig_metrics_gauge("infergate_pool_instances",
                                       "Instances of each pool by state.", "pool,state");
    gw->m_decisions = ig_metrics_counter("infergate_autoscale_decisions_total",
                                         "Autoscaler decisions by pool, direction and reason.",
                                         "pool,direction,reason");
    gw->m_desired = ig_metrics_gauge("infergate_pool_desired_instances",
                                     "Instances the autoscaler wants for each pool.", "pool");
    gw->pools = calloc(cfg->npools ? cfg->npools : 1, sizeof(ig_pool_t *));
    gw->scalers = calloc(cfg->npools ? cfg->npools : 1, sizeof(pool_scaler_t));
    gw->sites = calloc(cfg->nsites ? cfg->nsites : 1, sizeof(ig_site_t *));
    if (gw->pools == NULL || gw->sites == NULL || gw->scalers == NULL)
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

    ig_proxy_opts_t po;
    ig_proxy_opts_default(&po);
    po.router.policy = cfg->routing.policy;
    po.router.retry_ratio = cfg->routing.retry_budget;
    po.router.max_retries = (int)cfg->routing.max_retries;
    if (cfg->routing.eject.consecutive_failures > 0)
        po.router.eject_consecutive = (int)cfg->routing.eject.consecutive_failures;
    if (cfg->routing.eject.base_ejection_s > 0)
        po.router.eject_base_s = cfg->routing.eject.base_ejection_s;
    po.hedge = cfg->routing.hedge.enabled;
    po.hedge_budget = cfg->routing.hedge.budget;
    po.hedge_quantile = cfg->routing.hedge.delay_quantile;
    if (cfg->routing.queue_size > 0)
        po.queue_size = (int)cfg->routing.queue_size;
    if (cfg->routing.queue_timeout_ms > 0)
        po.queue_timeout_ms = cfg->routing.queue_timeout_ms;
    po.first_token_timeout_ms = cfg->routing.first_token_timeout_ms;
    if ((rc = ig_proxy_init(&gw->proxy, loop, &po, resolve, gw)) != 0)
        goto fail;

    ig_upstream_opts_t uo;
    ig_upstream_opts_default(&uo);
    if (cfg->routing.connect_timeout_ms)
        uo.connect_timeout_ms = cfg->routing.connect_timeout_ms;
    if (cfg->routing.first_token_timeout_ms)
        uo.first_byte_timeout_ms = cfg->routing.first_token_timeout_ms;
    if (cfg->routing.idle_timeout_ms)
        uo.keepalive_idle_ms = cfg->routing.idle_timeout_ms;
    if (cfg->routing.total_timeout_ms)
        uo.total_timeout_ms = cfg->routing.total_timeout_ms;

    int cpu_share = ig_gateway_cpu_share(cfg, sysconf(_SC_NPROCESSORS_ONLN));
    for (size_t i = 0; i < cfg->npools; i++) {
        const ig_config_pool_t *cp = &cfg->pools[i];
        const ig_config_model_t *m = &cfg->models[cp->model_index];
        const char *devices[64];
        int nd = 0;
        for (size_t d = 0; d < cp->ndevices && nd < 64; d++)
            devices[nd++] = cp->devices[d].spec;
        ig_pool_spec_t ps;
        memset(&ps, 0, sizeof(ps));
        ps.name = cp->name;
        ps.model = cp->model;
        ps.model_dir = m->path;
        ps.exe = exe;
        ps.run_dir = gw->run_dir;
        ps.devices = devices;
        ps.ndevices = nd;
        ps.threads = cp->threads > 0 ? (int)cp->threads : cpu_share;
        ps.min_instances = (int)cp->min_instances;
        ps.max_instances = (int)cp->max_instances;
        ps.kv_blocks = (int)cp->batching.kv_blocks;
        ps.block_size = (int)cp->batching.block_size;
        ps.max_batched_tokens = (int)cp->batching.max_batched_tokens;
        ps.max_num_seqs = (int)cp->batching.max_num_seqs;
        ps.max_waiting = (int)cp->batching.max_waiting;
        ps.max_prompt_tokens = (int)cfg->limits.max_prompt_tokens;
        /* Workers log warnings and errors; their access lines would repeat
         * the gateway's and the readiness and load polls would drown them. */
        ps.log_level = ig_log_level() == IG_LOG_DEBUG ? "debug" : "warn";
        ps.router = ig_proxy_router(gw->proxy);
        ps.upstream = &uo; /* the same deadlines as sites */
        if ((rc = ig_pool_start(&gw->pools[gw->npools], loop, &ps, on_pool_event, gw)) != 0) {
            snprintf(err, errlen, "pool '%s': cannot start: %s", cp->name, ig_strerror(rc));
            goto fail_started;
        }
        publish_instances(gw, gw->pools[gw->npools]);
        ig_autoscale_params_t ap;
        ig_autoscale_params_default(&ap);
        ap.target_queue_depth = cp->autoscale.target_queue_depth;
        ap.stable_window_s = cp->autoscale.stable_window_s;
        ap.panic_window_s = cp->autoscale.panic_window_s;
        ap.panic_threshold = cp->autoscale.panic_threshold;
        ap.max_scale_up_rate = cp->autoscale.max_scale_up_rate;
        ap.scale_down_delay_s = cp->autoscale.scale_down_delay_s;
        ap.scale_to_zero_after_s = cp->autoscale.scale_to_zero_after_s;
        ap.min_instances = (int)cp->min_instances;
        ap.max_instances = (int)cp->max_instances;
        ig_autoscaler_init(&gw->scalers[gw->npools].as, &ap);
        gw->scalers[gw->npools].desired = (int)cp->min_instances;
        gw->npools++;
    }
    uv_timer_init(loop, &gw->tick);
    gw->tick.data = gw;
    gw->tick_started = 1;
    uv_timer_start(&gw->tick, on_tick, SAMPLE_MS, SAMPLE_MS);
    uv_timer_init(loop, &gw->kick);
    gw->kick.data = gw;
    gw->kick_started = 1;
    for (size_t i = 0; i < cfg->nsites; i++) {
        const ig_config_site_t *cs = &cfg->sites[i];
        ig_site_spec_t ss;
        memset(&ss, 0, sizeof(ss));
        ss.name = cs->name;
        ss.url = cs->url;
        ss.region = cs->region;
        ss.models = (const char *const *)cs->models;
        ss.nmodels = (int)cs->nmodels;
        ss.router = ig_proxy_router(gw->proxy);
        ss.upstream = &uo;
        if ((rc = ig_site_start(&gw->sites[gw->nsites], loop, &ss)) != 0) {
            snprintf(err, errlen, "site '%s': cannot start: %s", cs->name, ig_strerror(rc));
            goto fail_started;
        }
        gw->nsites++;
    }
    *out = gw;
    return 0;
fail_started:
    /* Handles exist now: close through the loop like a normal stop. */
    ig_gateway_close(gw, 0, NULL, NULL);
    return rc;
fail:
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

static void on_tick_closed(uv_handle_t *h)
{
    on_part_closed(h->data);
}

void ig_gateway_close(ig_gateway_t *gw, uint64_t grace_ms, void (*cb)(void *data), void *data)
{
    gw->close_cb = cb;
    gw->close_data = data;
    gw->pending_closes = 1 + gw->npools + gw->nsites + 1 + gw->tick_started + gw->kick_started;
    if (gw->tick_started)
        uv_close((uv_handle_t *)&gw->tick, on_tick_closed);
    if (gw->kick_started) {
        gw->kick_started = 0; /* pool events from here on start nothing */
        uv_close((uv_handle_t *)&gw->kick, on_tick_closed);
    }
    ig_proxy_close(gw->proxy, on_part_closed, gw);
    for (int i = 0; i < gw->nsites; i++)
        ig_site_close(gw->sites[i], on_part_closed, gw);
    for (int i = 0; i < gw->npools; i++)
        ig_pool_close(gw->pools[i], grace_ms, on_part_closed, gw);
    on_part_closed(gw); /* the extra count keeps gw alive through the loop */
}

ig_proxy_t *ig_gateway_proxy(ig_gateway_t *gw)
{
    return gw->proxy;
}

int ig_gateway_npools(const ig_gateway_t *gw)
{
    return gw->npools;
}

ig_pool_t *ig_gateway_pool(ig_gateway_t *gw, int i)
{
    return i >= 0 && i < gw->npools ? gw->pools[i] : NULL;
}

/* ---- readiness ---------------------------------------------------------- */

int ig_gateway_ready(void *data, char *reason, size_t len)
{
    ig_gateway_t *gw = data;
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
        if (ig_pool_min_instances(pool) == 0 && pool_live(pool) == 0 &&
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

static void handle_openai(ig_gateway_t *gw, ig_http_req_t *req, ig_api_kind_t kind)
{
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    ig_api_request_t r;
    ig_api_error_t e;
    if (ig_api_parse(kind, body, len, &r, &e) != 0) {
        ig_api_respond_error(req, &e);
        return;
    }
    if (r.model == NULL) {
        ig_api_error(&e, 400, "model", "you must provide a model parameter");
        ig_api_respond_error(req, &e);
        ig_api_request_dispose(&r);
        return;
    }
    if (!model_known(gw, r.model)) {
        ig_api_error(&e, 404, "model", "the model '%s' does not exist", r.model);
        e.code = "model_not_found";
        ig_api_respond_error(req, &e);
        ig_api_request_dispose(&r);
        return;
    }
    /* Token ids count exactly here, so an over-long one never takes an
     * upstream's time; text is counted by the worker that tokenizes it. */
    for (int i = 0; i < r.nprompts; i++) {
        if (r.prompts[i].text == NULL &&
            ig_api_check_prompt_limit(&r, r.prompts[i].nids, (int)gw->cfg->limits.max_prompt_tokens,
                                      &e) != 0) {
            ig_api_respond_error(req, &e);
            ig_api_request_dispose(&r);
            return;
        }
    }
    json_t *canon = ig_api_request_to_json(&r);
    size_t clen = 0;
    char *ctext = canon ? ig_api_dumps(canon, &clen) : NULL;
    json_decref(canon);
    if (ctext == NULL) {
        ig_api_respond_oom(req);
        ig_api_request_dispose(&r);
        return;
    }
    ig_proxy_call_t call;
    memset(&call, 0, sizeof(call));
    call.model = r.model;
    call.path = kind == IG_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
    call.stream = r.stream;
    call.prompt_tokens = estimate_tokens(&r);
    call.body = ctext;
    call.len = clen;
    call.local_only = ig_http_req_header(req, "x-infergate-forwarded") != NULL;
    call.region = gw->region[0] ? gw->region : NULL;
    ig_proxy_handle(gw->proxy, req, &call);
    free(ctext);
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

void ig_gateway_models(ig_gateway_t *gw, ig_http_req_t *req)
{
    const char *ids[256];
    int n = 0;
    const ig_config_t *cfg = gw->cfg;
    for (size_t i = 0; i < cfg->nmodels && n < 256; i++) {
        if (model_known(gw, cfg->models[i].name))
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
    ig_api_respond_json(req, 200, ig_api_models_json(ids, n, (long long)time(NULL), "infergate"));
}

/* Sums what the local instances report. Sites are left out on purpose: a
 * peer that counted our sites would count itself back. */
void ig_gateway_load(ig_gateway_t *gw, ig_http_req_t *req)
{
    double waiting = ig_proxy_queued(gw->proxy), running = 0, prefill = 0, decode = 0;
    double est_wait = -1;
    double ttft = -1; /* our own predicted TTFT of an empty prompt, best instance */
    uint64_t now = uv_hrtime();
    int ready = 0, slots = 0;
    json_t *models = json_array();
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        int pool_ready = 0;
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            if (ig_instance_state(in) != IG_INSTANCE_READY)
                continue;
            ready++;
            pool_ready = 1;
            ig_upstream_state_t *u = ig_instance_route(in);
            waiting += u->reported_waiting;
            running += u->inflight;
            /* One request runs on one instance: the rate it sees is the
             * best instance's, not the sum. */
            if (u->reported_prefill_tps > prefill)
                prefill = u->reported_prefill_tps;
            double c = ig_router_cost(ig_proxy_router(gw->proxy), u, 0, now);
            if (ttft < 0 || c < ttft)
                ttft = c;
            slots += u->slots;
            if (est_wait < 0 || u->reported_wait_s < est_wait)
                est_wait = u->reported_wait_s;
            const char *load = ig_instance_load_json(in);
            json_t *l = load ? json_loads(load, 0, NULL) : NULL;
            json_t *v = l ? json_object_get(l, "decode_tokens_per_s") : NULL;
            if (json_is_number(v))
                decode += json_number_value(v);
            json_decref(l);
        }
        if (pool_ready) {
            int dup = 0;
            size_t j;
            json_t *m;
            json_array_foreach(models, j, m) dup |=
                strcmp(json_string_value(m), ig_pool_model(pool)) == 0;
            if (!dup)
                json_array_append_new(models, json_string(ig_pool_model(pool)));
        }
    }
    json_t *doc = json_pack("{s:s, s:o, s:i, s:f, s:f, s:i, s:f, s:f, s:f, s:i}", "region",
                            gw->region, "models", models, "ready_instances", ready, "waiting",
                            waiting, "running", running, "inflight", ig_proxy_inflight(gw->proxy),
                            "est_wait_s", est_wait < 0 ? 0.0 : est_wait, "prefill_tokens_per_s",
                            prefill, "decode_tokens_per_s", decode, "max_num_seqs", slots);
    /* What a peer adds to its round trip to us: our best instance's
     * predicted time to first token, inner hop included. */
    if (doc != NULL)
        json_object_set_new(doc, "ttft_s", json_real(ttft < 0 ? 0.0 : ttft));
    ig_api_respond_json(req, 200, doc);
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

static json_t *status_decisions(pool_scaler_t *ps)
{
    json_t *arr = json_array();
    for (int k = 0; k < ps->rec_n; k++) {
        const decision_rec_t *r = &ps->rec[(ps->rec_head + k) % DECISIONS_KEPT];
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
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "target_queue_depth",
                     a->target_queue_depth, "stable_window_s", a->stable_window_s, "panic_window_s",
                     a->panic_window_s, "panic_threshold", a->panic_threshold, "max_scale_up_rate",
                     a->max_scale_up_rate, "max_scale_down_rate", a->max_scale_down_rate,
                     "scale_down_delay_s", a->scale_down_delay_s, "scale_to_zero_after_s",
                     a->scale_to_zero_after_s);
}

void ig_gateway_status(ig_gateway_t *gw, ig_http_req_t *req)
{
    json_t *pools = json_array();
    uint64_t now = uv_hrtime();
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        pool_scaler_t *ps = &gw->scalers[p];
        json_t *insts = json_array();
        for (int i = 0; i < ig_pool_size(pool); i++) {
            ig_instance_t *in = ig_pool_instance(pool, i);
            ig_upstream_state_t *u = ig_instance_route(in);
            json_array_append_new(
                insts,
                json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:b}", "name",
                          ig_instance_name(in), "device", ig_instance_device(in), "state",
                          ig_instance_state_name(ig_instance_state(in)), "pid", ig_instance_pid(in),
                          "restarts", ig_instance_restarts(in), "inflight", u->inflight, "rtt_s",
                          u->rtt_s, "ttft_s", u->svc_s, "eligible", ig_router_eligible(u, now)));
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
                      "desired_instances", ps->desired, "devices_used", ig_pool_in_use(pool),
                      "devices_free", ig_pool_size(pool) - ig_pool_in_use(pool),
                      "devices_available", ig_pool_available(pool), "load", pool_load(gw, pool),
                      "instance_counts", counts, "devices", status_devices(pool), "instances",
                      insts, "autoscale", status_autoscale(&ps->as.p), "decisions",
                      status_decisions(ps)));
    }
    json_t *sites = json_array();
    for (int s = 0; s < gw->nsites; s++) {
        ig_site_t *site = gw->sites[s];
        ig_upstream_state_t *u = ig_site_route(site);
        json_t *models = json_array();
        for (int i = 0; i < ig_site_nmodels(site); i++)
            json_array_append_new(models, json_string(ig_site_model(site, i)));
        json_array_append_new(
            sites, json_pack("{s:s, s:s, s:b, s:b, s:f, s:i, s:o, s:b}", "name", ig_site_name(site),
                             "region", ig_site_region(site) ? ig_site_region(site) : "", "up",
                             ig_site_up(site), "peer", ig_site_is_peer(site), "rtt_s", u->rtt_s,
                             "inflight", u->inflight, "models", models, "eligible",
                             ig_router_eligible(u, now)));
    }
    json_t *doc =
        json_pack("{s:s, s:s, s:o, s:o, s:i, s:i}", "region", gw->region, "policy",
                  ig_route_policy_name(gw->cfg->routing.policy), "pools", pools, "sites", sites,
                  "inflight", ig_proxy_inflight(gw->proxy), "queued", ig_proxy_queued(gw->proxy));
    ig_api_respond_json(req, 200, doc);
}
