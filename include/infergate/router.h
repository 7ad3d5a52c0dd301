#ifndef INFERGATE_ROUTER_H
#define INFERGATE_ROUTER_H

/*
 * The router's decision logic: one cost model, in seconds of predicted time
 * to first token, over every upstream that can serve a model, local worker
 * or remote site alike. It holds no sockets and reads no clock: the caller
 * passes `now` (uv_hrtime() nanoseconds) and reports what it observed, so
 * that tests drive it with a synthetic clock.
 *
 *   cost(u) = rtt(u) + wait(u) + prefill(u, prompt_tokens)
 *
 * rtt     peak-EWMA of measured round trips (a sample above the average
 *         replaces it; below, it decays in with weight e^(-dt/tau)).
 * wait    requests queued ahead of a new one, over the upstream's service
 *         rate: (reported waiting + our in-flight beyond its concurrency C)
 *         x hold time / C, or the wait the upstream itself reports. C is
 *         the reported slot count, else learned (ig_router_concurrency()).
 * prefill the upstream's service time to first token scaled to this prompt,
 *         learned from observed TTFTs (or its reported prefill rate until
 *         there are observations).
 *
 * The latency pick ranks by the shortest expected delay instead:
 * rtt + (n + 1) x hold / C + prefill, n the requests ahead (router.c,
 * ranked_cost()). A hot/cold guard (Prequal's) keeps latency chasing from
 * piling work on one upstream: an upstream whose utilisation (in flight /
 * C) and whose raw in-flight count are both above the hot quantile of the
 * other eligible ones' is hot (quantile 0 by default: above the least
 * loaded by both); the cheapest cold one wins, and when all are hot the
 * least utilised one.
 */

#include <stdint.h>

#include "infergate/cost.h"

/* The attempts the proxy lets an upstream that reports no slots have in
 * flight (ig_admit_limit()). */
#define IG_ROUTER_UNREPORTED_CAP 64
/* Requests-in-flight counts the learned hold times are kept for; more
 * count as the last. As many as the cap, so that the fit of C sees every
 * count the proxy lets happen, a wide upstream's batch slowdown included
 * (docs/routing.md, "Learned concurrency"). */
#define IG_ROUTER_RIF_BUCKETS IG_ROUTER_UNREPORTED_CAP
/* Attempts whose start and end the router keeps to read the order in
 * which they end (ig_router_order_end()): twice the cap, so that on an
 * upstream without reported slots every attempt in flight when another
 * began is still there when it ends (beyond the ring: taken as ended). */
#define IG_ROUTER_ORDER_RING (2 * IG_ROUTER_UNREPORTED_CAP)

typedef enum {
    IG_ROUTE_LATENCY = 0,
    IG_ROUTE_ROUND_ROBIN,
    IG_ROUTE_LEAST_INFLIGHT,
    IG_ROUTE_RANDOM,
} ig_route_policy_t;

/* "latency", "round_robin", "least_inflight", "random". 0 or IG_EINVAL. */
int ig_route_policy_parse(const char *s, ig_route_policy_t *out);
const char *ig_route_policy_name(ig_route_policy_t policy);

typedef enum {
    IG_ROUTER_LOCAL = 0, /* a worker process of one of our pools */
    IG_ROUTER_SITE,      /* a remote OpenAI-compatible endpoint */
} ig_router_upstream_kind_t;

/* How one attempt on an upstream ended, as the router counts it. */
typedef enum {
    IG_OUTCOME_SUCCESS = 0,  /* a 2xx answer (or a stream that ended well) */
    IG_OUTCOME_FAILURE,      /* transport error, timeout or 5xx: counts
                                towards ejection */
    IG_OUTCOME_BACKPRESSURE, /* 429 or 503: busy, not broken */
    IG_OUTCOME_CLIENT_ERROR, /* 4xx other than 429: the client's fault */
    IG_OUTCOME_ABANDONED,    /* canceled before it said anything about the
                                upstream's health: a lost hedge, a client
                                that went away, the gateway shutting down */
} ig_outcome_t;

/* What the router knows of one upstream: the router's state, kept beside
 * the upstream by whoever owns it (pool instance or site) so that no
 * lookup is needed; only the router's functions update it (the owner sets
 * ready and draining, and copies in what the upstream reports). */
typedef struct {
    const char *name;
    ig_router_upstream_kind_t kind;
    int ready;    /* the supervisor or the prober says it serves */
    int draining; /* no new requests */

    /* learned */
    double rtt_s;        /* peak-EWMA round trip */
    double probe_rtt[3]; /* the last probe round trips, for their median */
    unsigned nprobe_rtt;
    uint64_t rtt_at_ns; /* when rtt_s was last updated; 0 = never */
    double svc_s;       /* EWMA of (TTFT - rtt - predicted wait) */
    double svc_dev_s;   /* EWMA of |sample - svc_s|, for the hedge delay */
    double svc_tokens;  /* EWMA of the prompt tokens of those samples */
    double svc_weight;  /* the last sample's weight in svc_s (1 for the first):
                           gives svc_s's standard error */
    int svc_samples;
    uint64_t svc_at_ns; /* the last service sample */
    double occupancy_s; /* EWMA of how long a request holds a slot */

    /* reported by the upstream (GET /load), aged by the router */
    int slots; /* sequences it runs at once; 0 = unknown */
    double reported_waiting;
    double reported_wait_s;
    double reported_prefill_tps;
    uint64_t reported_at_ns;
    int reported_wait_drains; /* the wait is an infergate worker's own queue
                                 (reported again whenever it grows): taken
                                 less the report's age */

    int inflight;           /* attempts this gateway has in flight on it */
    uint64_t done_at_ns;    /* an attempt of ours last ended on it; 0 = never */
    uint64_t busy_since_ns; /* the last attempt began on it with none in flight */

    /* prefix cache (docs/routing.md, "Prefix-aware routing"): the prompt
     * tokens of the request being routed that this upstream is believed to
     * hold, set by the caller before ig_router_pick (prefill counts only
     * the rest); its KV blocks, as its /load reports them (0 = unknown) */
    int cached_tokens;
    int kv_blocks;
    unsigned kv_epoch;                    /* bumped by the owner when its KV cache starts empty (a
                                             worker process started): what was cached is gone */
    const struct ig_kv_index_s *kv_exact; /* what its KV events say it holds, while
                          they are live (infergate/kv_feed.h); NULL: the
                          approximate index stands in */
    int prefix_peer;                      /* a site that is an infergate gateway (its /load names a
                                             region): it routes by prefix too, so a prompt sent
                                             there stays warm in its region */

    /* Endpoints it answered 404 for (ig_proxy's IG_PROXY_EP_* bits): a
     * site without /v1/embeddings, a worker without /v1/responses. The
     * proxy routes those elsewhere until lacks_until_ns, then asks again. */
    unsigned lacks;
    uint64_t lacks_until_ns;

    /* What its answers cost, and its idle paid capacity (the proxy's; docs/routing.md,
     * "Cost per answer"). */
    ig_cost_meter_t cost;

    /* health: outlier ejection with half-open recovery */
    int consecutive_failures;
    int ejections;             /* consecutive ejections, for the backoff */
    uint64_t ejected_until_ns; /* 0 when not ejected */
    int half_open;             /* one trial attempt is allowed/in flight */

    /* Learned concurrency (for an upstream that reports no slots): the
     * mean time an attempt holds the upstream, start to end, by how many
     * others were in flight when it began (Prequal's latency per
     * requests-in-flight). Below the upstream's concurrency C that time is
     * flat; at k >= C others it grows by (k + 1 - C) / C service times,
     * which gives C back (ig_router_concurrency()). */
    double rif_hold_s[IG_ROUTER_RIF_BUCKETS];  /* by others in flight at start */
    double rif_sq_s2[IG_ROUTER_RIF_BUCKETS];   /* the mean of the squared holds, alike */
    int rif_n[IG_ROUTER_RIF_BUCKETS];          /* samples of each (saturates) */
    uint64_t rif_at_ns[IG_ROUTER_RIF_BUCKETS]; /* each one's last sample */
    double concurrency;                        /* the last estimate; 0 = none yet */
    uint64_t rif_samples;                      /* hold samples in all */
    uint64_t fit_at_ns;                        /* the last fit of concurrency */
    double hold_base_s;                        /* the fit's unqueued hold time (b); 0 = none yet */
    double hold_svc_s; /* the fit's service time s (the queue's slope); 0 = none */
    /* The same by times to first token (streamed answers): a wait for a
     * place shows there as a step of s / C a request, apart from a batch
     * slowdown. wait_c is the C of a queue seen there, 0 = none seen; it
     * lowers the hold's C (ig_router_concurrency(), ig_router_observe_wait()). */
    double wait_rif_s[IG_ROUTER_RIF_BUCKETS];
    double wait_rif_sq_s2[IG_ROUTER_RIF_BUCKETS];
    int wait_rif_n[IG_ROUTER_RIF_BUCKETS];
    uint64_t wait_samples;
    uint64_t wait_fit_at_ns;
    double wait_c;

    /* The order in which our attempts end (ig_router_order_begin/_end()):
     * each one's start and end, by a sequence number, over the last
     * IG_ROUTER_ORDER_RING attempts, and the least concurrency that order
     * allows (the most of the current and the previous window). */
    uint64_t order_seq; /* attempts numbered so far */
    uint64_t order_start_ns[IG_ROUTER_ORDER_RING];
    uint64_t order_end_ns[IG_ROUTER_ORDER_RING]; /* 0 = still in flight */
    double order_c, order_c_prev;
    uint64_t order_window_ns; /* the current window began */

    /* Adaptive concurrency limit (Little's law, BBR's bandwidth-delay
     * product in requests): over windows, the most throughput X seen times
     * the hold time of an attempt alone, twice that, at least 1.25 C + 1.
     * See limit_window() in gateway/route/router.c and ig_router_limit(). */
    double limit;             /* attempts allowed in flight; 0 = not set yet */
    double limit_base_s;      /* the baseline W: the least seen, drifting up */
    double limit_w_s;         /* W of the last window */
    double limit_x_per_s;     /* X_max: the most attempts ended per second lately */
    double limit_x_ewma;      /* X, attempts ended per second, averaged over windows */
    const char *limit_reason; /* why it last moved (static string) */
    uint64_t limit_changes;   /* how often it moved */
    uint64_t lw_start_ns;     /* the window began */
    uint64_t lw_last_ns;      /* the in-flight count last changed */
    double lw_area;           /* in-flight x seconds over the window */
    int lw_done;              /* attempts ended in the window */
    int lw_peak;              /* the most in flight during the window */
} ig_router_upstream_t;

/* Resets the learned state to priors. name is borrowed. */
void ig_router_upstream_init(ig_router_upstream_t *u, const char *name,
                             ig_router_upstream_kind_t kind);

/* The defaults are ig_router_opts_default()'s (gateway/route/router.c); a
 * gateway's come from its config (docs/config.md). */
typedef struct {
    ig_route_policy_t policy;
    double ewma_tau_s;        /* decay of the peak-EWMAs */
    double hot_quantile;      /* in-flight quantile above which one is hot */
    double report_ttl_s;      /* a /load report older than this is ignored */
    double prior_rtt_s;       /* rtt before any sample (1 ms local, 50 ms site) */
    double prior_prefill_tps; /* prompt tokens/s before any sample */
    int eject_consecutive;    /* failures in a row that eject */
    double eject_base_s;      /* first ejection lasts this, doubling */
    double eject_max_s;       /* cap of the ejection time */
    double retry_ratio;       /* retries allowed per request on average */
    double retry_min_per_s;   /* retries always allowed per second */
    int max_retries;          /* attempts beyond the first for one request */
    uint64_t seed;            /* for the random policy and tie breaks */
    /* Adaptive concurrency limit (0 in limit_max, the default: off, no limit). */
    double limit_initial;      /* before the first window (8) */
    double limit_min;          /* never below (1) */
    double limit_max;          /* never above (0: the limit is off, the default;
                                  IG_ROUTER_LIMIT_MAX when enabled by config) */
    double limit_window_s;     /* a window is at least this long (0.1) ... */
    int limit_window_done;     /* ... and holds this many ended attempts (8), or ... */
    double limit_window_max_s; /* ... lasts this long (1.0) with at least one ended */
    /* The latency policy may add tail_weight standard deviations of the
     * predicted TTFT (the service's spread, learned, and the wait's): of
     * two upstreams with the same mean it prefers the steadier (0 = off,
     * the default: over random fleets it moved nothing but the worst cell,
     * which it made worse; docs/routing.md). */
    double tail_weight;
    /* The cheap active probe of an upstream that reports nothing (a plain
     * site): when it carried no attempt and had no RTT sample for this
     * long, its owner times one GET /health (ig_router_probe_due(); 0.5 s;
     * 0 = off, only the site's liveness probe is timed). */
    double rtt_probe_s;
    /* Exploration (the latency policy): an idle upstream whose service time
     * was last sampled more than IG_ROUTER_EXPLORE_AFTER_S ago is sent a
     * request so that its estimate is measured again, at most this share
     * of the decisions (a token bucket; 0.01; 0 = off). Without it an
     * upstream whose estimate went stale and high is never chosen, so the
     * estimate never comes down. */
    double explore_ratio;
} ig_router_opts_t;

/* The cap of an adaptive limit that is enabled without one (the limit is
 * off by default: limit_max 0, docs/routing.md "The simulator"). */
#define IG_ROUTER_LIMIT_MAX 256

/* How old an idle upstream's last service sample must be for it to be
 * explored (seconds). */
#define IG_ROUTER_EXPLORE_AFTER_S 0.5

void ig_router_opts_default(ig_router_opts_t *opts);

typedef struct {
    ig_router_opts_t opts;
    uint64_t rr_next;
    uint64_t rng;
    double retry_tokens;
    uint64_t retry_at_ns;
    double explore_tokens; /* explore_ratio per latency decision, at most 1 */
    uint64_t explorations; /* decisions that explored */
} ig_router_t;

void ig_router_init(ig_router_t *r, const ig_router_opts_t *opts);

/* A decision: the chosen upstream (index into the array given), its cost,
 * and the runner-up (-1 when there was none), for x-infergate-route. */
typedef struct {
    int chosen;
    double cost_s;
    int runner_up;
    double runner_up_cost_s;
    int hot;      /* the chosen one was hot (every eligible one was) */
    int explored; /* the chosen one was explored (its estimate was stale) */
    /* the predicted wait and the believed concurrency of each */
    double wait_s, runner_up_wait_s;
    double concurrency, runner_up_concurrency;
} ig_route_decision_t;

/* 1 when u may take a new attempt now: ready, not draining, not ejected (an
 * ejected one whose time is up is half-open: eligible for one trial). */
int ig_router_eligible(const ig_router_upstream_t *u, uint64_t now_ns);

/* The predicted TTFT of a request of prompt_tokens on u, in seconds. */
double ig_router_cost(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                      uint64_t now_ns);

/* The terms of the latency policy's ranked cost of u (ranked_cost in
 * router.c), for the routing trace: what a decision saw of each candidate. */
typedef struct {
    int fresh;              /* its load report is within report_ttl_s */
    double report_age_s;    /* since its last load report (-1: none) */
    double reported_wait_s; /* its est_wait_s as reported */
    double aged_wait_s;     /* that wait as the router takes it now */
    double reported_waiting;
    double step_s;    /* step_of(): what one more request in flight adds */
    double queue_s;   /* max((n + 1) x step, the aged wait) */
    double prefill_s; /* its prefill of the uncached part of the prompt */
    double cost_s;    /* rtt + queue + prefill (+ the tail term) */
} ig_route_terms_t;

/* What an upstream with no sample yet is believed to be: the median of
 * its fellow candidates that have one (0: none has). */
typedef struct {
    double step_s;     /* what one more request in flight adds */
    double svc_unit_s; /* service time per prompt token, overhead included */
} ig_route_peers_t;

/* The peers of a pick among ups[0 .. n) (exclude as ig_router_pick's). */
void ig_router_peers(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                     const unsigned char *exclude, uint64_t now_ns, ig_route_peers_t *out);

/* Fills t with u's ranked-cost terms for a prompt of prompt_tokens. */
void ig_router_terms(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                     const ig_route_peers_t *peers, uint64_t now_ns, ig_route_terms_t *t);

/*
 * Picks an upstream among ups[0..n) for a prompt of prompt_tokens, skipping
 * those whose index is marked in `exclude` (may be NULL; n entries, nonzero
 * = skip: upstreams already tried for this request). Returns 0 and fills
 * out, or IG_ENOUPSTREAM when none is eligible.
 */
int ig_router_pick(ig_router_t *r, ig_router_upstream_t *const *ups, int n, int prompt_tokens,
                   const unsigned char *exclude, uint64_t now_ns, ig_route_decision_t *out);

/*
 * Bookkeeping around one attempt. begin counts it in flight and returns 1
 * when the attempt takes the upstream's half-open trial (it was ejected and
 * its time is up), else 0; the caller passes that flag back to proven() and
 * end().
 *
 * The trial ends with the first evidence either way:
 *   - success: a whole 2xx answer, a 4xx (the upstream answered sensibly),
 *     or, for a stream, its first content token (proven()): the ejection
 *     and its backoff are forgotten;
 *   - failure: ejected again, for twice as long;
 *   - backpressure (429/503): busy is not broken; the trial is over but the
 *     upstream stays ejected, and the next trial may run at once;
 *   - abandoned: nothing was learned; the trial slot is released and the
 *     upstream stays ejected, eligible for another trial.
 */
int ig_router_attempt_begin(ig_router_t *r, ig_router_upstream_t *u, uint64_t now_ns);
/* The attempt's first content token came: the upstream works. Counts as a
 * success for health (the failure streak, an ejection and the trial are
 * cleared); the attempt stays in flight. Its later end() passes trial 0. */
void ig_router_attempt_proven(ig_router_t *r, ig_router_upstream_t *u, int trial, uint64_t now_ns);
void ig_router_attempt_end(ig_router_t *r, ig_router_upstream_t *u, ig_outcome_t outcome, int trial,
                           uint64_t now_ns);

/* Observations. rtt: one transport round trip (probe, or connect+headers).
 * ttft: the first token of a request of prompt_tokens arrived after ttft_s,
 * when the router had predicted wait_s of queueing. occupancy: a request
 * held the upstream for seconds (start to end). */
/* A background probe's round trip: the median of the last three probes
 * feeds the peak-EWMA, so one delayed probe is not taken for the path. */
void ig_router_observe_probe_rtt(const ig_router_t *r, ig_router_upstream_t *u, double rtt_s,
                                 uint64_t now_ns);
/* r may be NULL (the default tau of 10 s applies). */
void ig_router_observe_rtt(const ig_router_t *r, ig_router_upstream_t *u, double rtt_s,
                           uint64_t now_ns);
void ig_router_observe_ttft(ig_router_t *r, ig_router_upstream_t *u, int prompt_tokens,
                            double ttft_s, double predicted_wait_s, uint64_t now_ns);
/* A streamed answer's first token came ttft_s after its attempt began with
 * rif others in flight: what learns wait_c (an upstream without slots). */
void ig_router_observe_wait(ig_router_t *r, ig_router_upstream_t *u, int rif, double ttft_s,
                            uint64_t now_ns);
/* An attempt cancelled before its first token because another won: its
 * TTFT was more than elapsed_s. Learned as a sample only where that is
 * more than the service now believed for the prompt. */
void ig_router_observe_ttft_above(ig_router_t *r, ig_router_upstream_t *u, int prompt_tokens,
                                  double elapsed_s, double predicted_wait_s, uint64_t now_ns);
void ig_router_observe_occupancy(ig_router_t *r, ig_router_upstream_t *u, double seconds,
                                 uint64_t now_ns);

/* An attempt that began with rif others in flight held the upstream for
 * seconds (start to end, an answer that completed): its occupancy, and the
 * per-RIF hold time the learned concurrency comes from. */
void ig_router_observe_done(ig_router_t *r, ig_router_upstream_t *u, int rif, double seconds,
                            uint64_t now_ns);

/* The order in which attempts on u end. An upstream that queues what it
 * cannot run serves its queue in order (first come, first served), so an
 * attempt that began with rif others in flight and ended after only m of
 * them shows that the upstream ran at least rif + 1 - m at once: the
 * least concurrency C the learned fit may take (docs/routing.md,
 * "Learned concurrency"). ig_router_order_begin() numbers an attempt as it
 * is sent; ig_router_order_end() is called once for every attempt that
 * ended, however (answered: an answer that completed, which alone is
 * evidence; the others only leave the in-flight set). */
uint64_t ig_router_order_begin(ig_router_upstream_t *u, uint64_t now_ns);
void ig_router_order_end(ig_router_upstream_t *u, uint64_t seq, int rif, int answered,
                         uint64_t now_ns);
/* The least concurrency the order of u's answers lately allows (0 = none). */
double ig_router_order_c(const ig_router_upstream_t *u, uint64_t now_ns);

/* The concurrency the router believes u has: its reported slots, else the
 * one learned from hold times per RIF (at least 1; 1 before any sample). */
double ig_router_concurrency(const ig_router_upstream_t *u);

/* The attempts u may have in flight now: its adaptive limit, rounded
 * down, at least limit_min and at least twice its reported slots; 1 while the
 * baseline is measured (an upstream without reported slots, until 6
 * attempts began with nothing else in flight); INT32_MAX when the limit is
 * off (limit_max 0). */
int ig_router_limit(const ig_router_t *r, const ig_router_upstream_t *u);

/*
 * Whether u's owner should time a cheap probe (GET /health) now, to keep an
 * idle upstream's RTT fresh: 1 when rtt_probe_s is on, u reports nothing
 * (no slots, no fresh /load), it is ready, and for rtt_probe_s neither an
 * attempt of ours ended on it (real traffic refreshed what the router
 * knows of it) nor an RTT sample came. The owner keeps at most one probe
 * in flight; so an upstream gets at most one such probe per rtt_probe_s,
 * and none while it carries traffic.
 */
int ig_router_probe_due(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns);

/*
 * For admission (ig_admit_mark()): the delay the latency pick expects for a
 * request of the usual prompt on u, in seconds, rtt + (n + 1) x step + its
 * learned service time (ranked_cost()'s terms without the prompt); 0 while
 * u's step is not learned.
 */
double ig_router_delay(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns);

/* 1 when a new attempt on u would wait for one of its places: as many of
 * ours in flight as its concurrency, where that is known (its reported
 * slots, or a C fitted to a queue it showed; a learned lower bound says
 * nothing of where its queue begins). */
int ig_router_would_queue(const ig_router_upstream_t *u);

/* The wait part of the cost alone (what observe_ttft wants back). */
double ig_router_wait(const ig_router_t *r, const ig_router_upstream_t *u, uint64_t now_ns);

/* The shortest wait, in seconds, a new request can expect from ups[0..n):
 * the least ig_router_wait() of the eligible ones, plus the `ahead` requests
 * the caller holds before it over their combined service rate (slots over
 * the time a request holds one). Negative when nothing is known (none
 * eligible, or requests ahead and none measured), so that nothing is
 * refused on a guess. */
double ig_router_predicted_wait(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                                int ahead, uint64_t now_ns);

/* Retry budget: every request deposits retry_ratio tokens, retry_min_per_s
 * more arrive each second, a retry spends one. */
void ig_router_budget_deposit(ig_router_t *r, uint64_t now_ns);
int ig_router_budget_take(ig_router_t *r, uint64_t now_ns);

/* The hedge delay for an attempt on u: the TTFT that only a share
 * (1 - quantile) of its requests exceed, from its predicted TTFT and the mean
 * deviation of its service time (taken as normal: sigma = 1.25 x mean
 * deviation). quantile 0.95 is about the predicted TTFT + 2 deviations. */
double ig_router_hedge_delay(const ig_router_t *r, const ig_router_upstream_t *u, int prompt_tokens,
                             double quantile, uint64_t now_ns);

#endif
