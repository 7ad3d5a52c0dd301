/*
 * The scheduler's model of what one step costs on this backend, learned at
 * run time from measured step times:
 *
 *   ms = a + b * tokens / 1e3 + c * attended / 1e6
 *
 * where tokens counts every row of the batch (decode rows and prompt
 * tokens alike: each re-reads no weight, but costs its matmul rows) and
 * attended counts the (query, key) pairs attention visits (a prompt chunk of
 * n tokens at position p visits n * p + n * (n + 1) / 2). `a` is what a step
 * costs whatever it holds: on a CPU at the bandwidth wall, reading every
 * weight once. Fitted by recursive least squares with forgetting, so a
 * backend whose speed changes (another process, thermal limits) is followed
 * within a few dozen steps. Engine-thread only.
 */
#ifndef IG_STEP_COST_INTERNAL_H
#define IG_STEP_COST_INTERNAL_H

typedef struct {
    double theta[3]; /* a, b, c above */
    double P[3][3];  /* inverse information, RLS */
    int n;           /* steps observed */
    int n_wide;      /* of which with at least 32 tokens: b is known */
} ig__step_cost_t;

void ig__step_cost_init(ig__step_cost_t *m);

/* One measured step. */
void ig__step_cost_observe(ig__step_cost_t *m, double tokens, double attended, double ms);

/* Predicted ms of a step (never below 0). */
double ig__step_cost_predict(const ig__step_cost_t *m, double tokens, double attended);

/* Whether the fit has seen enough varied steps to be trusted. */
int ig__step_cost_ready(const ig__step_cost_t *m);

/* The most prompt tokens, at most `most`, that a step holding `rows`
 * decode rows (attending `attended` pairs) can add, prompt chunk starting at
 * position `pos`, for the step to stay within target_ms by the fit. */
int ig__step_cost_prefill_cap(const ig__step_cost_t *m, int rows, double attended, int pos,
                              double target_ms, int most);

#endif
