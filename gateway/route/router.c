/*
 * The router's cost model, policies, outlier ejection and retry budget.
 * Pure logic: no I/O, no clock of its own (see include/infergate/router.h).
 */
#include "infergate/router.h"
#include "infergate/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NS_PER_S 1e9

static const char *policy_names[] = {"latency", "round_robin", "least_inflight", "random"};

int ig_route_policy_parse(const char *s, ig_route_policy_t *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, policy_names[i]) == 0) {
            *out = (ig_route_policy_t)i;
            return 0;
        }
    }
    return IG_EINVAL;
}

const char *ig_route_policy_name(ig_route_policy_t policy)
{
    return (unsigned)policy < 4 ? policy_names[policy] : "unknown";
}

void ig_router_opts_default(ig_router_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->policy = IG_ROUTE_LATENCY;
    o->ewma_tau_s = 10.0;
    o->hot_quantile = 0.0;
    o->report_ttl_s = 5.0;
    o->prior_rtt_s = 0.001;
    o->prior_prefill_tps = 2000.0;
    o->eject_consecutive = 5;
    o->eject_base_s = 2.0;
    o->eject_max_s = 60.0;
    o->retry_ratio = 0.2;
    o->retry_min_per_s = 5.0;
    o->max_retries = 2;
    o->seed = 0x9e3779b97f4a7c15ULL;
    o->limit_initial = 8;
    o->tail_weight = 0.0;
    o->limit_min = 1;
    o->limit_max = 0;
    o->limit_window_s = 0.1;
    o->limit_window_done = 8;
    o->limit_window_max_s = 1.0;
    o->rtt_probe_s = 0.5;
    o->explore_ratio = 0.01;
}

void ig_router_init(ig_router_t *r, const ig_router_opts_t *opts)
{
    memset(r, 0, sizeof(*r));
    if (opts != NULL)
        r->opts = *opts;
    else
        ig_router_opts_default(&r->opts);
    r->rng = r->opts.seed ? r->opts.seed : 1;
    r->retry_tokens = r->opts.retry_min_per_s;
}

void ig_router_upstream_init(ig_router_upstream_t *u, const char *name,
                             ig_router_upstream_kind_t kind)
{
    memset(u, 0, sizeof(*u));
    u->name = name;
    u->kind = kind;
}

/* xorshift64*: cheap and good enough for tie breaks and the random policy. */
static uint64_t next_rand(ig_router_t *r)
{
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 0x2545F4914F6CDD1DULL;
}

static double seconds_between(uint64_t from_ns, uint64_t to_ns)
{
    return to_ns > from_ns ? (double)(to_ns - from_ns) / NS_PER_S : 0.0;
}

/* ---- cost model --------------------------------------------------------- */

static double rtt_of(const ig_router_t *r, const ig_router_upstream_t *u)
{
    if (u->rtt_at_ns == 0)
        return u->kind == IG_ROUTER_SITE ? 0.050 : r->opts.prior_rtt_s;
    return u->rtt_s;
}

static int report_fresh(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns)
{
    return u->reported_at_ns != 0 &&
           seconds_between(u->reported_at_ns, now_ns) <= r->opts.report_ttl_s;
}

/* The reported wait at now_ns: a worker's queue drains as time passes (it
 * reports again when the queue grows, so the age is what has drained since);
 * another report (a site's) is taken as it came. */
static double reported_wait_of(const ig_router_upstream_t *u, uint64_t now_ns)
{
    if (!u->reported_wait_drains)
        return u->reported_wait_s;
    return fmax(u->reported_wait_s - seconds_between(u->reported_at_ns, now_ns), 0.0);
}

/* ---- learned concurrency -------------------------------------------------- */

/* Samples a bucket needs before it says anything. */
#define RIF_MIN_SAMPLES 6
/* How much better (chi-square) a fit with a queue must be than one
 * without (see learn_concurrency()). */
#define RIF_QUEUE_CHI2 12.0
/* Seconds after which a bucket the limit keeps out, with no sample of its
 * own since, is forgotten (see ig_router_observe_done()). */
#define RIF_STALE_S 2.0
/* The least time between two fits of an upstream's concurrency. */
#define RIF_FIT_EVERY_NS 2000000ULL
/* How long a window of the order bound lasts (ig_router_order_end()). */
#define ORDER_WINDOW_NS 30000000000ULL
/* Two attempts sent closer together than this (plus the spread of the
 * upstream's probe round trips) may reach it in the other order. */
#define ORDER_SLACK_NS 1000000ULL

/* Times by the others in flight at an attempt's start: the holds, or the
 * times to first token (ig_router_observe_wait()). */
typedef struct {
    const double *mean; /* of each bucket's times */
    const double *sq;   /* of their squares */
    const int *n;       /* samples of each */
} rif_view_t;

static rif_view_t holds_of(const ig_router_upstream_t *u)
{
    return (rif_view_t){u->rif_hold_s, u->rif_sq_s2, u->rif_n};
}

static rif_view_t firsts_of(const ig_router_upstream_t *u)
{
    return (rif_view_t){u->wait_rif_s, u->wait_rif_sq_s2, u->wait_rif_n};
}

/* A time into bucket k: a running mean over the first 32 samples (a
 * forgotten bucket starts afresh: its first sample is its mean), then an
 * EWMA of about the last 32: the service times of LLM requests vary a
 * lot. */
static void rif_add(double *mean, double *sq, int *n, int k, double seconds)
{
    if (n[k] < 32)
        n[k]++;
    mean[k] += (seconds - mean[k]) / n[k];
    sq[k] += (seconds * seconds - sq[k]) / n[k];
}

/* The time of an attempt that waited for nothing: the lowest RIF bucket
 * with enough samples (0 when none has). The last bucket (RIF beyond the
 * fit's reach) is not one: see learn_concurrency(). */
static double base_hold(rif_view_t v, int *at)
{
    for (int k = 0; k < IG_ROUTER_RIF_BUCKETS - 1; k++) {
        if (v.n[k] >= RIF_MIN_SAMPLES) {
            *at = k;
            return v.mean[k];
        }
    }
    *at = -1;
    return 0;
}

/* Each bucket's weight is the inverse variance of its mean, n / var. The
 * variance is not each bucket's own: holds are heavy-tailed (a bimodal
 * service's tenth at 11x the rest), so a bucket that caught none of the
 * tail has a low mean and almost no variance of its own, and weighed by
 * that it outweighed a full bucket that caught some long answers 185
 * times: the fit read the step from it as a queue (16-slot upstreams
 * learned as 3-4; test_router_learn). One coefficient of variation is
 * pooled over the buckets (a service's spread scales with its mean), and
 * var_k = cv^2 x m_k^2, at least a tenth of the scale squared (a fixed
 * delay has none). */
static void bucket_weights(rif_view_t v, int k0, double scale, double *wk)
{
    double dev = 0, lvl = 0;
    for (int k = k0; k < IG_ROUTER_RIF_BUCKETS - 1; k++) {
        if (v.n[k] < RIF_MIN_SAMPLES)
            continue;
        double m = v.mean[k];
        dev += v.n[k] * fmax(v.sq[k] - m * m, 0.0);
        lvl += v.n[k] * m * m;
    }
    double cv2 = lvl > 0 ? dev / lvl : 0;
    for (int k = k0; k < IG_ROUTER_RIF_BUCKETS - 1; k++) {
        double m = v.mean[k];
        double var = fmax(cv2 * m * m, 0.01 * scale * scale);
        wk[k] = v.n[k] / var;
    }
}

/* The weighted sums the fit of every candidate C needs, over the buckets
 * with samples from k0 on: totals, and tails from bucket j on (j = 0..last)
 * of w, w (k + 1), w (k + 1)^2, w y and w (k + 1) y. For a C, x_k is 0 below
 * bucket floor(C) and (k + 1 - C) / C from it on, so each candidate's sums
 * are a few operations on one tail, not a pass over the buckets. */
typedef struct {
    double w, y, yy;
    double t0[IG_ROUTER_RIF_BUCKETS + 1], t1[IG_ROUTER_RIF_BUCKETS + 1],
        t2[IG_ROUTER_RIF_BUCKETS + 1], ty[IG_ROUTER_RIF_BUCKETS + 1],
        t1y[IG_ROUTER_RIF_BUCKETS + 1];
} fit_sums_t;

static void fit_sums(rif_view_t v, int k0, const double *wk, fit_sums_t *f)
{
    int last = IG_ROUTER_RIF_BUCKETS - 1; /* the last bucket is left out */
    f->w = f->y = f->yy = 0;
    f->t0[last] = f->t1[last] = f->t2[last] = f->ty[last] = f->t1y[last] = 0;
    for (int k = last - 1; k >= 0; k--) {
        double w = k >= k0 && v.n[k] >= RIF_MIN_SAMPLES ? wk[k] : 0;
        double y = v.mean[k], x = k + 1;
        f->t0[k] = f->t0[k + 1] + w;
        f->t1[k] = f->t1[k + 1] + w * x;
        f->t2[k] = f->t2[k + 1] + w * x * x;
        f->ty[k] = f->ty[k + 1] + w * y;
        f->t1y[k] = f->t1y[k + 1] + w * x * y;
        f->yy += w * y * y;
    }
    f->w = f->t0[0];
    f->y = f->ty[0];
}

/* One candidate C: the weighted least-squares line of the buckets' holds
 * on x_k = max(0, k + 1 - C) / C, its slope kept within half and one and a
 * half of `expect` (a service time, not the slope of noise). Returns the
 * fit's chi-square; its base and slope in *base and *slope. */
static double fit_queue(const fit_sums_t *f, double c, double expect, double *base, double *slope)
{
    int j = (int)c;
    if (j > IG_ROUTER_RIF_BUCKETS - 1)
        j = IG_ROUTER_RIF_BUCKETS - 1;
    double sw = f->w, sy = f->y;
    double sx = (f->t1[j] - c * f->t0[j]) / c;
    double sxx = (f->t2[j] - 2 * c * f->t1[j] + c * c * f->t0[j]) / (c * c);
    double sxy = (f->t1y[j] - c * f->ty[j]) / c;
    double var = sxx - sx * sx / sw;
    double s = var > 1e-12 ? (sxy - sx * sy / sw) / var : 0.0;
    s = fmin(fmax(s, 0.5 * expect), 1.5 * expect);
    double b = (sy - s * sx) / sw;
    /* chi-square, sum w (y - b - s x)^2: in units of each mean's variance */
    double err = f->yy - 2 * b * sy - 2 * s * sxy + b * b * sw + 2 * b * s * sx + s * s * sxx;
    *base = b;
    *slope = s;
    return fmax(err, 0.0);
}

/* ---- the order of the answers -------------------------------------------- */

uint64_t ig_router_order_begin(ig_router_upstream_t *u, uint64_t now_ns)
{
    uint64_t seq = u->order_seq++;
    u->order_start_ns[seq % IG_ROUTER_ORDER_RING] = now_ns;
    u->order_end_ns[seq % IG_ROUTER_ORDER_RING] = 0;
    return seq;
}

/* How close two sends may be and still reach u in the other order. */
static uint64_t order_slack_ns(const ig_router_upstream_t *u)
{
    unsigned n = u->nprobe_rtt < 3 ? u->nprobe_rtt : 3;
    double lo = INFINITY, hi = 0;
    for (unsigned i = 0; i < n; i++) {
        lo = fmin(lo, u->probe_rtt[i]);
        hi = fmax(hi, u->probe_rtt[i]);
    }
    return ORDER_SLACK_NS + (n > 1 ? (uint64_t)((hi - lo) * 1e9) : 0);
}

/*
 * An upstream that runs C at once and queues the rest in order: an
 * attempt that began with rif others in flight waits in its queue until
 * rif + 1 - C of them have ended, so it ends after at least that many of
 * them. One that ended after only m of them shows that the upstream ran
 * at least rif + 1 - m at once. A batch slowdown makes the hold grow with
 * the requests in flight as a queue does, but not this: a short answer
 * still passes long ones that began before it. The bound is the most of
 * the current window and the previous one (ORDER_WINDOW_NS), so that a
 * concurrency that shrank (an upstream restarted with fewer slots) is
 * forgotten within two windows. Where it is not known whether an attempt
 * in flight at the start ended before this one (sent within the slack of
 * it, or no longer in the ring), it is taken as ended: the bound is only
 * ever lower than what the order shows.
 */
void ig_router_order_end(ig_router_upstream_t *u, uint64_t seq, int rif, int answered,
                         uint64_t now_ns)
{
    if (u->order_seq - seq > IG_ROUTER_ORDER_RING)
        return; /* its own entry is gone: nothing to read or mark */
    uint64_t start = u->order_start_ns[seq % IG_ROUTER_ORDER_RING];
    if (answered) {
        uint64_t slack = order_slack_ns(u);
        int seen = 0, ended = 0;
        for (uint64_t j = seq; seen < rif; j--) {
            if (j == 0 || u->order_seq - (j - 1) > IG_ROUTER_ORDER_RING) {
                ended += rif - seen;
                break;
            }
            uint64_t e = u->order_end_ns[(j - 1) % IG_ROUTER_ORDER_RING];
            if (e != 0 && e <= start)
                continue; /* it had ended before this one began */
            seen++;
            if (e != 0 || u->order_start_ns[(j - 1) % IG_ROUTER_ORDER_RING] + slack > start)
                ended++;
        }
        if (now_ns - u->order_window_ns >= ORDER_WINDOW_NS) {
            u->order_c_prev = now_ns - u->order_window_ns < 2 * ORDER_WINDOW_NS ? u->order_c : 0;
            u->order_c = 0;
            u->order_window_ns = now_ns;
        }
        u->order_c = fmax(u->order_c, rif + 1 - ended);
    }
    u->order_end_ns[seq % IG_ROUTER_ORDER_RING] = now_ns;
}

double ig_router_order_c(const ig_router_upstream_t *u, uint64_t now_ns)
{
    uint64_t age = now_ns - u->order_window_ns;
    if (age >= 2 * ORDER_WINDOW_NS)
        return 0;
    return age >= ORDER_WINDOW_NS ? u->order_c : fmax(u->order_c, u->order_c_prev);
}

/*
 * C from the hold times per RIF. With C places and service time s, an
 * attempt that began with k < C others in flight holds the upstream for
 * its base time b (s plus the round trip); one with k >= C also waits for
 * (k + 1 - C) of them to finish, s / C each:
 *
 *   hold(k) = b + x_k s,   x_k = max(0, k + 1 - C) / C
 *
 * For each C on a grid of quarters from 1 to the last bucket, b and s are
 * the weighted least-squares line of the buckets' holds on x_k, s kept
 * within 0.5-1.5x of the lowest bucket's hold less the RTT (fit_queue());
 * C, b and s are those of the best fit (weights: the inverse variance of
 * each bucket's mean, so errors are chi-square). A queue is believed only
 * when it fits clearly better than none (RIF_QUEUE_CHI2); else, and when
 * no bucket shows a queue, C is the smallest that sees none: what has been
 * seen, a lower bound. The last bucket (RIF beyond it) is left out.
 *
 * The same fit reads the times to first token (ig_router_observe_wait()),
 * with s the hold's service time (`expect` > 0): there a wait for a place
 * adds s / C a request ahead, and a batch slowdown only its share of the
 * prefill.
 */
static double fit_concurrency(rif_view_t v, double rtt_s, double expect, double c_min,
                              double *base_out, double *svc_out)
{
    int k0;
    double scale = base_hold(v, &k0); /* the lowest bucket's time */
    int last = IG_ROUTER_RIF_BUCKETS - 1;
    if (k0 < 0 && v.n[last] >= RIF_MIN_SAMPLES && v.mean[last] > 0) {
        /* Every attempt with enough samples began with `last` or more
         * others in flight (a wide upstream kept busy from its first
         * seconds): there is no bucket to fit (it would divide 0 by 0)
         * and no queue seen below, so C is at least `last + 1`, the lower
         * bound of what was seen. */
        *base_out = v.mean[last];
        *svc_out = 0;
        return last + 1;
    }
    if (k0 < 0 || scale <= 0)
        return 0;
    double best_c = 1, best_err = INFINITY, best_b = scale, best_s = 0;
    double flat_err = INFINITY, flat_b = scale;
    int top = k0;
    for (int k = k0; k < IG_ROUTER_RIF_BUCKETS - 1; k++)
        if (v.n[k] >= RIF_MIN_SAMPLES)
            top = k;
    double wk[IG_ROUTER_RIF_BUCKETS];
    fit_sums_t sums;
    bucket_weights(v, k0, scale, wk);
    fit_sums(v, k0, wk, &sums);
    int waits = expect > 0; /* the first tokens' fit, not the hold's */
    if (!waits)
        expect = fmax(scale - rtt_s, 0.25 * scale);
    /* No C below what the order of the answers shows (c_min). */
    double c_from = c_min > 1 ? fmin(floor(c_min), top + 1) : 1;
    for (double c = c_from; c <= IG_ROUTER_RIF_BUCKETS - 1; c += 0.25) {
        double base, slope;
        double err = fit_queue(&sums, c, expect, &base, &slope);
        if (c >= top + 1 && flat_err == INFINITY) {
            flat_err = err; /* the first C that sees no queue at all */
            flat_b = base;
        }
        if (err < best_err - 1e-9) {
            best_err = err;
            best_c = c;
            best_b = base;
            best_s = slope;
        }
        /* From C = top + 1 up every sampled bucket is below C: the model
         * is flat and its error the same for every larger C. */
        if (c >= top + 1)
            break;
    }
    /* A queue must show above the noise. The errors are chi-square (each
     * bucket's in units of its mean's variance), and the queue's fit has
     * two more parameters (C and s) than "no queue up to the highest
     * bucket", searched over a grid: it is believed only when it explains
     * RIF_QUEUE_CHI2 more (about p < 0.005 by chance). Too small a C makes
     * a lightly used upstream look busy, and the router then idles it; a
     * noisy fit took 16-wide upstreams for 1.75-wide (bench/routing-
     * foreign.sh) under the old rule (half a bucket's noise per bucket). */
    if (best_c < top + 1 && flat_err <= best_err + RIF_QUEUE_CHI2) {
        best_c = top + 1;
        best_b = flat_b;
        best_s = 0;
    }
    /* No C below top + 1 fitted better: the flat fit won outright, and its
     * slope is only the clamp's floor (every x_k is 0), not a queue's. The
     * first tokens' fit says so (slope 0: no queue seen). The hold's keeps
     * that floor, half its base less the RTT, as its service time: the same
     * rule for both put the TTFT p50 losses beyond the noise at 30 against
     * 19 on the design fleets (docs/routing.md, "Learned concurrency"). */
    if (best_c >= top + 1 && waits)
        best_s = 0;
    *base_out = best_b;
    *svc_out = best_s;
    return best_c;
}

static double learn_concurrency(const ig_router_upstream_t *u, double rtt_s, double c_min,
                                double *base_out, double *svc_out)
{
    return fit_concurrency(holds_of(u), rtt_s, 0, c_min, base_out, svc_out);
}

double ig_router_concurrency(const ig_router_upstream_t *u)
{
    if (u->slots > 0)
        return u->slots;
    double c = u->concurrency >= 1 ? u->concurrency : 1;
    return u->wait_c >= 1 && u->wait_c < c ? u->wait_c : c;
}

/* The hold's fitted service time: the fit's s where it saw a queue or
 * the flat fit won outright (there, the clamp's floor), else its base
 * hold less the round trip; 0 before any fit. */
static double fitted_hold(const ig_router_t *r, const ig_router_upstream_t *u)
{
    double base = u->hold_base_s;
    if (u->hold_svc_s > 0)
        return u->hold_svc_s;
    return base > 0 ? fmax(base - rtt_of(r, u), 0.25 * base) : 0.0;
}

/* How long a request holds one of the upstream's C places: the fitted
 * hold, else the mean occupancy, else the service time to first token. */
static double hold_of(const ig_router_t *r, const ig_router_upstream_t *u)
{
    double fitted = fitted_hold(r, u);
    if (fitted > 0)
        return fitted;
    if (u->occupancy_s > 0)
        return u->occupancy_s;
    return u->svc_samples > 0 ? u->svc_s : 0.0;
}

double ig_router_wait(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns)
{
    double reported_wait = 0.0;
    double queued = 0.0;
    if (report_fresh(r, u, now_ns)) {
        reported_wait = reported_wait_of(u, now_ns);
        queued = u->reported_waiting;
    }
    /*
     * The requests ahead of a new one. The upstream's reported queue already
     * holds those of ours that wait there, so the two are not added: the
     * larger is believed (the report may include other clients' requests,
     * ours may be newer than the report).
     */
    double wait;
    if (u->slots > 0) {
        double occupancy = u->occupancy_s > 0 ? u->occupancy_s : 0.0;
        double ahead = fmax(queued, (double)u->inflight - u->slots + 1);
        wait = fmax(ahead, 0.0) * occupancy / u->slots;
    } else {
        /* No slot count: the learned concurrency C (1 until learned, which
         * errs toward spreading) and the learned hold time. */
        double c = ig_router_concurrency(u);
        double ahead = fmax(queued, (double)u->inflight - c + 1);
        wait = fmax(ahead, 0.0) * hold_of(r, u) / c;
    }
    return fmax(wait, reported_wait);
}

double ig_router_predicted_wait(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                                int ahead, uint64_t now_ns)
{
    double best = -1, rate = 0;
    for (int i = 0; i < n; i++) {
        const ig_router_upstream_t *u = ups[i];
        if (!ig_router_eligible(u, now_ns))
            continue;
        double w = ig_router_wait(r, u, now_ns);
        if (best < 0 || w < best)
            best = w;
        double hold = u->occupancy_s > 0 ? u->occupancy_s : u->svc_s;
        if (hold > 0)
            rate += (u->slots > 0 ? u->slots : 1) / hold;
    }
    if (best >= 0 && ahead > 0) {
        if (rate <= 0)
            return -1;
        best += ahead / rate;
    }
    return best;
}

/* The service time of a whole answer: its unqueued hold, the fit's base b
 * (else the mean occupancy), less the round trip; 0 before any. An
 * upstream that has served only whole answers has no time to first token
 * (the proxy measures it at a stream's first content token; a whole
 * answer's TTFT is its end), so this is what a new request's own time
 * there is: the prompt's share of it is not known (mostly it is the
 * output), so it is not scaled by the prompt. */
static double whole_of(const ig_router_t *r, const ig_router_upstream_t *u)
{
    double hold = u->hold_base_s > 0 ? u->hold_base_s : u->occupancy_s;
    if (!(hold > 0))
        return 0;
    return fmax(hold - rtt_of(r, u), 0.25 * hold);
}

/* A fixed overhead worth this many prompt tokens is assumed when scaling an
 * observed service time to another prompt length. */
#define OVERHEAD_TOKENS 32.0

/* An upstream's service time per prompt token (overhead included), as its
 * samples say; 0 before any. */
static double svc_unit(const ig_router_upstream_t *u)
{
    return u->svc_samples > 0 ? u->svc_s / (u->svc_tokens + OVERHEAD_TOKENS) : 0;
}

/* The prefill of the prompt's uncached part on u: its own samples scaled to
 * the prompt; before any, at the prefill rate it reports, else at its
 * peers' median service per token (peer_unit, 0 = none: the others serve
 * the same model, so a new one is neither free nor avoided), else at the
 * prior rate. A worker reports no rate before its first prefill, so the
 * prior alone, where it is slower than the peers' measure, kept every
 * request off a worker never sent one, and nothing else would ever
 * measure it (docs/routing.md, "The latency pick"). */
static double prefill_of(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                         double peer_unit, uint64_t now_ns)
{
    double p = prompt_tokens > 0 ? prompt_tokens : 0;
    if (u->cached_tokens > 0) /* only what is not cached is prefilled */
        p = p > u->cached_tokens ? p - u->cached_tokens : 1;
    if (u->svc_samples > 0)
        return svc_unit(u) * (p + OVERHEAD_TOKENS);
    double own = 0;
    if (report_fresh(r, u, now_ns) && u->reported_prefill_tps > 0)
        own = p / u->reported_prefill_tps;
    else if (peer_unit > 0)
        own = peer_unit * (p + OVERHEAD_TOKENS);
    else
        own = p / r->opts.prior_prefill_tps;
    /* A whole answer's time is its hold, and at least the prompt's prefill
     * at the believed rate (the hold may be of shorter prompts). Where part
     * of the prompt is cached the hold does not say how much of it that
     * saves, so the uncached part is priced at that rate, as for an
     * upstream not yet measured: a prefix's affinity is what it was
     * (test_gateway_prefix). */
    double whole = u->cached_tokens > 0 ? 0 : whole_of(r, u);
    return fmax(whole, own);
}

double ig_router_cost(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                      uint64_t now_ns)
{
    return rtt_of(r, u) + ig_router_wait(r, u, now_ns) + prefill_of(r, u, prompt_tokens, 0, now_ns);
}

/* One service sample's standard deviation, scaled to the prompt as the
 * mean is (prefill is prefill_of()'s): 1.25 x the learned mean absolute
 * deviation; 0 before any sample. */
static double svc_sd(const ig_router_upstream_t *u, double prefill)
{
    return u->svc_samples > 0 && u->svc_s > 0 ? 1.25 * u->svc_dev_s * prefill / u->svc_s : 0;
}

/*
 * The standard deviation of the predicted TTFT, in seconds. The service's:
 * 1.25 x its mean absolute deviation (the ratio of the two for a normal;
 * for an exponential 1.25 x 0.74 s = 0.92 s), scaled to the prompt as the
 * mean is. The wait's: `wait` is ahead x step, ahead departures of one
 * every step = hold / C (occupancy / slots where slots are reported), each
 * gap exponential, so its variance is ahead x step^2 = wait x step.
 */
static double spread_of(const ig_router_t *r, const ig_router_upstream_t *u, double wait,
                        double prefill)
{
    double svc = svc_sd(u, prefill);
    double step = u->slots > 0 ? fmax(u->occupancy_s, 0.0) / u->slots
                               : hold_of(r, u) / ig_router_concurrency(u);
    return sqrt(svc * svc + wait * step);
}

/* How long one more request in flight adds to u's queue: the time one
 * of its C places is held, over C (occupancy / slots where slots are
 * reported); 0 until u's C is learned (a time to first token is not a
 * hold, and the prior C of 1 would make a wide upstream look 64 times as
 * slow as it is: the steps of all upstreams must be alike). */
static double step_of(const ig_router_t *r, const ig_router_upstream_t *u)
{
    if (u->slots > 0)
        return fmax(u->occupancy_s, 0.0) / u->slots;
    if (u->concurrency <= 0 || (u->hold_svc_s <= 0 && u->hold_base_s <= 0))
        return 0; /* C or the hold not learned yet: the prior C of 1 would make it look slow */
    return hold_of(r, u) / ig_router_concurrency(u);
}

double ig_router_delay(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns)
{
    double step = step_of(r, u);
    if (!(step > 0))
        return 0;
    double n = u->inflight;
    if (report_fresh(r, u, now_ns) && u->reported_waiting > 0)
        n = fmax(n, ig_router_concurrency(u) + u->reported_waiting);
    return rtt_of(r, u) + (n + 1) * step + (u->svc_samples > 0 ? u->svc_s : whole_of(r, u));
}

int ig_router_would_queue(const ig_router_upstream_t *u)
{
    if (u->slots <= 0 && !(u->hold_svc_s > 0) && !(u->wait_c >= 1))
        return 0; /* a lower bound whose queue failed the test (a flat fit that won
                   * outright keeps a service time, and counts: docs/routing.md) */
    return u->inflight >= ig_router_concurrency(u);
}

/*
 * What the latency pick ranks by: the shortest expected delay (SED),
 *
 *   rtt + (n + 1) x step + prefill (+ tail_weight x spread)
 *
 * n the requests ahead of a new one (ours in flight, or, when it reports
 * a queue, its C places and that queue), step = step_of(): every request in
 * flight counts, not only those beyond C. Below C that is the slowdown a
 * batching engine shows as its batch grows, and the share of its capacity
 * the request takes; among equal upstreams it is join-the-shortest-queue,
 * and among unequal ones it weighs each by its measured speed. The queue
 * beyond C alone (rtt + w x wait + prefill, w = 2-8) herded requests onto
 * the upstream with the least RTT until it was full: on 60 random fleets x
 * 3 loads (bench/routing-sim, docs/routing.md) the TTFT p99 was over 1.1x
 * the best baseline in 37 cells with it and 20 with SED; weighing SED's
 * queue 0.5x or 2x gave 24 and 23, so it has no weight. An upstream with no
 * sample yet takes the median step and service per token of the others
 * (ig_route_peers_t): a new one is neither free nor avoided.
 */
void ig_router_terms(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                     const ig_route_peers_t *peers, uint64_t now_ns, ig_route_terms_t *t)
{
    double step = step_of(r, u);
    if (!(step > 0))
        step = peers->step_s;
    double n = u->inflight;
    t->fresh = report_fresh(r, u, now_ns);
    t->report_age_s = u->reported_at_ns ? seconds_between(u->reported_at_ns, now_ns) : -1;
    t->reported_wait_s = u->reported_wait_s;
    t->aged_wait_s = reported_wait_of(u, now_ns);
    t->reported_waiting = u->reported_waiting;
    if (t->fresh && u->reported_waiting > 0)
        n = fmax(n, ig_router_concurrency(u) + u->reported_waiting);
    t->step_s = step;
    t->queue_s = (n + 1) * step;
    if (t->fresh)
        t->queue_s = fmax(t->queue_s, t->aged_wait_s);
    t->prefill_s = prefill_of(r, u, prompt_tokens, peers->svc_unit_s, now_ns);
    t->cost_s = rtt_of(r, u) + t->queue_s + t->prefill_s;
    if (r->opts.tail_weight > 0)
        t->cost_s +=
            r->opts.tail_weight * spread_of(r, u, ig_router_wait(r, u, now_ns), t->prefill_s);
}

static double ranked_cost(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                          const ig_route_peers_t *peers, uint64_t now_ns)
{
    ig_route_terms_t t;
    ig_router_terms(r, u, prompt_tokens, peers, now_ns, &t);
    return t.cost_s;
}

double ig_router_hedge_delay(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                             double quantile, uint64_t now_ns)
{
    if (!(quantile > 0.5 && quantile < 1.0))
        quantile = 0.95;
    /* The standard normal quantile through the logistic approximation,
     * within 3% of the exact z for 0.6 <= q <= 0.99. */
    double z = 0.5513 * log(quantile / (1.0 - quantile));
    return ig_router_cost(r, u, prompt_tokens, now_ns) + z * 1.25 * u->svc_dev_s;
}

/*
 * How far apart two ranked costs must be to say which upstream is faster:
 * the standard error of the difference of two service estimates like u's.
 * svc_s is an EWMA of weight a, so its variance is a / (2 - a) of one
 * sample's (1.25 x the mean absolute deviation estimates that sample's
 * spread), twice for a difference. On the fleet three 4-slot 20 ms
 * upstreams' estimates (a = 1/32-1/8) differ by 2-5 ms of noise alone, so
 * the pick among them went by noise, not by load.
 */
static double cost_noise(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                         uint64_t now_ns)
{
    double a = u->svc_weight;
    return svc_sd(u, prefill_of(r, u, prompt_tokens, 0, now_ns)) * sqrt(2.0 * a / (2.0 - a));
}

/* ---- eligibility and the pick ------------------------------------------- */

int ig_router_eligible(const ig_router_upstream_t *u, uint64_t now_ns)
{
    if (!u->ready || u->draining)
        return 0;
    if (u->ejected_until_ns != 0) {
        if (now_ns < u->ejected_until_ns)
            return 0;
        return !u->half_open; /* one trial at a time */
    }
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Ours in flight. */
static double rif_of(const ig_router_upstream_t *u)
{
    return u->inflight;
}

/* In flight over concurrency: what the hot/cold guard compares. */
static double utilisation(const ig_router_upstream_t *u)
{
    return rif_of(u) / ig_router_concurrency(u);
}

/*
 * Hot/cold: candidate i is hot when its utilisation (in flight / C) is
 * above the hot_quantile of the OTHER candidates' (nearest rank). `sorted`
 * holds every candidate's in ascending order; removing one copy of i's own
 * from it gives the others.
 */
static int is_hot(const ig_router_t *r, const double *sorted, int ncand, double own, double slack)
{
    int nothers = ncand - 1;
    if (nothers < 1)
        return 0;
    int k = (int)ceil(r->opts.hot_quantile * nothers) - 1;
    if (k < 0)
        k = 0;
    int p = 0; /* position of the first copy of own */
    while (p < ncand && sorted[p] < own)
        p++;
    double t = k < p ? sorted[k] : sorted[k + 1];
    return own > t + slack + 1e-9;
}

/* A candidate that holds part of the prompt (cached_tokens > 0) is hot only
 * this many in-flight requests (over its concurrency, in utilisation) above
 * the others' quantile: spilling throws
 * its cached prefix away (SGLang's router likewise balances only past a load
 * gap), and its cost already counts its queue. */
#define WARM_HOT_SLACK 2

/*
 * The candidate to explore, or -1: the eligible idle one whose last
 * service sample is the oldest, older than IG_ROUTER_EXPLORE_AFTER_S, when
 * the budget holds a token. An upstream whose estimate is high for want
 * of fresh samples (a few slow answers while it calibrated, or a slowdown
 * that has passed) loses every pick, and only traffic would bring the
 * estimate down (the shift fleet's s2 took 11 of 3,000 requests in a run
 * while the others queued 6-8 deep on 4 slots). One request per stale upstream per interval, and
 * at most explore_ratio of all, keeps what a truly slow one costs small.
 * An upstream never sampled is ranked by the priors and needs no help.
 */
static int explore_pick(ig_router_t *r, ig_router_upstream_t *const *ups, const int *cand,
                        int ncand, uint64_t now_ns)
{
    if (r->opts.explore_ratio <= 0)
        return -1;
    r->explore_tokens = fmin(r->explore_tokens + r->opts.explore_ratio, 1.0);
    if (r->explore_tokens < 1.0 || ncand < 2)
        return -1;
    int best = -1;
    for (int j = 0; j < ncand; j++) {
        const ig_router_upstream_t *u = ups[cand[j]];
        if (u->inflight > 0 || u->svc_samples == 0 ||
            seconds_between(u->svc_at_ns, now_ns) <= IG_ROUTER_EXPLORE_AFTER_S)
            continue;
        if (best < 0 || u->svc_at_ns < ups[best]->svc_at_ns)
            best = cand[j];
    }
    if (best >= 0) {
        r->explore_tokens -= 1.0;
        r->explorations++;
    }
    return best;
}

/* Costs within the noise of the cheapest's estimate are a tie, and a tie
 * goes to the least utilised: among equal upstreams that is
 * join-the-shortest-queue, which least_inflight does and the noise did
 * not. Then the runner-up is the cheapest of the others. Returns the
 * pick. */
static int break_ties(const ig_router_t *r, ig_router_upstream_t *const *ups, const int *cand,
                      int ncand, const double *cost, int start, int best, double best_cost,
                      int prompt_tokens, uint64_t now_ns, int *second, double *second_cost)
{
    double band = best_cost + cost_noise(r, ups[best], prompt_tokens, now_ns);
    for (int k = 0; k < ncand; k++) {
        int j = (start + k) % ncand;
        if (cost[j] <= band && utilisation(ups[cand[j]]) < utilisation(ups[best]))
            best = cand[j];
    }
    for (int j = 0; j < ncand; j++)
        if (cand[j] != best && cost[j] < *second_cost) {
            *second = cand[j];
            *second_cost = cost[j];
        }
    return best;
}

/* The median of v[0 .. n) (sorts it); 0 when n is 0. */
static double median_of(double *v, int n)
{
    qsort(v, n, sizeof(double), cmp_double);
    return n > 0 ? v[n / 2] : 0.0;
}

/* The candidates' median step and service per token, of those that have
 * one, for those that have none; tmp holds ncand doubles. */
static void peers_of(const ig_router_t *r, ig_router_upstream_t *const *ups, const int *cand,
                     int ncand, double *tmp, ig_route_peers_t *out)
{
    int k = 0;
    for (int j = 0; j < ncand; j++) {
        double st = step_of(r, ups[cand[j]]);
        if (st > 0)
            tmp[k++] = st;
    }
    out->step_s = median_of(tmp, k);
    k = 0;
    for (int j = 0; j < ncand; j++) {
        double su = svc_unit(ups[cand[j]]);
        if (su > 0)
            tmp[k++] = su;
    }
    out->svc_unit_s = median_of(tmp, k);
}

void ig_router_peers(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                     const unsigned char *exclude, uint64_t now_ns, ig_route_peers_t *out)
{
    int stack_i[64] = {0}; /* (gcc cannot see that peers_of reads only ncand) */
    double stack_d[64];
    int *cand = n <= 64 ? stack_i : malloc(sizeof(int) * n);
    double *tmp = n <= 64 ? stack_d : malloc(sizeof(double) * n);
    int ncand = 0;
    out->step_s = out->svc_unit_s = 0;
    if (cand != NULL && tmp != NULL) {
        for (int i = 0; i < n; i++)
            if ((exclude == NULL || !exclude[i]) && ig_router_eligible(ups[i], now_ns))
                cand[ncand++] = i;
        peers_of(r, ups, cand, ncand, tmp, out);
    }
    if (cand != stack_i)
        free(cand);
    if (tmp != stack_d)
        free(tmp);
}

/*
 * A free place that is known beats a queue that is known. When the pick
 * would queue the request (as many of ours in flight as its reported
 * slots, or as a C at which its first tokens showed a queue) and a
 * candidate that reports its slots has one free and no queue, the
 * cheapest such candidate by its cost without a queue term takes the
 * request, if that is below the pick's whole cost. SED charges every
 * request in flight a whole step (hold / C), so the free places of a
 * wide upstream can price above a place in the queue of a narrow one,
 * though a request there starts at once: on fleet 27 (a 4-slot upstream
 * without `/load` beside a 32-slot one with it) the latency policy kept
 * the narrow one full and its queue held every answer of the TTFT tail.
 * A queue read from the holds alone is not believed here: a batch
 * slowdown reads as one there, and trusting it sent requests away from
 * 64-slot upstreams that had room (docs/routing.md, "The latency pick",
 * rule 6). Returns the new pick, or -1 to keep it; *spared_cost is then
 * the kept pick's ranked cost.
 */
static int free_place_over_queue(const ig_router_t *r, ig_router_upstream_t *const *ups,
                                 const int *cand, int ncand, int best, int prompt_tokens,
                                 const ig_route_peers_t *peers, uint64_t now_ns,
                                 double *spared_cost)
{
    const ig_router_upstream_t *b = ups[best];
    if (!ig_router_would_queue(b) || !(b->slots > 0 || b->wait_c >= 1))
        return -1;
    ig_route_terms_t t;
    ig_router_terms(r, b, prompt_tokens, peers, now_ns, &t);
    double limit = t.cost_s, least = INFINITY;
    int pick = -1;
    for (int j = 0; j < ncand; j++) {
        const ig_router_upstream_t *u = ups[cand[j]];
        if (u->slots <= 0 || u->inflight >= u->slots ||
            (report_fresh(r, u, now_ns) && u->reported_waiting > 0))
            continue;
        ig_router_terms(r, u, prompt_tokens, peers, now_ns, &t);
        double c = t.cost_s - t.queue_s;
        if (c < limit && c < least) {
            least = c;
            pick = cand[j];
        }
    }
    *spared_cost = limit;
    return pick;
}

/* The latency policy's pick among the candidates (indexes into ups): the
 * cheapest by ranked cost that is not hot, ties within the cost's noise to
 * the least utilised; when every one is hot, the least utilised (out->hot).
 * The runner-up and its cost in *second_out; IG_ENOMEM. */
static int latency_pick(ig_router_t *r, ig_router_upstream_t *const *ups, const int *cand,
                        int ncand, int prompt_tokens, uint64_t now_ns, ig_route_decision_t *out,
                        int *second_out, double *second_cost_out)
{
    int best = -1, second = -1;
    double best_cost = INFINITY, second_cost = INFINITY;
    /* Two sorted lists: utilisation, and raw requests in flight. An
     * upstream is hot only when it is above the others by both: by
     * utilisation alone a 1-wide upstream with 1 in flight is hot
     * beside 16-wide ones at 4 (it would only be tried when idle,
     * where least_inflight's raw counts give it more); by raw counts
     * alone an 8-wide one at 3 beside 1-wide ones at 1. */
    double stack_u[32], stack_r[32], stack_c[32];
    double *sorted = ncand <= 32 ? stack_u : malloc(sizeof(double) * ncand);
    double *sorted_rif = ncand <= 32 ? stack_r : malloc(sizeof(double) * ncand);
    double *cost = ncand <= 32 ? stack_c : malloc(sizeof(double) * ncand);
    if (sorted == NULL || sorted_rif == NULL || cost == NULL) {
        if (sorted != stack_u) {
            free(sorted);
            free(sorted_rif);
            free(cost);
        }
        return IG_ENOMEM;
    }
    for (int j = 0; j < ncand; j++) {
        sorted[j] = utilisation(ups[cand[j]]);
        sorted_rif[j] = rif_of(ups[cand[j]]);
    }
    qsort(sorted, ncand, sizeof(double), cmp_double);
    qsort(sorted_rif, ncand, sizeof(double), cmp_double);
    ig_route_peers_t peers;
    peers_of(r, ups, cand, ncand, cost, &peers);
    /* Equal costs go to the first in an order that rotates with each
     * decision, as least_inflight's ties do: a fixed order put a third
     * more of a fleet of equal upstreams' traffic on the first. */
    int start = (int)(r->rr_next++ % (uint64_t)ncand);
    int least = -1;
    for (int k = 0; k < ncand; k++) {
        int j = (start + k) % ncand;
        int i = cand[j];
        cost[j] = INFINITY; /* hot: not a candidate */
        if (least < 0 || utilisation(ups[i]) < utilisation(ups[least]))
            least = i;
        int warm = ups[i]->cached_tokens > 0;
        if (is_hot(r, sorted, ncand, utilisation(ups[i]),
                   warm ? WARM_HOT_SLACK / ig_router_concurrency(ups[i]) : 0) &&
            is_hot(r, sorted_rif, ncand, rif_of(ups[i]), warm ? WARM_HOT_SLACK : 0))
            continue;
        cost[j] = ranked_cost(r, ups[i], prompt_tokens, &peers, now_ns);
        if (cost[j] < best_cost) {
            best = i;
            best_cost = cost[j];
        }
    }
    if (best >= 0) {
        best = break_ties(r, ups, cand, ncand, cost, start, best, best_cost, prompt_tokens, now_ns,
                          &second, &second_cost);
        double spared_cost;
        int place = free_place_over_queue(r, ups, cand, ncand, best, prompt_tokens, &peers, now_ns,
                                          &spared_cost);
        if (place >= 0) {
            second = best; /* the runner-up is the queue it was spared */
            second_cost = spared_cost;
            best = place;
        }
    }
    if (sorted != stack_u) {
        free(sorted);
        free(sorted_rif);
        free(cost);
    }
    if (best < 0) {
        best = least;
        out->hot = 1;
    }
    *second_out = second;
    *second_cost_out = second_cost;
    return best;
}

/* Fills out for the chosen upstream; the runner-up, when the pick named
 * none, is the cheapest other candidate, for the route header. */
static void report(const ig_router_t *r, ig_router_upstream_t *const *ups, const int *cand,
                   int ncand, int prompt_tokens, uint64_t now_ns, int best, int second,
                   double second_cost, ig_route_decision_t *out)
{
    out->chosen = best;
    out->cost_s = ig_router_cost(r, ups[best], prompt_tokens, now_ns);
    if (second < 0) {
        /* Name the cheapest other candidate as the runner-up for the header. */
        for (int j = 0; j < ncand; j++) {
            int i = cand[j];
            if (i == best)
                continue;
            double c = ig_router_cost(r, ups[i], prompt_tokens, now_ns);
            if (c < second_cost) {
                second = i;
                second_cost = c;
            }
        }
    }
    out->runner_up = second;
    /* The latency pick ranks by the weighted cost; both report the plain
     * predicted TTFT. */
    out->runner_up_cost_s = second >= 0 ? ig_router_cost(r, ups[second], prompt_tokens, now_ns) : 0;
    out->wait_s = ig_router_wait(r, ups[best], now_ns);
    out->concurrency = ig_router_concurrency(ups[best]);
    out->runner_up_wait_s = second >= 0 ? ig_router_wait(r, ups[second], now_ns) : 0;
    out->runner_up_concurrency = second >= 0 ? ig_router_concurrency(ups[second]) : 0;
}

int ig_router_pick(ig_router_t *r, ig_router_upstream_t *const *ups, int n, int prompt_tokens,
                   const unsigned char *exclude, uint64_t now_ns, ig_route_decision_t *out)
{
    int stack[64];
    int *cand = n <= 64 ? stack : malloc(sizeof(int) * n);
    int ncand = 0;
    int rc = IG_ENOUPSTREAM;
    if (cand == NULL)
        return IG_ENOMEM;
    for (int i = 0; i < n; i++) {
        if ((exclude == NULL || !exclude[i]) && ig_router_eligible(ups[i], now_ns))
            cand[ncand++] = i;
    }
    if (ncand == 0)
        goto done;

    out->chosen = -1;
    out->runner_up = -1;
    out->cost_s = out->runner_up_cost_s = 0;
    out->hot = 0;
    out->explored = 0;
    int best = -1, second = -1;
    double second_cost = INFINITY;

    switch (r->opts.policy) {
    case IG_ROUTE_ROUND_ROBIN:
        best = cand[r->rr_next++ % (uint64_t)ncand];
        break;
    case IG_ROUTE_RANDOM:
        best = cand[next_rand(r) % (uint64_t)ncand];
        break;
    case IG_ROUTE_LEAST_INFLIGHT: {
        /* Ties go round robin so equal upstreams share the load. */
        int start = (int)(r->rr_next++ % (uint64_t)ncand);
        for (int j = 0; j < ncand; j++) {
            int i = cand[(start + j) % ncand];
            if (best < 0 || ups[i]->inflight < ups[best]->inflight)
                best = i;
        }
        break;
    }
    case IG_ROUTE_LATENCY:
        if ((best = explore_pick(r, ups, cand, ncand, now_ns)) >= 0) {
            out->explored = 1;
            break;
        }
        best = latency_pick(r, ups, cand, ncand, prompt_tokens, now_ns, out, &second, &second_cost);
        if (best < 0) {
            rc = best;
            goto done;
        }
        break;
    }

    report(r, ups, cand, ncand, prompt_tokens, now_ns, best, second, second_cost, out);
    rc = 0;
done:
    if (cand != stack)
        free(cand);
    return rc;
}

/* ---- observations -------------------------------------------------------- */

/* Weight of the old average after dt seconds. */
static double decay(const ig_router_t *r, uint64_t then_ns, uint64_t now_ns)
{
    if (then_ns == 0)
        return 0.0;
    double tau = r != NULL ? r->opts.ewma_tau_s : 10.0;
    return exp(-seconds_between(then_ns, now_ns) / tau);
}

void ig_router_observe_rtt(const ig_router_t *r, ig_router_upstream_t *u, double rtt_s,
                           uint64_t now_ns)
{
    if (!(rtt_s >= 0))
        return;
    if (u->rtt_at_ns == 0 || rtt_s > u->rtt_s) {
        u->rtt_s = rtt_s; /* peak: a slower sample takes over at once */
    } else {
        double w = decay(r, u->rtt_at_ns, now_ns);
        u->rtt_s = u->rtt_s * w + rtt_s * (1 - w);
    }
    u->rtt_at_ns = now_ns;
}

void ig_router_observe_probe_rtt(const ig_router_t *r, ig_router_upstream_t *u, double rtt_s,
                                 uint64_t now_ns)
{
    /* The median of the last three probes: one probe delayed by a scheduling
     * hiccup does not become the peak that a peak-EWMA holds for seconds. */
    u->probe_rtt[u->nprobe_rtt++ % 3] = rtt_s;
    if (u->nprobe_rtt < 3) {
        ig_router_observe_rtt(r, u, rtt_s, now_ns);
        return;
    }
    double a = u->probe_rtt[0], b = u->probe_rtt[1], c = u->probe_rtt[2];
    double median = fmax(fmin(a, b), fmin(fmax(a, b), c));
    ig_router_observe_rtt(r, u, median, now_ns);
}

/* The service time a TTFT shows: less the round trip and the predicted
 * wait. The predicted wait may be overstated; it is never believed to
 * explain more than three quarters of what was observed, so the learned
 * service time cannot collapse to nothing and make a slow upstream look
 * free. */
static double service_seen(const ig_router_t *r, const ig_router_upstream_t *u, double ttft_s,
                           double predicted_wait_s)
{
    double seen = fmax(ttft_s - rtt_of(r, u), 0.0);
    return fmax(seen - predicted_wait_s, 0.25 * seen);
}

void ig_router_observe_ttft(ig_router_t *r, ig_router_upstream_t *u, int prompt_tokens,
                            double ttft_s, double predicted_wait_s, uint64_t now_ns)
{
    double svc = service_seen(r, u, ttft_s, predicted_wait_s);
    double p = prompt_tokens > 0 ? prompt_tokens : 0;
    if (u->svc_samples == 0) {
        u->svc_s = svc;
        u->svc_tokens = p;
        u->svc_dev_s = svc / 2;
        u->svc_weight = 1.0;
    } else {
        /* Service samples come per request: the weight keeps the last 2 s
         * in view, but never fewer than the last 8 samples nor more than
         * the last 32. An exponential service's samples spread as wide as
         * their mean: over 8 of them the mean is off by a third, and at
         * 100 requests/s the latency policy chased that noise between
         * equal upstreams (least_inflight had the better p50 on fleets of
         * equal ones); 32 are off by a sixth and at that rate last 0.3 s. */
        double dt = seconds_between(u->svc_at_ns, now_ns);
        double a = fmin(0.125, fmax(1.0 / 32, 1.0 - exp(-dt / 2.0)));
        u->svc_dev_s += a * (fabs(svc - u->svc_s) - u->svc_dev_s);
        u->svc_s += a * (svc - u->svc_s);
        u->svc_tokens += a * (p - u->svc_tokens);
        u->svc_weight = a;
    }
    u->svc_samples++;
    u->svc_at_ns = now_ns;
}

/*
 * C from the times to first token. A hold is the answer's whole time, and
 * a batch slowdown stretches it as the batch grows much as a queue would:
 * the hold's fit needs a clear queue (RIF_QUEUE_CHI2) and, short of one,
 * takes C as the least that shows none, a lower bound. A 1-slot upstream
 * the policy seldom sends a second request was so learned as C = 2 or
 * more (1.36 in the geometric mean over the simulator's design fleets).
 * At the first token a wait for a place is a step of the answer's service
 * time over C, and a batch slowdown only stretches the prefill: a queue
 * seen there (the same fit and test, its slope the hold's service time)
 * lowers C. The hold's C is kept where the first tokens show none: the
 * hold's queue may be a slowdown or a queue the first tokens have not
 * shown (docs/routing.md, "Learned concurrency").
 */
void ig_router_observe_wait(ig_router_t *r, ig_router_upstream_t *u, int rif, double ttft_s,
                            uint64_t now_ns)
{
    if (u->slots > 0 || !(ttft_s >= 0))
        return;
    int k = rif < 0 ? 0 : rif >= IG_ROUTER_RIF_BUCKETS ? IG_ROUTER_RIF_BUCKETS - 1 : rif;
    rif_add(u->wait_rif_s, u->wait_rif_sq_s2, u->wait_rif_n, k, ttft_s);
    if ((++u->wait_samples & 7) != 1 || now_ns - u->wait_fit_at_ns < RIF_FIT_EVERY_NS)
        return; /* as the hold's fit: every 8th sample, not more often than that */
    double svc = fitted_hold(r, u);
    if (!(svc > 0))
        return; /* no hold learned yet: nothing to scale a wait by */
    double base, slope;
    double c = fit_concurrency(firsts_of(u), 0, svc, ig_router_order_c(u, now_ns), &base, &slope);
    u->wait_c = slope > 0 ? c : 0;
    u->wait_fit_at_ns = now_ns;
}

/*
 * A lower bound is a sample only where it says more than the estimate: an
 * upstream never measured is priced at its peers' service (prefill_of());
 * when its attempts lose every race to a hedge elsewhere they are
 * cancelled before a first token, it is never measured, and it stays the
 * cheapest pick while every request pays a hedge. The bound is below the
 * truth, so it moves the estimate toward it and never past.
 */
void ig_router_observe_ttft_above(ig_router_t *r, ig_router_upstream_t *u, int prompt_tokens,
                                  double elapsed_s, double predicted_wait_s, uint64_t now_ns)
{
    double p = prompt_tokens > 0 ? prompt_tokens : 0;
    double believed = u->svc_samples > 0 ? svc_unit(u) * (p + OVERHEAD_TOKENS) : 0;
    if (service_seen(r, u, elapsed_s, predicted_wait_s) > believed)
        ig_router_observe_ttft(r, u, prompt_tokens, elapsed_s, predicted_wait_s, now_ns);
}

void ig_router_observe_occupancy(ig_router_t *r, ig_router_upstream_t *u, double seconds,
                                 uint64_t now_ns)
{
    (void)r;
    (void)now_ns;
    if (u->occupancy_s <= 0)
        u->occupancy_s = seconds;
    else
        u->occupancy_s += 0.125 * (seconds - u->occupancy_s);
}

void ig_router_observe_done(ig_router_t *r, ig_router_upstream_t *u, int rif, double seconds,
                            uint64_t now_ns)
{
    u->done_at_ns = now_ns;
    ig_router_observe_occupancy(r, u, seconds, now_ns);
    if (!(seconds >= 0))
        return;
    int k = rif < 0 ? 0 : rif >= IG_ROUTER_RIF_BUCKETS ? IG_ROUTER_RIF_BUCKETS - 1 : rif;
    /* Buckets the limit keeps out (an attempt begins with at most limit - 1
     * others in flight) that had no sample for RIF_STALE_S are forgotten:
     * what they recorded can no longer be checked. A machine-wide slowdown
     * makes holds rise with the in-flight count as a queue would; the fit
     * took it for a small C, the limit shrank, and without this the
     * buckets above it kept that "queue" for good, and C and the limit
     * stayed low (test_router_learn). Buckets within the limit are kept,
     * sampled or not: less traffic is not evidence. */
    int reach = ig_router_limit(r, u);
    for (int j = reach; j < IG_ROUTER_RIF_BUCKETS; j++)
        if (u->rif_n[j] > 0 && seconds_between(u->rif_at_ns[j], now_ns) > RIF_STALE_S)
            u->rif_n[j] = u->wait_rif_n[j] = 0; /* the first tokens of the same attempts too */
    u->rif_at_ns[k] = now_ns;
    rif_add(u->rif_hold_s, u->rif_sq_s2, u->rif_n, k, seconds);
    /* The fit costs a few thousand operations, and the means it reads move
     * little from one sample to the next: every 8th sample, and no more
     * often than RIF_FIT_EVERY_NS, which binds only past 4,000 answers a
     * second from one upstream (a proxy benchmark's echo server; no
     * fleet of the simulator's reaches it). */
    if (((++u->rif_samples & 7) == 1 && now_ns - u->fit_at_ns >= RIF_FIT_EVERY_NS) ||
        u->concurrency <= 0) {
        u->concurrency = learn_concurrency(u, rtt_of(r, u), ig_router_order_c(u, now_ns),
                                           &u->hold_base_s, &u->hold_svc_s);
        u->fit_at_ns = now_ns;
    }
}

int ig_router_probe_due(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns)
{
    double every = r->opts.rtt_probe_s;
    if (!(every > 0) || !u->ready || u->slots > 0 || report_fresh(r, u, now_ns))
        return 0;
    if (u->done_at_ns != 0 && seconds_between(u->done_at_ns, now_ns) < every)
        return 0; /* real traffic: its hold times are fresh */
    return u->rtt_at_ns == 0 || seconds_between(u->rtt_at_ns, now_ns) >= every;
}

/* ---- the adaptive concurrency limit ---------------------------------------- */

/* 1 while the baseline is not known: the hold time of attempts that began
 * with nothing else of ours in flight (RIF bucket 0). Like Envoy's minRTT
 * measurement, the limit is then pinned to one attempt at a time until
 * that bucket has its samples; an upstream that is sometimes idle fills it
 * on its own. */
static int calibrating(const ig_router_upstream_t *u)
{
    return u->slots <= 0 && u->rif_n[0] < RIF_MIN_SAMPLES;
}

static double limit_now(const ig_router_t *r, const ig_router_upstream_t *u)
{
    if (calibrating(u))
        return 1;
    return u->limit > 0 ? u->limit : r->opts.limit_initial;
}

int ig_router_limit(const ig_router_t *r, const ig_router_upstream_t *u)
{
    if (r->opts.limit_max <= 0)
        return INT32_MAX;
    double l = floor(limit_now(r, u));
    if (l < r->opts.limit_min)
        l = r->opts.limit_min;
    /* An upstream that reports its slots keeps what the proxy always gave
     * it, twice those (its own queue holds the rest); the learned limit is
     * for those that report nothing. */
    if (u->slots > 0 && l < 2.0 * u->slots)
        l = 2.0 * u->slots;
    return l < 1 ? 1 : (int)l;
}

static void limit_set(ig_router_upstream_t *u, double limit, const char *reason)
{
    if (floor(limit) != floor(u->limit))
        u->limit_changes++;
    if (floor(limit) != floor(u->limit) || u->limit_reason == NULL)
        u->limit_reason = reason;
    u->limit = limit;
}

/*
 * Closes the measuring window when it is long enough, and moves the limit
 * to what Little's law says the upstream can hold (BBR's bandwidth-delay
 * product, in requests):
 *
 *   X      = attempts ended / window seconds, an EWMA over windows (1/4)
 *   X_max  = the most X of recent windows (each older one decays 3%)
 *   target = max(2 x X_max x baseline, 1.25 x C + 1)
 *   limit  = half way from the limit to the target
 *
 * X_max x baseline is how many attempts the upstream completes in the time
 * one takes alone: its concurrency as far as throughput shows it. Twice
 * that (BBR's gain) lets the throughput double each window while the
 * upstream has room, and stops when it has none: past its capacity X does
 * not grow, the extra attempts only queue, and they wait in the gateway
 * instead. A gradient on latency (Envoy's) was tried first and rejected: a
 * batching engine takes longer per request at 4 in flight than at 1 while
 * its throughput still grows, and the gradient capped it below its slots.
 * C, the learned (or reported) concurrency, is a floor. Attempts stuck
 * unread end late, so their upstream's X and its limit drop.
 *
 * The baseline is the hold time of attempts that did not queue, b of the
 * learned-concurrency fit (bucket 0 first, see calibrating()); for an upstream
 * that reports its slots (no calibration) the least W seen, drifting up 1%
 * a window. W = (in flight x seconds) / attempts ended is kept for
 * /status. A window with attempts in flight but none ended stays open
 * until one ends (LLM answers can take longer than a window).
 */
static void limit_window(ig_router_t *r, ig_router_upstream_t *u, uint64_t now_ns)
{
    const ig_router_opts_t *o = &r->opts;
    if (o->limit_max <= 0)
        return;
    if (u->lw_start_ns == 0) {
        u->lw_start_ns = u->lw_last_ns = now_ns;
        u->lw_peak = u->inflight;
        if (u->limit <= 0)
            limit_set(u, o->limit_initial, "initial");
        return;
    }
    u->lw_area += u->inflight * seconds_between(u->lw_last_ns, now_ns);
    u->lw_last_ns = now_ns;
    if (u->inflight > u->lw_peak)
        u->lw_peak = u->inflight;
    double dt = seconds_between(u->lw_start_ns, now_ns);
    if (calibrating(u)) {
        u->limit_reason = "calibrating";
        return; /* the window keeps counting; the base is not known yet */
    }
    /* A window spans at least two base holds, so that attempts that
     * straddle its edges do not dominate it. */
    double min_dt = fmax(o->limit_window_s, 2.0 * u->limit_base_s);
    int full = dt >= min_dt && u->lw_done >= o->limit_window_done;
    if (!full && dt < o->limit_window_max_s)
        return;
    double limit = limit_now(r, u);
    const char *reason;
    if (u->lw_done == 0) {
        if (u->lw_area > 0)
            return;               /* long attempts: the window stays open until one ends */
        reason = u->limit_reason; /* idle: nothing to learn */
    } else {
        double w = u->lw_area / u->lw_done;
        u->limit_w_s = w;
        if (u->slots <= 0 && u->hold_base_s > 0)
            u->limit_base_s = u->hold_base_s; /* the fit's unqueued hold */
        else if (u->limit_base_s <= 0 || w < u->limit_base_s)
            u->limit_base_s = w; /* reported slots: no calibration */
        else
            u->limit_base_s *= 1.01;
        /* One window's X is noisy (service times vary): its EWMA feeds the
         * decaying maximum. */
        double x = u->lw_done / dt;
        u->limit_x_ewma = u->limit_x_ewma > 0 ? u->limit_x_ewma + 0.25 * (x - u->limit_x_ewma) : x;
        u->limit_x_per_s = fmax(u->limit_x_ewma, 0.97 * u->limit_x_per_s);
        double target =
            fmax(2.0 * u->limit_x_per_s * u->limit_base_s, 1.25 * ig_router_concurrency(u) + 1.0);
        double next = 0.5 * limit + 0.5 * target;
        reason = next > limit ? "throughput_up" : next < limit ? "throughput_down" : "steady";
        limit = next;
    }
    if (limit < o->limit_min)
        limit = o->limit_min;
    if (limit > o->limit_max)
        limit = o->limit_max;
    limit_set(u, limit, reason);
    u->lw_start_ns = now_ns;
    u->lw_area = 0;
    u->lw_done = 0;
    u->lw_peak = u->inflight;
}

/* ---- attempts, ejection, retry budget ------------------------------------ */

int ig_router_attempt_begin(ig_router_t *r, ig_router_upstream_t *u, uint64_t now_ns)
{
    limit_window(r, u, now_ns);
    if (u->inflight == 0)
        u->busy_since_ns = now_ns;
    u->inflight++;
    if (u->inflight > u->lw_peak)
        u->lw_peak = u->inflight;
    if (u->ejected_until_ns != 0 && now_ns >= u->ejected_until_ns && !u->half_open) {
        u->half_open = 1;
        return 1;
    }
    return 0;
}

/* The upstream answered well: forget its failures, any ejection and its
 * backoff (a success of an attempt begun before the ejection counts too). */
static void health_clear(ig_router_upstream_t *u)
{
    u->consecutive_failures = 0;
    u->ejected_until_ns = 0;
    u->ejections = 0;
    u->half_open = 0;
}

void ig_router_attempt_proven(ig_router_t *r, ig_router_upstream_t *u, int trial, uint64_t now_ns)
{
    (void)r;
    (void)trial;
    (void)now_ns;
    health_clear(u);
}

void ig_router_attempt_end(ig_router_t *r, ig_router_upstream_t *u, ig_outcome_t outcome, int trial,
                           uint64_t now_ns)
{
    if (u->lw_start_ns != 0) {
        u->lw_area += u->inflight * seconds_between(u->lw_last_ns, now_ns);
        u->lw_last_ns = now_ns;
        u->lw_done++;
    }
    if (u->inflight > 0)
        u->inflight--;
    limit_window(r, u, now_ns);
    switch (outcome) {
    case IG_OUTCOME_SUCCESS:
    case IG_OUTCOME_CLIENT_ERROR: /* the upstream answered sensibly */
        health_clear(u);
        break;
    case IG_OUTCOME_BACKPRESSURE:
        /* Busy is not broken: no ejection, but a half-open trial is over. */
        if (trial)
            u->half_open = 0;
        break;
    case IG_OUTCOME_ABANDONED:
        /* Says nothing about health; a trial it held may run again. */
        if (trial)
            u->half_open = 0;
        break;
    case IG_OUTCOME_FAILURE:
        u->consecutive_failures++;
        if (trial || u->consecutive_failures >= r->opts.eject_consecutive) {
            double t = r->opts.eject_base_s * ldexp(1.0, u->ejections < 16 ? u->ejections : 16);
            if (t > r->opts.eject_max_s)
                t = r->opts.eject_max_s;
            u->ejected_until_ns = now_ns + (uint64_t)(t * NS_PER_S);
            u->ejections++;
            u->consecutive_failures = 0;
        }
        if (trial)
            u->half_open = 0;
        break;
    }
}

static void budget_refill(ig_router_t *r, uint64_t now_ns)
{
    double dt = seconds_between(r->retry_at_ns, now_ns);
    if (r->retry_at_ns == 0)
        dt = 0;
    r->retry_at_ns = now_ns;
    r->retry_tokens += dt * r->opts.retry_min_per_s;
    /* The bucket holds at most ten seconds' worth of the floor rate plus
     * what requests deposited recently, so a quiet period cannot save up a
     * retry storm. */
    double cap = 10.0 * r->opts.retry_min_per_s + 100.0 * r->opts.retry_ratio;
    if (r->retry_tokens > cap)
        r->retry_tokens = cap;
}

void ig_router_budget_deposit(ig_router_t *r, uint64_t now_ns)
{
    budget_refill(r, now_ns);
    r->retry_tokens += r->opts.retry_ratio;
}

int ig_router_budget_take(ig_router_t *r, uint64_t now_ns)
{
    budget_refill(r, now_ns);
    if (r->retry_tokens < 1.0 - 1e-9) /* deposits of 0.2 add up inexactly */
        return 0;
    r->retry_tokens -= 1.0;
    return 1;
}
