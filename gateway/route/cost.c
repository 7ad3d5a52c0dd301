/*
 * The cost of answers and each upstream's cost meter (include/infergate/cost.h).
 */
#include "infergate/cost.h"

#include <math.h>
#include <string.h>

#define NS_PER_MINUTE 60000000000ULL

double ig_cost_answer(const ig_price_t *p, long long prompt, long long completion, double held_s,
                      double concurrency)
{
    switch (p->kind) {
    case IG_PRICE_PER_TOKEN:
        return ((prompt > 0 ? (double)prompt : 0) * p->per_1m_input +
                (completion > 0 ? (double)completion : 0) * p->per_1m_output) /
               1e6;
    case IG_PRICE_PER_HOUR:
        return (held_s > 0 ? held_s : 0) / (concurrency > 1 ? concurrency : 1) * p->per_hour /
               3600.0;
    default:
        return NAN;
    }
}

double ig_cost_attempt(const ig_price_t *p, int taken, long long prompt, long long completion,
                       double held_s, double concurrency)
{
    if (p->kind == IG_PRICE_PER_TOKEN && !taken)
        return 0;
    return ig_cost_answer(p, prompt, completion, held_s, concurrency);
}

double ig_cost_marginal(const ig_price_t *p, int prompt_tokens, int output_tokens)
{
    if (p->kind != IG_PRICE_PER_TOKEN)
        return 0;
    return ((prompt_tokens > 0 ? prompt_tokens : 0) * p->per_1m_input +
            (output_tokens > 0 ? output_tokens : 0) * p->per_1m_output) /
           1e6;
}

int ig_cost_pick(const ig_price_t *prices, const double *ttft, const unsigned char *exclude,
                 int n, int prompt_tokens, int output_tokens, double slo_s, int preferred)
{
    int best = -1;
    double best_cost = 0;
    for (int i = 0; i < n; i++) {
        if ((exclude != NULL && exclude[i]) || (slo_s > 0 && !(ttft[i] <= slo_s)))
            continue;
        double c = ig_cost_marginal(&prices[i], prompt_tokens, output_tokens);
        /* a cost within a part in a million is a tie */
        int cheaper = best < 0 || c < best_cost * (1 - 1e-6) - 1e-15;
        int tie = best >= 0 && !cheaper && c <= best_cost * (1 + 1e-6) + 1e-15;
        /* Of two paid by the hour, the lower hourly price: its answers are
         * charged less, and the dearer one idles, so that the autoscaler
         * sheds it first (docs/autoscale.md). */
        int hourly = tie && prices[i].kind == IG_PRICE_PER_HOUR &&
                     prices[best].kind == IG_PRICE_PER_HOUR;
        if (hourly && prices[i].per_hour != prices[best].per_hour) {
            cheaper = prices[i].per_hour < prices[best].per_hour;
            tie = 0;
        }
        if (cheaper || (tie && (i == preferred || (best != preferred && ttft[i] < ttft[best])))) {
            best = i;
            best_cost = c;
        }
    }
    return best;
}

int ig_cost_keeps_exploration(const ig_price_t *prices, const unsigned char *exclude, int n,
                              int explored, int prompt_tokens, int output_tokens)
{
    if (explored < 0 || explored >= n)
        return 0;
    double own = ig_cost_marginal(&prices[explored], prompt_tokens, output_tokens);
    for (int i = 0; i < n; i++) {
        if (i == explored || (exclude != NULL && exclude[i]))
            continue;
        if (ig_cost_marginal(&prices[i], prompt_tokens, output_tokens) < own * (1 - 1e-6) - 1e-15)
            return 0;
    }
    return 1;
}

double ig_cost_ttft_bound(double mean_s, double wait_s, double ahead)
{
    if (!(wait_s > 0))
        return mean_s;
    return mean_s + IG_COST_SLO_Z * wait_s / sqrt(ahead > 1 ? ahead : 1);
}

/* Moves the window to now's minute: the buckets of minutes passed start empty. */
static void advance(ig_cost_meter_t *m, uint64_t now_ns)
{
    uint64_t minute = now_ns / NS_PER_MINUTE;
    if (minute <= m->minute)
        return;
    uint64_t gone = minute - m->minute;
    for (uint64_t k = 1; k <= gone && k <= IG_COST_MINUTES; k++) {
        size_t i = (size_t)((m->minute + k) % IG_COST_MINUTES);
        m->usd[i] = 0;
        m->tokens[i] = 0;
    }
    m->minute = minute;
}

void ig_cost_meter_answer(ig_cost_meter_t *m, double usd, long long output_tokens,
                          uint64_t now_ns)
{
    advance(m, now_ns);
    size_t i = (size_t)(m->minute % IG_COST_MINUTES);
    if (isfinite(usd)) {
        m->usd[i] += usd;
        m->charged += usd;
    }
    if (output_tokens > 0)
        m->tokens[i] += (double)output_tokens;
}

double ig_cost_meter_idle(ig_cost_meter_t *m, const ig_price_t *p, uint64_t now_ns)
{
    if (p->kind != IG_PRICE_PER_HOUR) {
        m->charged = 0;
        return 0;
    }
    uint64_t last = m->tick_ns;
    m->tick_ns = now_ns;
    if (last == 0 || now_ns <= last)
        return 0;
    double paid = p->per_hour * (double)(now_ns - last) / 3.6e12;
    double idle = paid - m->charged;
    m->charged = idle < 0 ? -idle : 0;
    if (idle <= 0)
        return 0;
    advance(m, now_ns);
    m->usd[m->minute % IG_COST_MINUTES] += idle;
    return idle;
}

double ig_cost_meter_per_1m(ig_cost_meter_t *m, uint64_t now_ns)
{
    advance(m, now_ns);
    double usd = 0, tokens = 0;
    for (int i = 0; i < IG_COST_MINUTES; i++) {
        usd += m->usd[i];
        tokens += m->tokens[i];
    }
    return tokens > 0 ? usd / tokens * 1e6 : NAN;
}

double ig_cost_meter_rate(ig_cost_meter_t *m, uint64_t now_ns)
{
    advance(m, now_ns);
    double usd = 0;
    for (int i = 0; i < IG_COST_MINUTES; i++)
        usd += m->usd[i];
    return usd / (IG_COST_MINUTES / 60.0);
}
