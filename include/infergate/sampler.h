#ifndef INFERGATE_SAMPLER_H
#define INFERGATE_SAMPLER_H

/*
 * Token sampling from one row of logits: greedy, temperature, top-k, top-p,
 * min-p and repetition penalty, with a per-request PRNG so that the same seed
 * gives the same tokens whatever else shares the batch. Log-probabilities
 * (the chosen token's and the top N) come from the log-softmax of the RAW
 * logits, before temperature, penalties and truncation: that is what vLLM
 * reports by default ("raw_logprobs") and what lets a client compare them
 * across sampling settings.
 *
 * Cost per call on a vocab V: one O(V) pass for greedy, two for plain
 * temperature; top-k selects with a min-heap of k (O(V) compares for small
 * k); top-p / min-p keep only the ids that can matter (for top-p those within
 * ln(V / (1 - p)) of the max: all the others together weigh less than 1 - p)
 * and heapify just those; the logprobs cost one more pass (log-sum-exp) and a
 * min-heap of N. Nothing sorts the whole vocab.
 *
 * A sampler holds scratch buffers for one vocab and is used by one thread.
 */

#include "infergate/sampling.h" /* ig_sampling_params_t */

#include <stddef.h>
#include <stdint.h>

#define IG_SAMPLER_MAX_TOP 20

/* xoshiro256** state; seeded through splitmix64 so any seed is fine. */
typedef struct {
    uint64_t s[4];
} ig_rng_t;

void ig_rng_seed(ig_rng_t *rng, uint64_t seed);
/* Uniform in [0, 1), 53 bits. */
double ig_rng_uniform(ig_rng_t *rng);

typedef struct {
    int token;
    float logprob; /* raw log-softmax of the chosen token */
    int ntop;      /* entries filled below, most likely first */
    int top_tokens[IG_SAMPLER_MAX_TOP];
    float top_logprobs[IG_SAMPLER_MAX_TOP];
} ig_sample_t;

typedef struct ig_sampler_s ig_sampler_t;

/* Allocates scratch for `vocab` logits. IG_EINVAL, IG_ENOMEM. */
int ig_sampler_create(ig_sampler_t **out, int vocab);
void ig_sampler_free(ig_sampler_t *s);

/*
 * Picks the next token from logits(vocab) and fills out (token, its logprob
 * and the top `ntop` logprobs, ntop clamped to 0..IG_SAMPLER_MAX_TOP; with
 * ntop < 0 no logprob is computed at all, which saves a pass over the vocab).
 * history(nhistory) are the sequence's tokens, the first nprompt of them the
 * prompt: the logit bias applies first, then the repetition penalty to all,
 * presence and frequency to the rest (the generated ones): logit -=
 * count * frequency + (count > 0) * presence. Bias entries outside the vocab
 * are skipped. Draws at most one number from rng. logits
 * is not modified.
 */
int ig_sampler_sample(ig_sampler_t *s, const float *logits, const ig_sampling_params_t *p,
                      ig_rng_t *rng, const int *history, int nhistory, int nprompt, int ntop,
                      ig_sample_t *out);

/* Logprob of a given token and the top `ntop` of a logits row, without
 * sampling (prompt logprobs for echo). */
int ig_sampler_logprobs(ig_sampler_t *s, const float *logits, int token, int ntop,
                        ig_sample_t *out);

/* Why a sequence stops after producing a token. */
typedef enum {
    IG_FINISH_NONE = 0,
    IG_FINISH_STOP,      /* EOS, a stop token id or a stop string */
    IG_FINISH_LENGTH,    /* max_tokens or the context length */
    IG_FINISH_CANCELLED, /* the client went away */
    IG_FINISH_TIMEOUT,   /* the request's deadline passed */
    IG_FINISH_ERROR,     /* the engine failed */
} ig_finish_t;

/* "stop", "length", "cancelled", "timeout", "error" (NULL for NONE). */
const char *ig_finish_reason(ig_finish_t f);

/*
 * The stop rule on token ids: EOS (unless ignore_eos) and the stop ids give
 * STOP, reaching max_tokens gives LENGTH. eos(neos) are the model's EOS ids.
 */
typedef struct {
    int max_tokens;
    int ignore_eos;
    const int *eos;
    int neos;
    const int *stop_ids;
    int nstop_ids;
} ig_stop_rule_t;

ig_finish_t ig_stop_check(const ig_stop_rule_t *r, int token, int ngenerated);

/* 1 when the token is an EOS or stop id whose text is not shown. */
int ig_stop_is_stop_token(const ig_stop_rule_t *r, int token);

#endif
