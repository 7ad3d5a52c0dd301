/*
 * The per-step cost model of step_cost_internal.h: a three-parameter
 * recursive least squares fit with forgetting.
 */
#include "step_cost_internal.h"

#include <string.h>

#define LAMBDA 0.97    /* forgetting: an observation weighs half after ~23 steps */
#define P0 1e4         /* initial inverse information: nothing known */
#define P_MAX 1e7      /* no wind-up while steps look alike */
#define WIDE_TOKENS 32 /* a step this wide tells b from a */

static void features(double tokens, double attended, double x[3])
{
    x[0] = 1.0;
    x[1] = tokens / 1e3;
    x[2] = attended / 1e6;
}

void ig__step_cost_init(ig__step_cost_t *m)
{
    memset(m, 0, sizeof(*m));
    for (int i = 0; i < 3; i++)
        m->P[i][i] = P0;
}

void ig__step_cost_observe(ig__step_cost_t *m, double tokens, double attended, double ms)
{
    double x[3], px[3], k[3];
    features(tokens, attended, x);
    double denom = LAMBDA, err = ms;
    for (int i = 0; i < 3; i++) {
        px[i] = 0;
        for (int j = 0; j < 3; j++)
            px[i] += m->P[i][j] * x[j];
        denom += x[i] * px[i];
        err -= m->theta[i] * x[i];
    }
    for (int i = 0; i < 3; i++)
        k[i] = px[i] / denom;
    for (int i = 0; i < 3; i++)
        m->theta[i] += k[i] * err;
    double trace = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            m->P[i][j] -= k[i] * px[j];
    for (int i = 0; i < 3; i++)
        trace += m->P[i][i];
    /* Forget only while the information is bounded: a run of identical
     * steps would otherwise blow up the directions they do not excite. */
    if (trace < P_MAX)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                m->P[i][j] /= LAMBDA;
    m->n++;
    if (tokens >= WIDE_TOKENS)
        m->n_wide++;
}

double ig__step_cost_predict(const ig__step_cost_t *m, double tokens, double attended)
{
    double x[3], y = 0;
    features(tokens, attended, x);
    /* Each term is a cost: a negative coefficient (noise in a short
     * history) must not make a wider step look cheaper. */
    for (int i = 0; i < 3; i++)
        y += (m->theta[i] > 0 ? m->theta[i] : 0) * x[i];
    return y;
}

int ig__step_cost_ready(const ig__step_cost_t *m)
{
    return m->n >= 4 && m->n_wide >= 2;
}

int ig__step_cost_prefill_cap(const ig__step_cost_t *m, int rows, double attended, int pos,
                              double target_ms, int most)
{
    /* The cost grows with n: the largest n within the target, by bisection. */
    int lo = 0, hi = most;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        double att = attended + (double)mid * pos + (double)mid * (mid + 1) / 2.0;
        if (ig__step_cost_predict(m, (double)(rows + mid), att) <= target_ms)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}
