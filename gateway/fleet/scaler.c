/*
 * The autoscaler driver (see include/infergate/scaler.h): samples, decides
 * with gateway/fleet/autoscale.c, and starts or drains instances.
 */
#include "infergate/scaler.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/metrics.h"

#include <math.h>
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
    /* What its capacity costs (docs/autoscale.md, "Cheap capacity first") */
    double tps;       /* output tokens/s its ready instances report (their mean),
                         the last figure while none does; 0: never measured */
    double cost_1m;   /* USD per 1M output tokens; NAN: unknown */
    double rank;      /* what ig_autoscale_prefer_cheap orders by; NAN: unknown */
    int priced;       /* it has a price */
    /* This tick's own decision, before the model's pools are weighed together */
    ig_scale_decision_t d;
    double load;
    int current, ready, avail;
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
    ig_scaler_price_cb price_cb; /* NULL: every pool unpriced */
    void *price_data;
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

/* ---- what capacity costs ---------------------------------------------------
 * A pool's cost per token is its price over its throughput: per hour, the
 * instance-hour over the output tokens an instance generates in an hour,
 * as its workers report them (/load decode_tokens_per_s, the mean of its
 * ready instances; a pool that never reported takes its model's other
 * pools' mean); per token, its output price. Pools of a model are ranked
 * by that; while no per-hour pool of the model has been measured they go
 * by their hourly price, before pools priced per token. Unpriced pools are
 * unknown and rank last (docs/autoscale.md). */

static int same_model(const pool_scaler_t *a, const pool_scaler_t *b)
{
    return strcmp(ig_pool_model(a->pool), ig_pool_model(b->pool)) == 0;
}

static void measure(pool_scaler_t *ps)
{
    double sum = 0;
    int n = 0;
    for (int i = 0; i < ig_pool_size(ps->pool); i++) {
        ig_instance_t *in = ig_pool_instance(ps->pool, i);
        const ig_load_t *l = ig_instance_load(in);
        if (ig_instance_state(in) == IG_INSTANCE_READY && (l->has & IG_LOAD_DECODE_TPS) &&
            l->decode_tokens_per_s > 0) {
            sum += l->decode_tokens_per_s;
            n++;
        }
    }
    if (n > 0)
        ps->tps = sum / n;
}

/* Ranks every pool of ps's model. */
static void rank_model(ig_scaler_t *sc, const pool_scaler_t *of)
{
    ig_price_t none = {IG_PRICE_NONE, 0, 0, 0};
    double tps_sum = 0;
    int measured = 0, hourly = 0;
    for (int p = 0; p < sc->npools; p++) {
        const pool_scaler_t *ps = &sc->pools[p];
        if (!same_model(ps, of) || ps->tps <= 0)
            continue;
        tps_sum += ps->tps;
        measured++;
    }
    double peer_tps = measured > 0 ? tps_sum / measured : 0;
    for (int p = 0; p < sc->npools; p++) {
        pool_scaler_t *ps = &sc->pools[p];
        if (!same_model(ps, of))
            continue;
        ig_price_t price = sc->price_cb ? sc->price_cb(sc->price_data, ps->pool) : none;
        double tps = ps->tps > 0 ? ps->tps : peer_tps;
        ps->priced = price.kind != IG_PRICE_NONE;
        ps->cost_1m = NAN;
        if (price.kind == IG_PRICE_PER_TOKEN)
            ps->cost_1m = price.per_1m_output;
        else if (price.kind == IG_PRICE_PER_HOUR && tps > 0)
            ps->cost_1m = price.per_hour * 1e6 / (3600.0 * tps);
        hourly += price.kind == IG_PRICE_PER_HOUR;
        ps->rank = ps->cost_1m;
        if (price.kind == IG_PRICE_PER_HOUR && !(tps > 0))
            ps->rank = price.per_hour; /* fixed below: no throughput anywhere */
    }
    if (hourly == 0 || measured > 0)
        return;
    /* No throughput measured yet: per-hour pools by their hourly price,
     * pools priced per token after them. */
    for (int p = 0; p < sc->npools; p++) {
        pool_scaler_t *ps = &sc->pools[p];
        if (same_model(ps, of) && ps->priced && !isnan(ps->cost_1m))
            ps->rank = INFINITY;
    }
}

/* 1 when some pool of ps's model has a price: only then do its pools
 * trade growth and shrink, and the held queue counts for one of them. */
static int model_priced(const ig_scaler_t *sc, const pool_scaler_t *of)
{
    for (int p = 0; p < sc->npools; p++) {
        if (same_model(&sc->pools[p], of) && sc->pools[p].priced)
            return 1;
    }
    return 0;
}

/* 1 when the pool could start another instance. */
static int can_grow(const pool_scaler_t *ps)
{
    return ig_pool_live(ps->pool) < ps->as.p.max_instances && ig_pool_available(ps->pool) > 0;
}

/* The pool of ps's model that the held queue counts for: the cheapest that
 * can grow, else the cheapest; the first of equals. */
static const pool_scaler_t *queue_owner(const ig_scaler_t *sc, const pool_scaler_t *of)
{
    const pool_scaler_t *best = NULL;
    int best_grows = 0;
    for (int p = 0; p < sc->npools; p++) {
        const pool_scaler_t *ps = &sc->pools[p];
        if (!same_model(ps, of))
            continue;
        int grows = can_grow(ps);
        if (best == NULL || (grows && !best_grows) ||
            (grows == best_grows && ig_autoscale_cheaper(ps->rank, best->rank))) {
            best = ps;
            best_grows = grows;
        }
    }
    return best;
}

void ig_scaler_on_price(ig_scaler_t *sc, ig_scaler_price_cb cb, void *data)
{
    sc->price_cb = cb;
    sc->price_data = data;
    for (int p = 0; p < sc->npools; p++)
        rank_model(sc, &sc->pools[p]);
}

double ig_scaler_cost_per_1m(const ig_scaler_t *sc, const ig_pool_t *pool)
{
    const pool_scaler_t *ps = find(sc, pool);
    return ps ? ps->cost_1m : NAN;
}

/* ---- waking a pool at zero ---------------------------------------------- */

/* 1 when a cheaper pool of ps's model serves, or can be woken instead. */
static int cheaper_wakes(ig_scaler_t *sc, pool_scaler_t *ps)
{
    rank_model(sc, ps);
    if (!model_priced(sc, ps))
        return 0;
    for (int p = 0; p < sc->npools; p++) {
        pool_scaler_t *o = &sc->pools[p];
        if (o == ps || !same_model(o, ps) || !ig_autoscale_cheaper(o->rank, ps->rank))
            continue;
        if (ig_pool_live(o->pool) > 0 || ig_pool_available(o->pool) > 0 ||
            ig_pool_stopping(o->pool) > 0)
            return 1;
    }
    return 0;
}

/* Wakes a pool that has nothing serving or starting for a request: takes
 * back a draining instance or starts one. Returns 1 when the request can
 * be held because something is on its way. */
static int wake_pool(ig_scaler_t *sc, pool_scaler_t *ps, const char *why)
{
    ig_pool_t *pool = ps->pool;
    if (ig_pool_live(pool) > 0)
        return 1;
    /* Cheap capacity first: a cheaper pool of the model takes the request. */
    if (cheaper_wakes(sc, ps))
        return 0;
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
    const pool_scaler_t *ps = find(sc, pool);
    double load = 0;
    if (ps == NULL || !model_priced(sc, ps) || queue_owner(sc, ps) == ps)
        load = ig_proxy_queued_model(sc->proxy, ig_pool_model(pool));
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

/* The pool's own decision, kept in ps until the model's pools are weighed. */
static void decide_own(pool_scaler_t *ps, uint64_t now)
{
    ig_pool_t *pool = ps->pool;
    ps->load = ps->nacc > 0 ? ps->acc / ps->nacc : 0;
    ps->acc = 0;
    ps->nacc = 0;
    ps->ready = ig_pool_count(pool, IG_INSTANCE_READY);
    ps->current = ig_pool_live(pool);
    ps->avail = ig_pool_available(pool);
    ig_autoscaler_sample(&ps->as, now, ps->load);
    ps->d = ig_autoscaler_decide(&ps->as, now, ps->current, ps->ready, ps->avail);
}

/* Cheap capacity first: the pools of first's model trade growth and
 * shrink (ig_autoscale_prefer_cheap); each decision is rewritten. */
static void prefer_cheap(ig_scaler_t *sc, pool_scaler_t *first, uint64_t now)
{
    ig_autoscale_member_t m[64];
    pool_scaler_t *of[64];
    int n = 0;
    if (!model_priced(sc, first))
        return;
    for (int p = 0; p < sc->npools && n < 64; p++) {
        pool_scaler_t *ps = &sc->pools[p];
        if (!same_model(ps, first))
            continue;
        const ig_scale_decision_t *d = &ps->d;
        const ig_autoscale_params_t *ap = &ps->as.p;
        int lo = (int)floor(ps->current / ap->max_scale_down_rate);
        if (lo < ap->min_instances)
            lo = ap->min_instances;
        if (d->panic || lo > ps->current)
            lo = ps->current;
        int hi = ps->current + ps->avail;
        if (hi > ap->max_instances)
            hi = ap->max_instances;
        if (hi < d->desired)
            hi = d->desired;
        m[n].rank = ps->rank;
        m[n].target = ap->target_queue_depth;
        m[n].load = d->panic ? fmax(d->stable_load, d->panic_load) : d->stable_load;
        m[n].current = ps->current;
        m[n].lo = lo;
        m[n].hi = hi;
        m[n].desired = d->desired;
        of[n++] = ps;
    }
    if (n < 2)
        return;
    ig_autoscale_prefer_cheap(m, n);
    for (int k = 0; k < n; k++) {
        ig_scale_decision_t *d = &of[k]->d;
        if (m[k].reason != NULL)
            d->reason = m[k].reason;
        if (m[k].limit != NULL)
            d->limit = m[k].limit;
        if (m[k].desired > d->desired)
            ig_autoscaler_hold(&of[k]->as, now, m[k].desired);
        d->desired = m[k].desired;
        int cur = of[k]->current;
        d->direction = d->desired > cur   ? IG_SCALE_UP
                       : d->desired < cur ? IG_SCALE_DOWN
                                          : IG_SCALE_NONE;
        if (d->direction == IG_SCALE_NONE && strcmp(d->reason, "stable") == 0)
            d->reason = "steady";
    }
}

/* Records, logs and carries out ps's decision. */
static void act(ig_scaler_t *sc, pool_scaler_t *ps)
{
    ig_pool_t *pool = ps->pool;
    const ig_scale_decision_t d = ps->d;
    int current = ps->current, ready = ps->ready, avail = ps->avail;
    double load = ps->load;
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
            d.limit, load, d.stable_load, d.panic_load, ready, avail, ps->as.p.target_queue_depth);
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

/* One decision for every pool: each its own, then the pools of a model
 * weighed together, then carried out. */
static void decide_all(ig_scaler_t *sc, uint64_t now)
{
    for (int p = 0; p < sc->npools; p++)
        measure(&sc->pools[p]);
    for (int p = 0; p < sc->npools; p++) {
        int seen = 0;
        for (int q = 0; q < p && !seen; q++)
            seen = same_model(&sc->pools[q], &sc->pools[p]);
        if (!seen)
            rank_model(sc, &sc->pools[p]);
    }
    for (int p = 0; p < sc->npools; p++)
        decide_own(&sc->pools[p], now);
    for (int p = 0; p < sc->npools; p++) {
        int seen = 0;
        for (int q = 0; q < p && !seen; q++)
            seen = same_model(&sc->pools[q], &sc->pools[p]);
        if (!seen)
            prefer_cheap(sc, &sc->pools[p], now);
    }
    for (int p = 0; p < sc->npools && !sc->closing; p++)
        act(sc, &sc->pools[p]);
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
    }
    if (due)
        decide_all(sc, now);
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
    memset(ps, 0, sizeof(*ps)); /* a slot a removed pool left */
    ps->pool = pool;
    ig_autoscaler_init(&ps->as, params);
    ps->desired = params->min_instances;
    ps->cost_1m = NAN;
    ps->rank = NAN;
    rank_model(sc, ps);
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
