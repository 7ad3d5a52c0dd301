#ifndef INFERGATE_COST_H
#define INFERGATE_COST_H

/*
 * What answers cost (docs/routing.md, "Cost per answer"): the prices of the
 * config, the cost of one answer, and each upstream's meter of spend,
 * output and idle capacity over the last minutes. Pure arithmetic on what
 * the proxy measures; the loop, metrics and headers are the callers'.
 */

#include <stdint.h>

typedef enum {
    IG_PRICE_NONE = 0,  /* unpriced: cost unknown, never reported as free */
    IG_PRICE_PER_HOUR,  /* capacity paid by time: an instance, or a whole site */
    IG_PRICE_PER_TOKEN, /* a pay-per-token endpoint */
} ig_price_kind_t;

typedef struct {
    ig_price_kind_t kind;
    double per_hour;      /* USD per hour of the instance (or site) */
    double per_1m_input;  /* USD per million prompt tokens */
    double per_1m_output; /* USD per million generated tokens */
} ig_price_t;

/*
 * The cost in USD of one answer. Per token: its prompt and completion
 * tokens at their prices (a count < 0, unknown, counts 0). Per hour: the
 * share of the capacity it held, held_s seconds of an upstream that serves
 * `concurrency` requests at once (< 1 counts as 1), at per_hour / 3600 a
 * second. NAN when unpriced.
 */
double ig_cost_answer(const ig_price_t *p, long long prompt, long long completion, double held_s,
                      double concurrency);

/*
 * The cost in USD of an attempt that did not give the answer: a hedge that
 * lost, an attempt that failed and was retried or answered with an error,
 * a stream that broke. Per hour: its share of the capacity, as an answer's
 * (ig_cost_answer). Per token: its prompt and the completion tokens it
 * sent when the upstream took the request in (`taken`: it answered 2xx, or
 * it was cancelled or timed out while it had the request), else 0 (it
 * refused it with a status, or never got it). NAN when unpriced.
 */
double ig_cost_attempt(const ig_price_t *p, int taken, long long prompt, long long completion,
                       double held_s, double concurrency);

/* What one more request of prompt_tokens that generates about output_tokens
 * costs on an upstream with price p, beyond what is paid anyway: 0 for
 * capacity paid by the hour (and for unpriced), its tokens per token. */
double ig_cost_marginal(const ig_price_t *p, int prompt_tokens, int output_tokens);

/*
 * The "cost" objective's pick among n candidates: of those not excluded
 * whose predicted TTFT ttft[i] is within slo_s (slo_s <= 0: no SLO), the
 * lowest marginal cost; among equals `preferred` (the latency pick) when it
 * is one of them, else the lowest predicted TTFT. The index, or -1 when no
 * candidate meets the SLO (the latency pick then stands).
 */
int ig_cost_pick(const ig_price_t *prices, const double *ttft, const unsigned char *exclude,
                 int n, int prompt_tokens, int output_tokens, double slo_s, int preferred);

/* Whether the cost objective leaves the latency pick's exploration of
 * candidate `explored` (an idle upstream whose estimate is stale) as it is:
 * when none of the others not excluded has a lower marginal cost. A stale
 * estimate of cheap capacity may keep it out of the SLO for good, since
 * only its answers would correct it; a dear one is not worth paying to
 * refresh. */
int ig_cost_keeps_exploration(const ig_price_t *prices, const unsigned char *exclude, int n,
                              int explored, int prompt_tokens, int output_tokens);

/* The standard normal's 0.99 quantile: the cost objective keeps the SLO at
 * p99 (ig_cost_ttft_bound()). */
#define IG_COST_SLO_Z 2.326
/*
 * The TTFT that one request in a hundred is expected to exceed, which the
 * cost objective holds against the SLO: the predicted (mean) TTFT mean_s
 * plus IG_COST_SLO_Z standard deviations of its wait wait_s, `ahead`
 * departures apart (ahead < 1 counts as 1 while wait_s > 0), each gap
 * exponential: its variance is wait_s^2 / ahead. The service's own spread
 * is not added (docs/routing.md, "The cost objective").
 */
double ig_cost_ttft_bound(double mean_s, double wait_s, double ahead);

#define IG_COST_MINUTES 5 /* the window of the per-1M figure and the spend rate */

/* One upstream's spend and output by minute, and the busy share charged
 * since the last idle tick. Zeroed memory is a valid empty meter. */
typedef struct {
    double usd[IG_COST_MINUTES];    /* spend, idle capacity included */
    double tokens[IG_COST_MINUTES]; /* generated tokens */
    uint64_t minute;                /* the minute (now_ns / 60 s) of the newest bucket */
    double charged;                 /* answers' charges not yet set against paid time */
    uint64_t tick_ns;               /* the last idle tick; 0: none yet */
} ig_cost_meter_t;

/* An answer ended at now_ns: usd (NAN counts nothing) and its tokens. */
void ig_cost_meter_answer(ig_cost_meter_t *m, double usd, long long output_tokens,
                          uint64_t now_ns);

/*
 * Capacity paid by the hour and not used since the last tick: per_hour for
 * the time passed, less what answers were charged meanwhile (an excess
 * carries to the next tick), never below 0. Added to the meter's spend and
 * returned (USD); 0 for other prices and on the first tick.
 */
double ig_cost_meter_idle(ig_cost_meter_t *m, const ig_price_t *p, uint64_t now_ns);

/* USD per million generated tokens over the window (idle included); NAN
 * when nothing was generated in it. */
double ig_cost_meter_per_1m(ig_cost_meter_t *m, uint64_t now_ns);

/* The spend of the window as a rate, USD per hour. */
double ig_cost_meter_rate(ig_cost_meter_t *m, uint64_t now_ns);

#endif
