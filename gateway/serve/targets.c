/*
 * The upstreams of a routing key: the pools' instances and the sites that
 * serve a model (or one version of it), with their prices. The proxy asks
 * through ig__gateway_resolve; admission and the status documents look.
 */
#include "gateway_internal.h"
#include "infergate/scaler.h"

#include <stdint.h>
#include <string.h>

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

/* The upstreams of a routing key (a model, or model@version); a request
 * (note) is counted by the scaler. */
int ig__gateway_targets(ig_gateway_t *gw, const char *key, ig_proxy_target_t *out, int max,
                        int *starting, int note)
{
    int n = 0;
    uint64_t now = uv_hrtime();
    char model[512];
    const char *version = ig__gateway_split_key(gw, key, model, sizeof(model));
    *starting = 0;
    for (int p = 0; p < gw->npools; p++) {
        ig_pool_t *pool = gw->pools[p];
        if (strcmp(ig_pool_model(pool), model) != 0)
            continue;
        if (version != NULL) {
            const char *v = ig__gateway_pool_version(gw, pool);
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

int ig__gateway_resolve(void *data, const char *model, ig_proxy_target_t *out, int max, int *starting)
{
    return ig__gateway_targets(data, model, out, max, starting, 1);
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
