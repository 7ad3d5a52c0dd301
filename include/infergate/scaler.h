#ifndef INFERGATE_SCALER_H
#define INFERGATE_SCALER_H

/*
 * The autoscaler driver: it samples the load of every pool it is given
 * (the requests in flight on its instances plus those the proxy holds for
 * its model) every 100 ms, averages the samples into one per second, asks
 * the pure decision (include/infergate/autoscale.h) what the pool should
 * have, and carries it out: starts instances, or drains the ones that cost
 * least to lose. It also wakes a pool at zero when a request arrives, and
 * asks the proxy to retry its held requests once an instance is ready.
 * Decisions are logged, counted (infergate_autoscale_decisions_total,
 * infergate_pool_desired_instances) and kept for GET /status.
 */

#include "infergate/autoscale.h"
#include "infergate/cost.h"
#include "infergate/pool.h"
#include "infergate/proxy.h"

#include <stdint.h>
#include <uv.h>

typedef struct ig_scaler_s ig_scaler_t;

/* One decision as GET /status shows it. Strings are static. */
typedef struct {
    int64_t unix_ms;
    const char *direction;
    const char *reason;
    const char *limit; /* the bound that cut the policy's count, or "none" */
    int current, ready, desired, raw, free_devices;
    double load, stable_load, panic_load;
} ig_scaler_record_t;

#define IG_SCALER_RECORDS 16 /* decisions kept per pool */

/*
 * Starts the sampling timer. proxy is borrowed and must outlive the
 * scaler; max_pools sizes the first table of ig_scaler_add(). 0 or IG_ENOMEM.
 */
int ig_scaler_start(ig_scaler_t **out, uv_loop_t *loop, ig_proxy_t *proxy, int max_pools);

/*
 * Where the scaler learns a pool's price (docs/autoscale.md, "Cheap
 * capacity first"): asked at each decision, so a reload's prices apply at
 * once. Without it, or for IG_PRICE_NONE, a pool's cost is unknown. The
 * gateway sets it from its config.
 */
typedef ig_price_t (*ig_scaler_price_cb)(void *data, const ig_pool_t *pool);
void ig_scaler_on_price(ig_scaler_t *sc, ig_scaler_price_cb cb, void *data);

/* What a pool's capacity costs as the scaler ranks it: USD per 1M output
 * tokens, or NAN when unknown (unpriced, or per hour with no throughput
 * measured yet). */
double ig_scaler_cost_per_1m(const ig_scaler_t *sc, const ig_pool_t *pool);

/* Puts a started pool under the scaler, with its policy (copied).
 * The table grows past max_pools when needed. 0 or IG_ENOMEM. */
int ig_scaler_add(ig_scaler_t *sc, ig_pool_t *pool, const ig_autoscale_params_t *params);

/* Takes a pool from the scaler (a reload that replaces or removes it):
 * nothing is started or drained for it from then on; the pool is the
 * caller's. 0 or IG_ENOENT. */
int ig_scaler_remove(ig_scaler_t *sc, ig_pool_t *pool);

/* Stops deciding and waking at once, then closes the timers, calls cb and
 * frees sc. The pools are the caller's to close. */
void ig_scaler_close(ig_scaler_t *sc, void (*cb)(void *data), void *data);

/* What the pool's event callback should forward: an instance that became
 * ready lets held requests retry; a device that came free while requests
 * wait for a pool at zero starts an instance. Pools not added are ignored. */
void ig_scaler_pool_event(ig_scaler_t *sc, ig_pool_t *pool, ig_instance_t *inst);

/* A request for the pool's model arrived at now_ns: noted for
 * scale-to-zero, and a pool with nothing serving or starting is woken.
 * Returns 1 when an instance serves or is on its way (the request may be
 * held), else 0. */
int ig_scaler_request(ig_scaler_t *sc, ig_pool_t *pool, uint64_t now_ns);

/* The pool's load now: in flight on its instances, plus the requests the
 * proxy holds for its model when it is the pool that should absorb them
 * (of a model's pools, the cheapest that can still grow; the only one when
 * the model has one). */
double ig_scaler_load(const ig_scaler_t *sc, ig_pool_t *pool);

/* For GET /status: the instances the policy wants, its parameters, and the
 * decisions kept (k = 0 is the oldest; NULL past the last). Pools not added
 * give 0, NULL, NULL. */
int ig_scaler_desired(const ig_scaler_t *sc, const ig_pool_t *pool);
const ig_autoscale_params_t *ig_scaler_params(const ig_scaler_t *sc, const ig_pool_t *pool);
const ig_scaler_record_t *ig_scaler_record(const ig_scaler_t *sc, const ig_pool_t *pool, int k);

#endif
