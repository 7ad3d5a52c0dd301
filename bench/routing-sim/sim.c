/*
 * The simulation engine: an event heap in virtual nanoseconds, the
 * simulated upstreams, and one gateway that runs a policy (see sim.h).
 *
 * What the gateway sees travels as it would over sockets: a request
 * reaches its upstream half a round trip after it was sent, its first
 * token and its end come back half a round trip after they happened, and
 * a /load report describes the upstream as it was half a round trip
 * before it arrived. The router's in-flight count is therefore the
 * gateway's, not the upstream's.
 *
 * Every request's size (prompt and output tokens) and its service factor
 * on each upstream are drawn from the run's seed and the request's number
 * alone, so every policy sees the same requests (common random numbers):
 * the difference between two policies on one fleet is the policies'.
 */
#include "sim.h"

#include "infergate/admit.h"
#include "infergate/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS 1e9
/* Virtual time starts here: the router takes 0 for "never". */
#define T0_NS 1000000000ULL
#define LOAD_POLL_S 0.5

/* ---- random numbers --------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A uniform in (0, 1) from a key: counter-based, so a draw depends on what
 * it is for, never on the order of the draws. */
static double uniform_of(uint64_t key)
{
    return ((double)(splitmix(key) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal_of(uint64_t key)
{
    double u1 = uniform_of(key), u2 = uniform_of(key ^ 0x5851f42d4c957f2dULL);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint64_t key3(uint64_t seed, uint64_t a, uint64_t b)
{
    return splitmix(splitmix(seed ^ (a * 0x100000001b3ULL)) ^ (b + 0x632be59bd9b4e019ULL));
}

static double factor_of(sim_dist_t d, uint64_t key)
{
    switch (d) {
    case SIM_DIST_EXP:
        return -log(uniform_of(key));
    case SIM_DIST_LOGNORMAL:
        return exp(normal_of(key) - 0.5);
    case SIM_DIST_BIMODAL:
        return uniform_of(key) < 0.9 ? 0.5 : 5.5;
    case SIM_DIST_FIXED:
        break;
    }
    return 1.0;
}

/* ---- events ----------------------------------------------------------------- */

typedef enum {
    E_ARRIVE,     /* a: request */
    E_UP_RECV,    /* a: request reaches its upstream */
    E_UP_FIRST,   /* a: request, b: version: its first token, at the upstream */
    E_UP_DONE,    /* a: request, b: version: its end, at the upstream */
    E_GW_FIRST,   /* a: request: the first token reaches the gateway */
    E_GW_DONE,    /* a: request: the end reaches the gateway */
    E_PROBE,      /* a: upstream: the gateway's probe timer */
    E_PROBE_UP,   /* a: upstream: the probe reaches it */
    E_PROBE_BACK, /* a: upstream, b: waiting, c: sent at: the answer is back */
    E_STALL,      /* a: upstream */
} ev_type_t;

typedef struct {
    uint64_t t;
    uint64_t seq;
    int type;
    int a;
    int64_t b;
    uint64_t c;
} ev_t;

typedef struct {
    ev_t *v;
    int n, cap;
    uint64_t seq;
} heap_t;

static int ev_before(const ev_t *x, const ev_t *y)
{
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

static int heap_push(heap_t *h, uint64_t t, int type, int a, int64_t b, uint64_t c)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 1024;
        ev_t *v = realloc(h->v, sizeof(ev_t) * cap);
        if (v == NULL)
            return -1;
        h->v = v;
        h->cap = cap;
    }
    ev_t e = {t, h->seq++, type, a, b, c};
    int i = h->n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!ev_before(&e, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
    return 0;
}

static ev_t heap_pop(heap_t *h)
{
    ev_t top = h->v[0], last = h->v[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        const ev_t *mv = &last;
        if (l < h->n && ev_before(&h->v[l], mv)) {
            m = l;
            mv = &h->v[l];
        }
        if (r < h->n && ev_before(&h->v[r], mv))
            m = r;
        if (m == i)
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}

/* ---- state -------------------------------------------------------------------- */

typedef struct {
    uint64_t arrive_ns;
    int prompt, output;
    int up;                           /* the upstream of the current attempt; -1 none */
    int version;                      /* bumped when a stall moves its upstream events */
    uint64_t start_ns;                /* the attempt was sent */
    uint64_t up_start_ns;             /* it took a slot at the upstream */
    uint64_t up_first_ns, up_done_ns; /* when those will happen there */
    double predicted_wait;
    int rif, trial;
    uint64_t order; /* ig_router_order_begin()'s number for the attempt */
    int failing;    /* the current attempt is answered 500 */
    int retries;
    uint32_t tried; /* upstreams tried, a bit each */
    int done;
    uint64_t first_ns;
} req_t;

typedef struct {
    int running;
    int *fifo; /* request ids waiting for a slot */
    int qhead, qlen, qcap;
    int *slot_req; /* the requests in its slots */
    uint64_t stalled_until;
    uint64_t shift_ns, stall_ns, fail_from_ns, fail_to_ns;
    /* the gateway's view */
    ig_router_upstream_t route;
    int probe_out;
    /* HAProxy's leastconn: the order in which equal counts are served */
    uint64_t lc_stamp;
    /* requests sent to it and not yet arrived, in order (the oracle) */
    int *transit;
    int tlen, tcap;
} up_t;

typedef struct {
    const sim_fleet_t *f;
    const sim_config_t *c;
    sim_policy_t policy;
    int variant; /* the oracle's rule */
    heap_t h;
    uint64_t now;
    req_t *req;
    up_t up[SIM_MAX_UP];
    ig_router_t router;
    int *gq; /* the gateway queue (request ids), oldest first */
    int gq_head, gq_len, gq_cap;
    uint64_t rr;  /* round robin and nginx's weighted round robin among ties */
    uint64_t rng; /* the peers' random draws */
    uint64_t lc_seq;
    double *ttft, *e2e, *cold;
    int *ttft_up; /* the upstream of each measured answer; -1 refused */
    int nmeasured, ncold;
    int ndone;
    sim_result_t *out;
    int oom;
} sim_t;

const char *sim_policy_name(sim_policy_t p)
{
    static const char *names[] = {"latency",  "least_inflight", "round_robin", "p2c",
                                  "nginx_lc", "haproxy_lc",     "oracle"};
    return (unsigned)p < SIM_NPOLICIES ? names[p] : "unknown";
}

int sim_policy_parse(const char *s, sim_policy_t *out)
{
    for (int i = 0; i < SIM_NPOLICIES; i++)
        if (strcmp(s, sim_policy_name((sim_policy_t)i)) == 0) {
            *out = (sim_policy_t)i;
            return 0;
        }
    return -1;
}

int sim_policy_is_infergate(sim_policy_t p)
{
    return p == SIM_LATENCY || p == SIM_LEAST_INFLIGHT || p == SIM_ROUND_ROBIN;
}

void sim_config_default(sim_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->requests = 20000;
    c->load = 0.7;
    c->warmup = 0.1;
    c->seed = 1;
    ig_router_opts_default(&c->router);
    c->max_inflight = 0;
    c->queue_size = 1024; /* what `infergate serve` holds by default (serve/config.c) */
    c->queue_timeout_s = 30.0;
}

static int push(sim_t *s, double after_s, int type, int a, int64_t b, uint64_t c)
{
    uint64_t d = after_s > 0 ? (uint64_t)(after_s * NS + 0.5) : 0;
    if (heap_push(&s->h, s->now + d, type, a, b, c) != 0) {
        s->oom = 1;
        return -1;
    }
    return 0;
}

static int grow(int **v, int *cap, int need)
{
    if (need <= *cap)
        return 0;
    int c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    int *n = realloc(*v, sizeof(int) * c);
    if (n == NULL)
        return -1;
    *v = n;
    *cap = c;
    return 0;
}

/* ---- the upstreams ------------------------------------------------------------ */

static double speed_at(const sim_t *s, int u, uint64_t t)
{
    const up_t *p = &s->up[u];
    return p->shift_ns && t >= p->shift_ns ? s->f->up[u].shift_factor : 1.0;
}

/* Service of request i on upstream u starting with `running` in its slots
 * (this one included) at time t: the time to its first token and to its
 * end. */
static void service_of(const sim_t *s, int u, int i, int running, uint64_t t, double *ttft,
                       double *hold)
{
    const sim_upstream_t *sp = &s->f->up[u];
    const req_t *r = &s->req[i];
    double f = factor_of(sp->dist, key3(s->c->seed, (uint64_t)i, 1000 + (uint64_t)u));
    double busy = sp->slots > 1 ? (double)(running - 1) / (sp->slots - 1) : 0.0;
    double slow = (1.0 + sp->batch_slow * busy) * speed_at(s, u, t) * f;
    *ttft = (sp->ttft0_s + r->prompt * sp->prefill_s_tok) * slow;
    if (sp->fixed_decode)
        *hold = *ttft + (r->output - 1) * sp->decode_s_tok;
    else
        *hold = *ttft + r->output * sp->decode_s_tok * slow;
}

static void up_start(sim_t *s, int u, int i)
{
    up_t *p = &s->up[u];
    req_t *r = &s->req[i];
    p->slot_req[p->running++] = i;
    uint64_t t = s->now > p->stalled_until ? s->now : p->stalled_until;
    double ttft, hold;
    service_of(s, u, i, p->running, t, &ttft, &hold);
    r->up_start_ns = t;
    r->up_first_ns = t + (uint64_t)(ttft * NS);
    r->up_done_ns = t + (uint64_t)(hold * NS);
    double lead = (double)(t - s->now) / NS;
    push(s, lead + ttft, E_UP_FIRST, i, r->version, 0);
    push(s, lead + hold, E_UP_DONE, i, r->version, 0);
}

static void up_recv(sim_t *s, int i)
{
    req_t *r = &s->req[i];
    int u = r->up;
    up_t *p = &s->up[u];
    for (int k = 0; k < p->tlen; k++) /* no longer in transit */
        if (p->transit[k] == i) {
            memmove(&p->transit[k], &p->transit[k + 1], sizeof(int) * (p->tlen - k - 1));
            p->tlen--;
            break;
        }
    if (p->fail_from_ns && s->now >= p->fail_from_ns && s->now < p->fail_to_ns) {
        r->failing = 1; /* a 500 at once */
        push(s, 0.001 + s->f->up[u].rtt_s / 2, E_GW_DONE, i, 0, 0);
        return;
    }
    if (p->running < s->f->up[u].slots) {
        up_start(s, u, i);
        return;
    }
    if (grow(&p->fifo, &p->qcap, p->qlen + 1) != 0) {
        s->oom = 1;
        return;
    }
    /* a ring: the live entries are qhead..qhead+qlen-1, mod qcap */
    if (p->qhead + p->qlen >= p->qcap) {
        memmove(p->fifo, p->fifo + p->qhead, sizeof(int) * p->qlen);
        p->qhead = 0;
    }
    p->fifo[p->qhead + p->qlen++] = i;
}

static void up_done(sim_t *s, int i)
{
    req_t *r = &s->req[i];
    int u = r->up;
    up_t *p = &s->up[u];
    for (int k = 0; k < p->running; k++)
        if (p->slot_req[k] == i) {
            p->slot_req[k] = p->slot_req[--p->running];
            break;
        }
    push(s, s->f->up[u].rtt_s / 2, E_GW_DONE, i, 0, 0);
    if (p->qlen > 0) {
        int next = p->fifo[p->qhead++];
        p->qlen--;
        up_start(s, u, next);
    }
}

/* Nothing on u progresses for its stall: the requests in its slots end
 * that much later, and a request that takes a slot meanwhile starts when
 * it is over. */
static void up_stall(sim_t *s, int u)
{
    up_t *p = &s->up[u];
    double d = s->f->up[u].stall_s;
    p->stalled_until = s->now + (uint64_t)(d * NS);
    for (int k = 0; k < p->running; k++) {
        req_t *r = &s->req[p->slot_req[k]];
        r->version++;
        if (r->up_first_ns > s->now) {
            r->up_first_ns += (uint64_t)(d * NS);
            push(s, (double)(r->up_first_ns - s->now) / NS, E_UP_FIRST, p->slot_req[k], r->version,
                 0);
        }
        r->up_done_ns += (uint64_t)(d * NS);
        push(s, (double)(r->up_done_ns - s->now) / NS, E_UP_DONE, p->slot_req[k], r->version, 0);
    }
}

/* ---- the oracle ---------------------------------------------------------------- */

/* The oracle's cost of sending request i to u, knowing what no gateway
 * knows: how many requests u runs, holds in its FIFO and has on their way
 * to it, its slots, its speed now, its round trip, a stall in progress and
 * a failure window. Only the sizes are not known (no router knows how long
 * an answer will be): each one ahead holds a slot for the mean.
 *
 * Sending each request where its own expected TTFT is least is not the
 * best for the others: on a fleet of fast and slow upstreams it queues
 * everyone on the fast ones (5x least connections' p50 in the simulation).
 * So the oracle is the best of three informed rules, each metric taken
 * from whichever did best in that cell (variant):
 *   0  the expected TTFT: rtt + wait + own service
 *   1  the wait weighed 4x (what one more queued request costs those after)
 *   2  shortest expected delay: rtt + (n + 1) x hold / slots + own service */
static double oracle_cost(sim_t *s, int u, int i)
{
    const up_t *p = &s->up[u];
    const sim_upstream_t *sp = &s->f->up[u];
    const req_t *r = &s->req[i];
    uint64_t at = s->now + (uint64_t)(sp->rtt_s / 2 * NS);
    if (p->fail_from_ns && at >= p->fail_from_ns && at < p->fail_to_ns)
        return INFINITY;
    int c = sp->slots;
    int n = p->running + p->qlen + p->tlen;
    double speed = speed_at(s, u, at);
    double busy = c > 1 ? fmin((double)n / (c - 1), 1.0) : 0.0;
    double slow = (1.0 + sp->batch_slow * busy) * speed;
    double hold = (sp->ttft0_s + s->f->prompt_mean * sp->prefill_s_tok +
                   s->f->output_mean * sp->decode_s_tok) *
                  slow;
    double wait = s->variant == 2 ? (n + 1.0) * hold / c : fmax(0.0, n + 1.0 - c) * hold / c;
    if (s->variant == 1)
        wait *= 4;
    double stall = p->stalled_until > at ? (double)(p->stalled_until - at) / NS : 0.0;
    double own = (sp->ttft0_s + r->prompt * sp->prefill_s_tok) * slow;
    if (!s->f->stream)
        own += s->f->output_mean * sp->decode_s_tok * slow;
    return sp->rtt_s + fmax(wait, stall) + own;
}

/* ---- the gateway ---------------------------------------------------------------- */

static void finish(sim_t *s, int i)
{
    s->req[i].done = 1;
    s->ndone++;
}

static void record(sim_t *s, int i, int up, double ttft, double e2e)
{
    if (up >= 0) {
        const req_t *r = &s->req[i];
        s->out->up_answers[up]++;
        s->out->up_ttft_sum[up] += ttft - (double)(r->start_ns - r->arrive_ns) / NS;
    }
    /* A client waits for a first token as long as the gateway holds a
     * request (its queue's timeout) and no longer, whichever the policy (a
     * baseline's queue has no timeout): a later one counts as that long. */
    ttft = fmin(ttft, s->c->queue_timeout_s);
    if (i < (int)(s->c->warmup * s->c->requests)) {
        s->cold[s->ncold++] = ttft;
        return;
    }
    s->ttft_up[s->nmeasured] = up;
    s->ttft[s->nmeasured] = ttft;
    s->e2e[s->nmeasured] = e2e;
    s->nmeasured++;
}

/* The gateway refused request i (its queue was full, or it waited there
 * past the queue's timeout): counted, and measured as the longest a client
 * waits (record()), so that a policy cannot better its percentiles by
 * refusing the requests it would have answered slowly. */
static void refuse(sim_t *s, int i)
{
    s->out->rejected++;
    record(s, i, -1, s->c->queue_timeout_s, s->c->queue_timeout_s);
    finish(s, i);
}

static int peer_pick(sim_t *s)
{
    int n = s->f->n;
    switch (s->policy) {
    case SIM_P2C: {
        /* nginx `random two least_conn`: two distinct at random, the one
         * with fewer connections, the first drawn on a tie (HAProxy's
         * random(2) alike). */
        s->rng = splitmix(s->rng);
        int a = (int)(s->rng % (uint64_t)n);
        s->rng = splitmix(s->rng);
        int b = (int)(s->rng % (uint64_t)(n - 1));
        if (b >= a)
            b++;
        return s->up[b].route.inflight < s->up[a].route.inflight ? b : a;
    }
    case SIM_NGINX_LC: {
        /* nginx least_conn: the fewest connections (equal weights); among
         * those tied, its weighted round robin, which with equal weights
         * goes round the tied ones in order from where it last stopped. */
        int best = -1;
        for (int u = 0; u < n; u++)
            if (best < 0 || s->up[u].route.inflight < s->up[best].route.inflight)
                best = u;
        int start = (int)(s->rr % (uint64_t)n);
        for (int j = 0; j < n; j++) {
            int u = (start + j) % n;
            if (s->up[u].route.inflight == s->up[best].route.inflight) {
                s->rr = (uint64_t)u + 1;
                return u;
            }
        }
        return best;
    }
    case SIM_HAPROXY_LC: {
        /* HAProxy leastconn: servers sit in a tree keyed by their load; a
         * server whose count changed goes behind the others of its key, so
         * ties go to the one whose count changed longest ago. */
        int best = -1;
        for (int u = 0; u < n; u++)
            if (best < 0 || s->up[u].route.inflight < s->up[best].route.inflight ||
                (s->up[u].route.inflight == s->up[best].route.inflight &&
                 s->up[u].lc_stamp < s->up[best].lc_stamp))
                best = u;
        return best;
    }
    default:
        return 0;
    }
}

static void send_to(sim_t *s, int i, int u)
{
    req_t *r = &s->req[i];
    up_t *p = &s->up[u];
    r->up = u;
    r->start_ns = s->now;
    r->failing = 0;
    r->tried |= 1u << u;
    s->out->sent[u]++;
    if (i >= s->c->requests / 2)
        s->out->late_sent[u]++;
    if (sim_policy_is_infergate(s->policy))
        r->predicted_wait = ig_router_wait(&s->router, &p->route, s->now);
    r->rif = p->route.inflight;
    r->order = ig_router_order_begin(&p->route, s->now);
    r->trial = ig_router_attempt_begin(&s->router, &p->route, s->now);
    p->lc_stamp = ++s->lc_seq;
    if (grow(&p->transit, &p->tcap, p->tlen + 1) != 0) {
        s->oom = 1;
        return;
    }
    p->transit[p->tlen++] = i;
    push(s, s->f->up[u].rtt_s / 2, E_UP_RECV, i, 0, 0);
}

static void gq_push(sim_t *s, int i, int front)
{
    if (grow(&s->gq, &s->gq_cap, s->gq_head + s->gq_len + 1) != 0) {
        s->oom = 1;
        return;
    }
    if (front && s->gq_head > 0) {
        s->gq[--s->gq_head] = i;
    } else if (front) {
        memmove(s->gq + 1, s->gq, sizeof(int) * s->gq_len);
        s->gq[0] = i;
    } else {
        s->gq[s->gq_head + s->gq_len] = i;
    }
    s->gq_len++;
}

/* Places request i: returns 1 when it was sent or ended, 0 when it went to
 * the gateway queue (from_queue: back to the queue's head). */
static int dispatch(sim_t *s, int i, int from_queue)
{
    req_t *r = &s->req[i];
    int n = s->f->n;
    if (!sim_policy_is_infergate(s->policy)) {
        int u;
        if (s->policy == SIM_ORACLE) {
            u = 0;
            double best = INFINITY;
            for (int k = 0; k < n; k++) {
                double c = oracle_cost(s, k, i);
                if (c < best) {
                    best = c;
                    u = k;
                }
            }
        } else if (s->policy == SIM_NGINX_LC || s->policy == SIM_HAPROXY_LC ||
                   s->policy == SIM_P2C) {
            u = peer_pick(s);
        } else {
            u = 0;
        }
        send_to(s, i, u);
        return 1;
    }
    ig_router_upstream_t *ups[SIM_MAX_UP];
    unsigned char tried[SIM_MAX_UP], exclude[SIM_MAX_UP];
    for (int u = 0; u < n; u++) {
        ups[u] = &s->up[u].route;
        tried[u] = (r->tried >> u) & 1;
    }
    ig_admit_view_t view;
    ig_admit_mark(&s->router, ups, n, tried, s->c->max_inflight, s->gq_len, s->now, exclude, &view);
    ig_route_decision_t d;
    int rc = ig_router_pick(&s->router, ups, n, r->prompt, exclude, s->now, &d);
    if (view.saturated > 0 && view.saturated < view.eligible)
        s->out->crowded++;
    if (rc == 0 && view.saturated < view.eligible &&
        ups[d.chosen]->inflight >= ig_admit_limit(&s->router, ups[d.chosen], s->c->max_inflight))
        s->out->over_limit++;
    if (rc == 0) {
        send_to(s, i, d.chosen);
        return 1;
    }
    ig_admit_verdict_t v = ig_admit_unplaced(&view, r->tried != 0, r->tried != 0, 0);
    if (v == IG_ADMIT_QUEUE) {
        if (!from_queue && s->gq_len >= s->c->queue_size) {
            refuse(s, i);
            return 1;
        }
        gq_push(s, i, from_queue);
        return 0;
    }
    s->out->failed++;
    finish(s, i);
    return 1;
}

static void pump(sim_t *s)
{
    int guard = s->gq_len;
    while (s->gq_len > 0 && guard-- > 0) {
        int i = s->gq[s->gq_head++];
        s->gq_len--;
        if (s->now - s->req[i].arrive_ns > (uint64_t)(s->c->queue_timeout_s * NS)) {
            refuse(s, i);
            continue;
        }
        if (!dispatch(s, i, 1))
            break;
    }
    if (s->gq_len == 0)
        s->gq_head = 0;
}

static void gw_first(sim_t *s, int i)
{
    req_t *r = &s->req[i];
    up_t *p = &s->up[r->up];
    /* The proxy learns a time to first token at a stream's first content
     * token only: a whole answer is committed when it is complete, and its
     * time is the hold (ig_router_observe_done()). */
    if (sim_policy_is_infergate(s->policy) && s->f->stream) {
        ig_router_observe_ttft(&s->router, &p->route, r->prompt,
                               (double)(s->now - r->start_ns) / NS, r->predicted_wait, s->now);
        ig_router_observe_wait(&s->router, &p->route, r->rif, (double)(s->now - r->start_ns) / NS,
                               s->now);
        ig_router_attempt_proven(&s->router, &p->route, r->trial, s->now);
        r->trial = 0;
        s->out->svc_peak[r->up] = fmax(s->out->svc_peak[r->up], p->route.svc_s);
    }
    r->first_ns = s->now;
}

static void gw_done(sim_t *s, int i)
{
    req_t *r = &s->req[i];
    up_t *p = &s->up[r->up];
    double held = (double)(s->now - r->start_ns) / NS;
    p->lc_stamp = ++s->lc_seq;
    ig_router_order_end(&p->route, r->order, r->rif, !r->failing, s->now);
    if (r->failing) {
        ig_router_attempt_end(&s->router, &p->route, IG_OUTCOME_FAILURE, r->trial, s->now);
        r->trial = 0;
        if (sim_policy_is_infergate(s->policy) && r->retries < s->router.opts.max_retries &&
            ig_router_budget_take(&s->router, s->now)) {
            r->retries++;
            dispatch(s, i, 0);
        } else {
            s->out->failed++;
            finish(s, i);
        }
        pump(s);
        return;
    }
    ig_router_attempt_end(&s->router, &p->route, IG_OUTCOME_SUCCESS, r->trial, s->now);
    ig_router_observe_done(&s->router, &p->route, r->rif, held, s->now);
    double e2e = (double)(s->now - r->arrive_ns) / NS;
    double ttft = s->f->stream ? (double)(r->first_ns - r->arrive_ns) / NS : e2e;
    record(s, i, r->up, ttft, e2e);
    finish(s, i);
    pump(s);
}

/* The gateway's probe timer for u: a /load poll every LOAD_POLL_S for an
 * upstream that reports, else a timed GET /health when the router asks
 * for one (ig_router_probe_due(), checked every rtt_probe_s). */
static void gw_probe(sim_t *s, int u)
{
    up_t *p = &s->up[u];
    const sim_upstream_t *sp = &s->f->up[u];
    double every = sp->reports_load ? LOAD_POLL_S : s->router.opts.rtt_probe_s;
    if (!p->probe_out && (sp->reports_load || ig_router_probe_due(&s->router, &p->route, s->now))) {
        p->probe_out = 1;
        push(s, sp->rtt_s / 2, E_PROBE_UP, u, 0, s->now);
    }
    if (every > 0)
        push(s, every, E_PROBE, u, 0, 0);
}

static void run_event(sim_t *s, const ev_t *e)
{
    switch ((ev_type_t)e->type) {
    case E_ARRIVE:
        if (sim_policy_is_infergate(s->policy))
            ig_router_budget_deposit(&s->router, s->now);
        dispatch(s, e->a, 0);
        break;
    case E_UP_RECV:
        up_recv(s, e->a);
        break;
    case E_UP_FIRST:
        if (e->b == s->req[e->a].version)
            push(s, s->f->up[s->req[e->a].up].rtt_s / 2, E_GW_FIRST, e->a, 0, 0);
        break;
    case E_UP_DONE:
        if (e->b == s->req[e->a].version)
            up_done(s, e->a);
        break;
    case E_GW_FIRST:
        gw_first(s, e->a);
        break;
    case E_GW_DONE:
        gw_done(s, e->a);
        break;
    case E_PROBE:
        gw_probe(s, e->a);
        break;
    case E_PROBE_UP:
        push(s, s->f->up[e->a].rtt_s / 2, E_PROBE_BACK, e->a, s->up[e->a].qlen, e->c);
        break;
    case E_PROBE_BACK: {
        up_t *p = &s->up[e->a];
        p->probe_out = 0;
        ig_router_observe_probe_rtt(&s->router, &p->route, (double)(s->now - e->c) / NS, s->now);
        if (s->f->up[e->a].reports_load) {
            p->route.slots = s->f->up[e->a].slots;
            p->route.reported_waiting = (double)e->b;
            p->route.reported_at_ns = s->now;
        }
        pump(s); /* what the gateway believes may have changed */
        break;
    }
    case E_STALL:
        up_stall(s, e->a);
        break;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(double *v, int n, double q)
{
    if (n == 0)
        return NAN;
    int k = (int)ceil(q * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* The standard errors of the p50 and the p99 of v[0..n) (in the order
 * the requests ended) by batch means: SIM_BATCHES consecutive batches,
 * each one's quantile; their standard deviation over the square root of
 * their number. v ends sorted within its batches. */
#define SIM_BATCHES 10
static void batch_se(double *v, int n, double *se50, double *se99)
{
    int b = SIM_BATCHES, len = n / SIM_BATCHES;
    *se50 = *se99 = NAN;
    if (len < 100)
        return;
    double s50 = 0, q50 = 0, s99 = 0, q99 = 0;
    for (int k = 0; k < b; k++) {
        double *w = v + (size_t)k * len;
        qsort(w, len, sizeof(double), cmp_double);
        double x = quantile(w, len, 0.5), y = quantile(w, len, 0.99);
        s50 += x;
        q50 += x * x;
        s99 += y;
        q99 += y * y;
    }
    *se50 = sqrt(fmax(q50 / b - (s50 / b) * (s50 / b), 0.0) / (b - 1));
    *se99 = sqrt(fmax(q99 / b - (s99 / b) * (s99 / b), 0.0) / (b - 1));
}

/* Where the measured answers at or over the TTFT p99 came from
 * (sim_result_t's tail figures); s->ttft still in the order they ended. */
static void tail_of(sim_t *s, double p99)
{
    int n = s->nmeasured;
    for (int k = 0; k < n; k++) {
        if (s->ttft[k] < p99)
            continue;
        if (s->ttft_up[k] >= 0)
            s->out->tail[s->ttft_up[k]]++;
        else
            s->out->tail_refused++;
        s->out->tail_tenth[(int)((int64_t)k * 10 / n)]++;
    }
}

static int run_one(const sim_fleet_t *f, sim_policy_t policy, int variant, const sim_config_t *c,
                   sim_result_t *out)
{
    sim_t s;
    memset(&s, 0, sizeof(s));
    memset(out, 0, sizeof(*out));
    s.f = f;
    s.c = c;
    s.policy = policy;
    s.variant = variant;
    s.out = out;
    s.now = T0_NS;
    s.rng = splitmix(c->seed ^ 0xabcdef);
    ig_router_opts_t ro = c->router;
    ro.policy = policy == SIM_ROUND_ROBIN      ? IG_ROUTE_ROUND_ROBIN
                : policy == SIM_LEAST_INFLIGHT ? IG_ROUTE_LEAST_INFLIGHT
                                               : IG_ROUTE_LATENCY;
    ig_router_init(&s.router, &ro);
    int nreq = c->requests;
    s.req = calloc(nreq, sizeof(req_t));
    s.ttft = calloc(nreq, sizeof(double));
    s.e2e = calloc(nreq, sizeof(double));
    s.cold = calloc(nreq, sizeof(double));
    s.ttft_up = calloc(nreq, sizeof(int));
    double *sorted = NULL;
    int rc = -1;
    if (s.req == NULL || s.ttft == NULL || s.e2e == NULL || s.cold == NULL || s.ttft_up == NULL)
        goto fail;
    double rate = c->load * sim_fleet_capacity(f);
    double span = nreq / rate;
    /* Arrivals: Poisson, the same for every policy. */
    double t = 0;
    for (int i = 0; i < nreq; i++) {
        req_t *r = &s.req[i];
        t += -log(uniform_of(key3(c->seed, (uint64_t)i, 1))) / rate;
        r->arrive_ns = T0_NS + (uint64_t)(t * NS);
        double zp = normal_of(key3(c->seed, (uint64_t)i, 2));
        double zo = normal_of(key3(c->seed, (uint64_t)i, 3));
        double sg = f->token_sigma, m = -0.5 * sg * sg;
        r->prompt = (int)fmax(1, round(f->prompt_mean * exp(sg * zp + m)));
        r->output = (int)fmax(1, round(f->output_mean * exp(sg * zo + m)));
        r->up = -1;
        if (heap_push(&s.h, r->arrive_ns, E_ARRIVE, i, 0, 0) != 0)
            goto fail;
    }
    for (int u = 0; u < f->n; u++) {
        up_t *p = &s.up[u];
        const sim_upstream_t *sp = &f->up[u];
        ig_router_upstream_init(&p->route, "u",
                                sp->rtt_s > 0.005 ? IG_ROUTER_SITE : IG_ROUTER_LOCAL);
        p->route.ready = 1;
        p->slot_req = calloc(sp->slots, sizeof(int));
        if (p->slot_req == NULL)
            goto fail;
        if (sp->shift_factor > 0)
            p->shift_ns = T0_NS + (uint64_t)(sp->shift_at * span * NS);
        if (sp->stall_s > 0)
            heap_push(&s.h, T0_NS + (uint64_t)(sp->stall_at * span * NS), E_STALL, u, 0, 0);
        if (sp->fail_s > 0) {
            p->fail_from_ns = T0_NS + (uint64_t)(sp->fail_at * span * NS);
            p->fail_to_ns = p->fail_from_ns + (uint64_t)(sp->fail_s * NS);
        }
        if (sim_policy_is_infergate(policy))
            heap_push(&s.h, T0_NS, E_PROBE, u, 0, 0);
    }
    while (s.h.n > 0 && !s.oom) {
        ev_t e = heap_pop(&s.h);
        s.now = e.t;
        out->events++;
        run_event(&s, &e);
        if (s.ndone == nreq)
            break; /* every request ended (the probe timers run forever) */
        if ((s.now - T0_NS) / NS > 100 * span + 3600)
            break; /* a run that never drains */
    }
    if (s.oom)
        goto fail;
    for (int u = 0; u < f->n; u++) {
        out->svc_final[u] = s.up[u].route.svc_s;
        out->c_final[u] = ig_router_concurrency(&s.up[u].route);
    }
    out->measured = s.nmeasured;
    out->span_s = (double)(s.now - T0_NS) / NS;
    double sum = 0;
    for (int k = 0; k < s.nmeasured; k++)
        sum += s.ttft[k];
    out->ttft_mean = s.nmeasured ? sum / s.nmeasured : NAN;
    /* The percentiles from a sorted copy: the tail and batch_se() (which
     * sorts each batch in place) read s.ttft in the order the answers
     * ended. */
    sorted = malloc(sizeof(double) * (size_t)(s.nmeasured > 0 ? s.nmeasured : 1));
    if (sorted == NULL)
        goto fail;
    memcpy(sorted, s.ttft, sizeof(double) * (size_t)s.nmeasured);
    qsort(sorted, s.nmeasured, sizeof(double), cmp_double);
    out->ttft_p50 = quantile(sorted, s.nmeasured, 0.5);
    out->ttft_p99 = quantile(sorted, s.nmeasured, 0.99);
    tail_of(&s, out->ttft_p99);
    batch_se(s.ttft, s.nmeasured, &out->ttft_p50_se, &out->ttft_p99_se);
    qsort(s.e2e, s.nmeasured, sizeof(double), cmp_double);
    out->e2e_p50 = quantile(s.e2e, s.nmeasured, 0.5);
    out->e2e_p99 = quantile(s.e2e, s.nmeasured, 0.99);
    qsort(s.cold, s.ncold, sizeof(double), cmp_double);
    out->cold_ttft_p99 = quantile(s.cold, s.ncold, 0.99);
    rc = 0;
fail:
    for (int u = 0; u < SIM_MAX_UP; u++) {
        free(s.up[u].fifo);
        free(s.up[u].slot_req);
        free(s.up[u].transit);
    }
    free(s.h.v);
    free(s.req);
    free(s.ttft);
    free(s.e2e);
    free(s.cold);
    free(s.ttft_up);
    free(sorted);
    free(s.gq);
    return rc;
}

/* Keeps what the oracle's rule v alone gave (r) in out. */
static void keep_rule(sim_result_t *out, int v, const sim_result_t *r)
{
    out->rule_ttft[v][0] = r->ttft_p50;
    out->rule_ttft[v][1] = r->ttft_p99;
    out->rule_ttft_se[v][0] = r->ttft_p50_se;
    out->rule_ttft_se[v][1] = r->ttft_p99_se;
}

int sim_run(const sim_fleet_t *f, sim_policy_t policy, const sim_config_t *c, sim_result_t *out)
{
    if (policy != SIM_ORACLE)
        return run_one(f, policy, 0, c, out);
    if (run_one(f, policy, 0, c, out) != 0)
        return -1;
    keep_rule(out, 0, out);
    for (int v = 1; v < SIM_ORACLE_RULES; v++) {
        sim_result_t r;
        if (run_one(f, policy, v, c, &r) != 0)
            return -1;
        keep_rule(out, v, &r);
        if (r.ttft_p50 < out->ttft_p50)
            out->ttft_p50_se = r.ttft_p50_se;
        out->ttft_p50 = fmin(out->ttft_p50, r.ttft_p50);
        if (r.ttft_p99 < out->ttft_p99)
            out->ttft_p99_se = r.ttft_p99_se;
        out->ttft_p99 = fmin(out->ttft_p99, r.ttft_p99);
        out->e2e_p50 = fmin(out->e2e_p50, r.e2e_p50);
        out->e2e_p99 = fmin(out->e2e_p99, r.e2e_p99);
        out->ttft_mean = fmin(out->ttft_mean, r.ttft_mean);
        out->cold_ttft_p99 = fmin(out->cold_ttft_p99, r.cold_ttft_p99);
    }
    return 0;
}
