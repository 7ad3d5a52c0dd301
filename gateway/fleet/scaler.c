/*
 * The autoscaler driver (see include/infergate/scaler.h): samples, decides
 * with gateway/fleet/autoscale.c, and starts or drains instances.
 */
#include "infergate/scaler.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Load is sampled every 100 ms and averaged into one sample per decision
 * (1 s): a time average of in-flight work, not one instant of it. */
#define SAMPLE_MS 100
#define SAMPLES_PER_DECISION 10

/* The autoscaler state of one pool. */
typedef struct {
    ig_pool_t *pool;
    ig_autoscaler_t as;
    double acc; /* load samples since the last decision */
    int nacc;
    int desired;
    int wake; /* a request waits for a pool at zero whose device is still being freed */
    int kick; /* an instance became ready: retry the held requests */
    ig_scaler_record_t rec[IG_SCALER_RECORDS]; /* ring, oldest first */
    int rec_head, rec_n;
} pool_scaler_t;

struct ig_scaler_s {
    ig_proxy_t *proxy;
    pool_scaler_t *pools;
    int npools, max_pools;
    uv_timer_t tick; /* load samples; every SAMPLES_PER_DECISION-th, a decision */
    unsigned ticks;
    uv_timer_t kick; /* held requests retried after an instance became ready */
    int closing;     /* from ig_scaler_close on, nothing starts */
    int pending_closes;
    void (*close_cb)(void *data);
    void *close_data;
    ig_metric_t *m_decisions;
    ig_metric_t *m_desired;
};

static pool_scaler_t *find(const ig_scaler_t *sc, const ig_pool_t *pool)
{
    for (int p = 0; sc != NULL && p < sc->npools; p++) {
        if (sc->pools[p].pool == pool)
            return &sc->pools[p];
    }
    return NULL;
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void record_decision(pool_scaler_t *ps, const ig_scaler_record_t *r)
{
    /* A hold that repeats every tick (delay, no device) is kept once. */
    if (ps->rec_n > 0) {
        ig_scaler_record_t *last = &ps->rec[(ps->rec_head + ps->rec_n - 1) % IG_SCALER_RECORDS];
        if (strcmp(r->direction, "none") == 0 && strcmp(last->direction, "none") == 0 &&
            strcmp(last->reason, r->reason) == 0 && strcmp(last->limit, r->limit) == 0 &&
            last->desired == r->desired && last->current == r->current)
            return;
    }
    int slot = (ps->rec_head + ps->rec_n) % IG_SCALER_RECORDS;
    if (ps->rec_n == IG_SCALER_RECORDS)
        ps->rec_head = (ps->rec_head + 1) % IG_SCALER_RECORDS;
    else
        ps->rec_n++;
    ps->rec[slot] = *r;
}

/* ---- waking a pool at zero ---------------------------------------------- */

/* Wakes a pool that has nothing serving or starting for a request: takes
 * back a draining instance or starts one. Returns 1 when the request can
 * be held because something is on its way. */
static int wake_pool(ig_scaler_t *sc, pool_scaler_t *ps, const char *why)
{
    ig_pool_t *pool = ps->pool;
    if (ig_pool_live(pool) > 0)
        return 1;
    int current = 0, free_devices = ig_pool_available(pool);
    if (ig_pool_scale_up(pool) == 0) {
        ps->wake = 0;
        ps->desired = ps->desired > 1 ? ps->desired : 1;
        IG_INFO("autoscale pool=%s: up 0 -> 1 (%s)", ig_pool_name(pool), why);
        ig_metric_add(sc->m_decisions, 1, ig_pool_name(pool), "up", why);
        ig_metric_set(sc->m_desired, ps->desired, ig_pool_name(pool));
        ig_scaler_record_t r = {unix_ms(), "up", why,          "none", current, 0,
                                1,         1,    free_devices, 0,      0,       0};
        record_decision(ps, &r);
        return 1;
    }
    /* The device is still held by an instance on its way out: start one as
     * soon as it is free (ig_scaler_pool_event). */
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

int ig_scaler_request(ig_scaler_t *sc, ig_pool_t *pool, uint64_t now_ns)
{
    pool_scaler_t *ps = find(sc, pool);
    if (ps == NULL || sc->closing)
        return 0;
    ig_autoscaler_note_request(&ps->as, now_ns);
    /* Scaled to zero (or its last instance is on its way out): a request
     * is what wakes the pool up; it is held meanwhile. */
    return wake_pool(sc, ps, "from_zero");
}

static void on_kick(uv_timer_t *t)
{
    ig_scaler_t *sc = t->data;
    for (int p = 0; p < sc->npools; p++) {
        if (sc->pools[p].kick) {
            sc->pools[p].kick = 0;
            ig_proxy_kick(sc->proxy, ig_pool_model(sc->pools[p].pool));
        }
    }
}

void ig_scaler_pool_event(ig_scaler_t *sc, ig_pool_t *pool, ig_instance_t *inst)
{
    pool_scaler_t *ps = find(sc, pool);
    if (ps == NULL || sc->closing)
        return; /* still starting up, or closing */
    ig_instance_state_t st = ig_instance_state(inst);
    /* An instance that became ready may take held requests. The retry runs
     * from the loop, not from inside whatever changed the state (which may
     * be the proxy itself, through its resolver). */
    if (st == IG_INSTANCE_READY) {
        ps->kick = 1;
        uv_timer_start(&sc->kick, on_kick, 0, 0);
    }
    /* A device came free while requests wait for a pool at zero. */
    if (st == IG_INSTANCE_STOPPED && !ig_instance_holds_device(inst) &&
        (ps->wake || ig_proxy_queued_model(sc->proxy, ig_pool_model(pool)) > 0))
        wake_pool(sc, ps, "from_zero");
}

/* ---- sampling and deciding ----------------------------------------------- */

/* In-flight requests of the pool's instances plus those the proxy holds
 * for its model: the waiting + running the autoscaler targets. */
double ig_scaler_load(const ig_scaler_t *sc, ig_pool_t *pool)
{
    double load = ig_proxy_queued_model(sc->proxy, ig_pool_model(pool));
    for (int i = 0; i < ig_pool_size(pool); i++)
        load += ig_instance_route(ig_pool_instance(pool, i))->inflight;
    return load;
}

/* Drain what costs least to lose: a crashed one waiting to restart, then
 * one still starting, then the ready one with the fewest requests in
 * flight. Returns the instance's index, or -1. */
static int cheapest_to_drain(ig_pool_t *pool)
{
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
    return best;
}

static void decide(ig_scaler_t *sc, pool_scaler_t *ps, uint64_t now)
{
    ig_pool_t *pool = ps->pool;
    ig_autoscaler_t *as = &ps->as;
    double load = ps->nacc > 0 ? ps->acc / ps->nacc : ig_scaler_load(sc, pool);
    ps->acc = 0;
    ps->nacc = 0;
    int ready = ig_pool_count(pool, IG_INSTANCE_READY);
    int current = ig_pool_live(pool);
    int avail = ig_pool_available(pool);
    ig_autoscaler_sample(as, now, load);
    ig_scale_decision_t d = ig_autoscaler_decide(as, now, current, ready, avail);
    ps->desired = d.desired;
    ig_metric_set(sc->m_desired, d.desired, ig_pool_name(pool));
    ig_scaler_record_t r;
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
        record_decision(ps, &r);
    if (d.direction == IG_SCALE_NONE)
        return;
    IG_INFO("autoscale pool=%s: %s %d -> %d (%s, limit %s; load %.2f, stable load %.2f, panic "
            "load %.2f, ready %d, available devices %d, target %.1f)",
            ig_pool_name(pool), ig_scale_direction_name(d.direction), current, d.desired, d.reason,
            d.limit, load, d.stable_load, d.panic_load, ready, avail, as->p.target_queue_depth);
    ig_metric_add(sc->m_decisions, 1, ig_pool_name(pool), ig_scale_direction_name(d.direction),
                  d.reason);
    for (int k = current; k < d.desired; k++) {
        if (ig_pool_scale_up(pool) != 0)
            break;
    }
    for (int k = d.desired; k < current; k++) {
        int best = cheapest_to_drain(pool);
        if (best < 0 || ig_pool_drain(pool, best) != 0)
            break;
    }
}

static void on_tick(uv_timer_t *t)
{
    ig_scaler_t *sc = t->data;
    uint64_t now = uv_hrtime();
    int due = ++sc->ticks % SAMPLES_PER_DECISION == 0;
    for (int p = 0; p < sc->npools; p++) {
        pool_scaler_t *ps = &sc->pools[p];
        ps->acc += ig_scaler_load(sc, ps->pool);
        ps->nacc++;
        if (due)
            decide(sc, ps, now);
    }
}

/* ---- start and close ------------------------------------------------------ */

int ig_scaler_start(ig_scaler_t **out, uv_loop_t *loop, ig_proxy_t *proxy, int max_pools)
{
    ig_scaler_t *sc = calloc(1, sizeof(*sc));
    if (sc == NULL)
        return IG_ENOMEM;
    sc->pools = calloc(max_pools > 0 ? max_pools : 1, sizeof(pool_scaler_t));
    if (sc->pools == NULL) {
        free(sc);
        return IG_ENOMEM;
    }
    sc->max_pools = max_pools;
    sc->proxy = proxy;
    sc->m_decisions = ig_metrics_counter("infergate_autoscale_decisions_total",
                                         "Autoscaler decisions by pool, direction and reason.",
                                         "pool,direction,reason");
    sc->m_desired = ig_metrics_gauge("infergate_pool_desired_instances",
                                     "Instances the autoscaler wants for each pool.", "pool");
    uv_timer_init(loop, &sc->tick);
    sc->tick.data = sc;
    uv_timer_start(&sc->tick, on_tick, SAMPLE_MS, SAMPLE_MS);
    uv_timer_init(loop, &sc->kick);
    sc->kick.data = sc;
    *out = sc;
    return 0;
}

int ig_scaler_add(ig_scaler_t *sc, ig_pool_t *pool, const ig_autoscale_params_t *params)
{
    if (sc->npools >= sc->max_pools) {
        /* A reload may bring pools the start did not count. */
        int cap = sc->max_pools > 0 ? 2 * sc->max_pools : 4;
        pool_scaler_t *grown = realloc(sc->pools, (size_t)cap * sizeof(*grown));
        if (grown == NULL)
            return IG_ENOMEM;
        memset(grown + sc->max_pools, 0, (size_t)(cap - sc->max_pools) * sizeof(*grown));
        sc->pools = grown;
        sc->max_pools = cap;
    }
    pool_scaler_t *ps = &sc->pools[sc->npools++];
    ps->pool = pool;
    ig_autoscaler_init(&ps->as, params);
    ps->desired = params->min_instances;
    return 0;
}

int ig_scaler_remove(ig_scaler_t *sc, ig_pool_t *pool)
{
    pool_scaler_t *ps = find(sc, pool);
    if (ps == NULL)
        return IG_ENOENT;
    size_t k = (size_t)(ps - sc->pools);
    memmove(ps, ps + 1, (size_t)(sc->npools - 1 - (int)k) * sizeof(*ps));
    sc->npools--;
    return 0;
}

static void on_timer_closed(uv_handle_t *h)
{
    ig_scaler_t *sc = h->data;
    if (--sc->pending_closes > 0)
        return;
    void (*cb)(void *) = sc->close_cb;
    void *data = sc->close_data;
    free(sc->pools);
    free(sc);
    if (cb != NULL)
        cb(data);
}

void ig_scaler_close(ig_scaler_t *sc, void (*cb)(void *data), void *data)
{
    sc->closing = 1; /* pool events and requests from here on start nothing */
    sc->close_cb = cb;
    sc->close_data = data;
    sc->pending_closes = 2;
    uv_close((uv_handle_t *)&sc->tick, on_timer_closed);
    uv_close((uv_handle_t *)&sc->kick, on_timer_closed);
}

/* ---- what GET /status shows ---------------------------------------------- */

int ig_scaler_desired(const ig_scaler_t *sc, const ig_pool_t *pool)
{
    const pool_scaler_t *ps = find(sc, pool);
    return ps ? ps->desired : 0;
}

const ig_autoscale_params_t *ig_scaler_params(const ig_scaler_t *sc, const ig_pool_t *pool)
{
    const pool_scaler_t *ps = find(sc, pool);
    return ps ? &ps->as.p : NULL;
}

const ig_scaler_record_t *ig_scaler_record(const ig_scaler_t *sc, const ig_pool_t *pool, int k)
{
    const pool_scaler_t *ps = find(sc, pool);
    if (ps == NULL || k < 0 || k >= ps->rec_n)
        return NULL;
    return &ps->rec[(ps->rec_head + k) % IG_SCALER_RECORDS];
}
