/*
 * A config reload of a running gateway (ig_gateway_reload in
 * include/infergate/gateway.h), without dropping a request.
 *
 * What can change in place does: routing options (the proxy's and the
 * router's, learned state kept), a pool's autoscale parameters, the region.
 * A pool whose instances must change (model path, devices, batching, ...)
 * is started anew beside the old one, which goes on serving; when the new
 * pool has as many ready instances as the old one had (at least its
 * min_instances, at most its max_instances), the new pool takes the old
 * one's place in the routing table, the held requests of its model are
 * retried, and the old pool's instances drain: the router sends them
 * nothing new, each gets SIGTERM once the gateway's requests on it have
 * ended, and the pool is closed when every instance has stopped. A pool
 * the new config drops drains the same way at once; a new pool joins when
 * ready. A site that changes or goes drains too: no new requests, closed
 * when its last one has ended. A timer (100 ms) drives all of this while
 * something is pending, so the pool and site modules need no reload hooks.
 *
 * A new pool that is not ready within RELOAD_TIMEOUT_MS is given up: it is
 * closed, the old one keeps serving, and the reload counts as failed.
 */
#include "gateway_internal.h"
#include "infergate/error.h"
#include "infergate/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RELOAD_TICK_MS 100
#define RELOAD_TIMEOUT_MS 300000

/* A pool being replaced (or added): next is started and not routed yet. */
typedef struct {
    ig_pool_t *next;
    ig_pool_t *prev; /* routed until next is ready; NULL for a new pool */
    int target;      /* ready instances next needs before the switch */
    ig_autoscale_params_t params;
} swap_t;

typedef struct ig_reload_s {
    ig_gateway_t *gw;
    uv_timer_t timer;
    int active; /* a reload has swaps or retirements pending */
    int failed; /* a swap of the active reload was given up */
    uint64_t started_ns;
    swap_t *swaps;
    int nswaps;
    ig_pool_t **retiring; /* draining; closed once every instance stopped */
    int nretiring;
    ig_site_t **retiring_sites; /* no new requests; closed once idle */
    int nretiring_sites;
    int closing; /* reload_close ran */
    void (*close_cb)(void *data);
    void *close_data;
    ig_metric_t *m_reloads;
    ig_metric_t *m_last_ok;
} reload_t;

static ig_metric_t *reloads_counter(void)
{
    return ig_metrics_counter("infergate_config_reloads_total",
                              "Config reloads by outcome (applied, invalid, busy, failed).",
                              "outcome");
}

void ig_gateway_reload_count(const char *outcome)
{
    ig_metric_add(reloads_counter(), 1, outcome);
}

void ig_gateway_reload_metrics(void)
{
    /* Every outcome's series exists from the start at 0, so that
     * increase() sees the first invalid reload too. */
    static const char *const outcomes[] = {"applied", "invalid", "busy", "failed"};
    for (size_t i = 0; i < sizeof(outcomes) / sizeof(outcomes[0]); i++)
        ig_metric_add(reloads_counter(), 0, outcomes[i]);
}

static void finish(reload_t *r)
{
    r->active = 0;
    ig_metric_add(r->m_reloads, 1, r->failed ? "failed" : "applied");
    if (!r->failed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ig_metric_set(r->m_last_ok, (double)ts.tv_sec);
    }
    IG_INFO("reload: %s after %.1f s",
            r->failed ? "failed (see above); the old pools serve"
                      : "applied; every replaced instance has stopped",
            (double)(uv_hrtime() - r->started_ns) / 1e9);
}

/* ---- draining what goes ------------------------------------------------- */

static int push_pool(reload_t *r, ig_pool_t *pool)
{
    ig_pool_t **grown = realloc(r->retiring, (size_t)(r->nretiring + 1) * sizeof(*grown));
    if (grown == NULL)
        return IG_ENOMEM;
    grown[r->nretiring++] = pool;
    r->retiring = grown;
    return 0;
}

static int push_site(reload_t *r, ig_site_t *site)
{
    ig_site_t **grown =
        realloc(r->retiring_sites, (size_t)(r->nretiring_sites + 1) * sizeof(*grown));
    if (grown == NULL)
        return IG_ENOMEM;
    grown[r->nretiring_sites++] = site;
    r->retiring_sites = grown;
    return 0;
}

/* Drains every instance that serves or will; the pool leaves the scaler
 * first so that nothing starts them again. */
static void drain_pool(ig_pool_t *pool)
{
    for (int i = 0; i < ig_pool_size(pool); i++) {
        ig_instance_state_t st = ig_instance_state(ig_pool_instance(pool, i));
        if (st == IG_INSTANCE_READY || st == IG_INSTANCE_STARTING || st == IG_INSTANCE_BACKOFF)
            ig_pool_drain(pool, i);
    }
}

static int retire_pool(reload_t *r, ig_pool_t *pool)
{
    if (r->gw->scaler != NULL)
        ig_scaler_remove(r->gw->scaler, pool);
    ig_pool_discover_stop(pool); /* nothing new joins a pool that goes */
    IG_INFO("reload: pool %s (old instances) drains: %d ready", ig_pool_name(pool),
            ig_pool_count(pool, IG_INSTANCE_READY));
    drain_pool(pool);
    return push_pool(r, pool);
}

static int retire_site(reload_t *r, ig_site_t *site)
{
    ig_site_route(site)->draining = 1; /* the router sends it nothing new */
    IG_INFO("reload: site %s drains", ig_site_name(site));
    return push_site(r, site);
}

static void on_retired_closed(void *data)
{
    (void)data;
}

/* ---- the timer ---------------------------------------------------------- */

/* Puts next in prev's place in the routing table (or appends it). */
static int route_pool(ig_gateway_t *gw, ig_pool_t *prev, ig_pool_t *next)
{
    for (int p = 0; prev != NULL && p < gw->npools; p++) {
        if (gw->pools[p] == prev) {
            gw->pools[p] = next;
            return 0;
        }
    }
    ig_pool_t **grown = realloc(gw->pools, (size_t)(gw->npools + 1) * sizeof(*grown));
    if (grown == NULL)
        return IG_ENOMEM;
    gw->pools = grown;
    gw->pools[gw->npools++] = next;
    return 0;
}

static void switch_pool(reload_t *r, swap_t *sw)
{
    ig_gateway_t *gw = r->gw;
    if (route_pool(gw, sw->prev, sw->next) != 0) {
        IG_ERROR("reload: pool %s: out of memory; the new instances stop", ig_pool_name(sw->next));
        r->failed = 1;
        ig_pool_close(sw->next, 0, on_retired_closed, NULL);
        return;
    }
    if (gw->scaler != NULL && !ig_pool_discovered(sw->next))
        ig_scaler_add(gw->scaler, sw->next, &sw->params);
    IG_INFO("reload: pool %s: %d new instances ready; traffic moves to them",
            ig_pool_name(sw->next), ig_pool_count(sw->next, IG_INSTANCE_READY));
    if (sw->prev != NULL && retire_pool(r, sw->prev) != 0)
        ig_pool_close(sw->prev, 5000, on_retired_closed, NULL); /* no memory to wait */
    ig_proxy_kick(gw->proxy, ig_pool_model(sw->next));
    ig__gateway_kick_versions(gw, sw->next);
}

static int pool_stopped(ig_pool_t *pool)
{
    return ig_pool_live(pool) == 0 && ig_pool_count(pool, IG_INSTANCE_DRAINING) == 0 &&
           ig_pool_stopping(pool) == 0;
}

static void on_tick(uv_timer_t *t)
{
    reload_t *r = t->data;
    uint64_t now = uv_hrtime();
    for (int i = 0; i < r->nswaps;) {
        swap_t *sw = &r->swaps[i];
        int ready = ig_pool_count(sw->next, IG_INSTANCE_READY);
        int due = now - r->started_ns > (uint64_t)RELOAD_TIMEOUT_MS * 1000000ULL;
        if (ready >= sw->target) {
            switch_pool(r, sw);
        } else if (due) {
            IG_ERROR("reload: pool %s: %d of %d new instances ready after %d s; giving up, the "
                     "old instances keep serving",
                     ig_pool_name(sw->next), ready, sw->target, RELOAD_TIMEOUT_MS / 1000);
            r->failed = 1;
            ig_pool_close(sw->next, 5000, on_retired_closed, NULL);
        } else {
            i++;
            continue;
        }
        r->swaps[i] = r->swaps[--r->nswaps];
    }
    for (int i = 0; i < r->nretiring;) {
        ig_pool_t *pool = r->retiring[i];
        drain_pool(pool); /* a crash restart while draining is drained again */
        if (!pool_stopped(pool)) {
            i++;
            continue;
        }
        IG_INFO("reload: pool %s (old instances): every instance has stopped", ig_pool_name(pool));
        ig_pool_close(pool, 0, on_retired_closed, NULL);
        r->retiring[i] = r->retiring[--r->nretiring];
    }
    for (int i = 0; i < r->nretiring_sites;) {
        ig_site_t *site = r->retiring_sites[i];
        if (ig_site_route(site)->inflight > 0) {
            i++;
            continue;
        }
        ig_site_close(site, on_retired_closed, NULL);
        r->retiring_sites[i] = r->retiring_sites[--r->nretiring_sites];
    }
    if (r->nswaps == 0 && r->nretiring == 0 && r->nretiring_sites == 0) {
        uv_timer_stop(&r->timer);
        if (r->active)
            finish(r);
    }
}

/* ---- the reload --------------------------------------------------------- */

static const ig__gateway_part_t reload_part;

static reload_t *state(ig_gateway_t *gw)
{
    if (gw->reload != NULL)
        return gw->reload;
    reload_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->gw = gw;
    uv_timer_init(gw->loop, &r->timer);
    r->timer.data = r;
    r->m_reloads = reloads_counter();
    r->m_last_ok =
        ig_metrics_gauge("infergate_config_last_reload_success_timestamp_seconds",
                         "When the last reload was applied, since the Unix epoch.", NULL);
    gw->reload = r;
    gw->reload_part = &reload_part;
    return r;
}

static ig_pool_t *routed_pool(ig_gateway_t *gw, const char *name)
{
    for (int p = 0; p < gw->npools; p++) {
        if (strcmp(ig_pool_name(gw->pools[p]), name) == 0)
            return gw->pools[p];
    }
    return NULL;
}

static const ig_config_pool_t *config_pool(const ig_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->npools; i++) {
        if (strcmp(cfg->pools[i].name, name) == 0)
            return &cfg->pools[i];
    }
    return NULL;
}

static const ig_config_site_t *config_site(const ig_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nsites; i++) {
        if (strcmp(cfg->sites[i].name, name) == 0)
            return &cfg->sites[i];
    }
    return NULL;
}

static void append(char *buf, size_t len, const char *what, const char *name)
{
    size_t n = strlen(buf);
    if (n < len)
        snprintf(buf + n, len - n, "%s%s %s", n ? ", " : "", what, name);
}

int ig_gateway_reload(ig_gateway_t *gw, const ig_config_t *prev, const ig_config_t *next,
                      char *summary, size_t summary_len, char *err, size_t errlen)
{
    int rc;
    summary[0] = '\0';
    reload_t *r = state(gw);
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return IG_ENOMEM;
    }
    if (r->active) {
        snprintf(err, errlen,
                 "a reload is still in progress (%d pools starting, %d draining, %d sites "
                 "draining)",
                 r->nswaps, r->nretiring, r->nretiring_sites);
        return IG_EBUSY;
    }
    for (size_t i = 0; i < next->nmodels; i++) {
        if ((rc = ig__gateway_ensure_model(&next->models[i], err, errlen)) != 0)
            return rc;
    }

    /* Start every pool that needs new instances first: if one cannot
     * start, nothing has changed yet. Its sockets are named apart from the
     * old pool's, which has the same name and runs on. */
    gw->generation++;
    swap_t *swaps = calloc(next->npools ? next->npools : 1, sizeof(*swaps));
    ig_pool_t **pools = calloc(next->npools + (size_t)gw->npools + 1, sizeof(*pools));
    ig_site_t **sites = calloc(next->nsites + (size_t)gw->nsites + 1, sizeof(*sites));
    int nswaps = 0, npools = 0, nsites = 0;
    if (swaps == NULL || pools == NULL || sites == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = IG_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < next->npools; i++) {
        const ig_config_pool_t *np = &next->pools[i];
        ig_pool_t *old = routed_pool(gw, np->name);
        const ig_config_pool_t *op = config_pool(prev, np->name);
        int diff = old && op ? ig_config_pool_diff(prev, op, next, np) : IG_CONFIG_POOL_RESTART;
        ig_autoscale_params_t ap;
        ig__gateway_autoscale_params(np, &ap);
        if (diff != IG_CONFIG_POOL_RESTART) {
            pools[npools++] = old;
            continue;
        }
        swap_t *sw = &swaps[nswaps];
        if ((rc = ig__gateway_pool_start(gw, next, i, &sw->next, err, errlen)) != 0)
            goto fail;
        nswaps++;
        sw->prev = old;
        sw->params = ap;
        /* As many ready instances as the old pool serves with, within the
         * new bounds: the switch must not cut capacity. */
        int want = old ? ig_pool_count(old, IG_INSTANCE_READY) : 0;
        if (want > (int)np->max_instances)
            want = (int)np->max_instances;
        if (want < (int)np->min_instances)
            want = (int)np->min_instances;
        while (ig_pool_live(sw->next) < want && ig_pool_scale_up(sw->next) == 0)
            ;
        /* A discovered pool cannot be told how many to have: one ready
         * instance found in DNS is enough to take over. */
        if (ig_pool_discovered(sw->next))
            want = want > 0 ? 1 : 0;
        sw->target = want;
        if (old != NULL)
            pools[npools++] = old; /* serves until the switch */
    }

    /* From here on nothing fails: apply. */
    IG_INFO("reload: %s -> %s", prev->source ? prev->source : "?",
            next->source ? next->source : "?");
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *old = gw->pools[p];
        int kept = 0;
        for (int k = 0; k < npools && !kept; k++)
            kept = pools[k] == old;
        if (!kept) {
            append(summary, summary_len, "removed pool", ig_pool_name(old));
            if (retire_pool(r, old) != 0)
                ig_pool_close(old, 5000, on_retired_closed, NULL); /* no memory to wait */
        }
    }
    for (int s = 0; s < nswaps; s++)
        append(summary, summary_len, swaps[s].prev ? "replacing pool" : "adding pool",
               ig_pool_name(swaps[s].next));
    for (size_t i = 0; i < next->npools; i++) {
        const ig_config_pool_t *np = &next->pools[i];
        const ig_config_pool_t *op = config_pool(prev, np->name);
        ig_pool_t *old = routed_pool(gw, np->name);
        if (old == NULL || op == NULL ||
            ig_config_pool_diff(prev, op, next, np) != IG_CONFIG_POOL_AUTOSCALE ||
            gw->scaler == NULL || ig_pool_discovered(old))
            continue;
        ig_autoscale_params_t ap;
        ig__gateway_autoscale_params(np, &ap);
        ig_scaler_remove(gw->scaler, old);
        ig_scaler_add(gw->scaler, old, &ap);
        append(summary, summary_len, "new autoscale for pool", np->name);
    }

    for (int s = 0; s < gw->nsites; s++) {
        ig_site_t *site = gw->sites[s];
        const ig_config_site_t *ns = config_site(next, ig_site_name(site));
        const ig_config_site_t *os = config_site(prev, ig_site_name(site));
        if (ns != NULL && os != NULL && ig_config_site_same(os, ns)) {
            sites[nsites++] = site;
            continue;
        }
        append(summary, summary_len, ns ? "replacing site" : "removed site", ig_site_name(site));
        if (retire_site(r, site) != 0)
            ig_site_close(site, on_retired_closed, NULL);
    }
    for (size_t i = 0; i < next->nsites; i++) {
        const ig_config_site_t *cs = &next->sites[i];
        const ig_config_site_t *os = config_site(prev, cs->name);
        int kept = 0;
        for (int k = 0; k < nsites && !kept; k++)
            kept = strcmp(ig_site_name(sites[k]), cs->name) == 0;
        if (kept && os != NULL)
            continue;
        char err[512];
        if (ig__gateway_site_start(gw, next, cs, &sites[nsites], err, sizeof(err)) != 0) {
            IG_ERROR("reload: %s; it is left out", err);
            r->failed = 1;
            continue;
        }
        if (os == NULL)
            append(summary, summary_len, "adding site", cs->name);
        nsites++;
    }

    free(gw->pools);
    gw->pools = pools;
    gw->npools = npools;
    free(gw->sites);
    gw->sites = sites;
    gw->nsites = nsites;
    ig__gateway_set_config(gw, next);
    free(r->swaps);
    r->swaps = swaps;
    r->nswaps = nswaps;
    r->failed = 0;
    r->started_ns = uv_hrtime();
    r->active = 1;
    if (summary[0] == '\0')
        snprintf(summary, summary_len, "routing, limits and sites in place; no pool changes");
    IG_INFO("reload: started: %s", summary);
    uv_timer_start(&r->timer, on_tick, 0, RELOAD_TICK_MS);
    return 0;
fail:
    for (int s = 0; s < nswaps; s++)
        ig_pool_close(swaps[s].next, 0, on_retired_closed, NULL);
    free(swaps);
    free(pools);
    free(sites);
    return rc;
}

int ig_gateway_reload_active(const ig_gateway_t *gw)
{
    return gw->reload != NULL && gw->reload->active;
}

/* ---- closing with the gateway ------------------------------------------- */

typedef struct {
    reload_t *r;
    void (*cb)(void *data);
    void *data;
} timer_close_t;

static void on_timer_closed(uv_handle_t *h)
{
    reload_t *r = h->data;
    void (*cb)(void *) = r->close_cb;
    void *data = r->close_data;
    free(r->swaps);
    free(r->retiring);
    free(r->retiring_sites);
    free(r);
    cb(data);
}

static int reload_pending(const ig_gateway_t *gw)
{
    const reload_t *r = gw->reload;
    return r == NULL ? 0 : 1 + r->nswaps + r->nretiring + r->nretiring_sites;
}

static void reload_close(ig_gateway_t *gw, uint64_t grace_ms, void (*cb)(void *data), void *data)
{
    reload_t *r = gw->reload;
    if (r == NULL)
        return;
    gw->reload = NULL;
    r->closing = 1;
    r->close_cb = cb;
    r->close_data = data;
    for (int i = 0; i < r->nswaps; i++)
        ig_pool_close(r->swaps[i].next, grace_ms, cb, data);
    for (int i = 0; i < r->nretiring; i++)
        ig_pool_close(r->retiring[i], grace_ms, cb, data);
    for (int i = 0; i < r->nretiring_sites; i++)
        ig_site_close(r->retiring_sites[i], cb, data);
    r->nswaps = r->nretiring = r->nretiring_sites = 0;
    uv_close((uv_handle_t *)&r->timer, on_timer_closed);
}

/* How the gateway closes what a reload holds, without naming this file. */
static const ig__gateway_part_t reload_part = {reload_pending, reload_close};
