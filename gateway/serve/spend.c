/*
 * What the answers cost: the proxy's report of each one (counted by
 * upstream, model and key, and charged to the key's budget), and each
 * status tick the idle paid capacity and the cost per 1M tokens of every
 * upstream (docs/routing.md, "Cost per answer").
 */
#include "gateway_internal.h"
#include "infergate/keys.h"

#include <math.h>
#include <time.h>

static ig_metric_t *m_cost, *m_cost_idle, *m_cost_per_1m;

void ig__gateway_cost_metrics_register(void)
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
void ig__gateway_on_cost(void *data, ig_http_req_t *req, const char *upstream, const char *model,
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
