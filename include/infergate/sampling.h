#ifndef INFERGATE_SAMPLING_H
#define INFERGATE_SAMPLING_H

/*
 * A request's sampling parameters: what the API parser fills
 * (gateway/api/request.c) and the engine's sampler applies
 * (include/infergate/sampler.h). Base, so that api/ and engine/ share the
 * struct without including each other.
 */

#define IG_SAMPLER_MAX_BIAS 300 /* logit_bias entries of one request */

/* One entry of OpenAI's logit_bias: added to the token's logit. */
typedef struct {
    int token;
    float bias; /* -100..100 */
} ig_logit_bias_t;

typedef struct {
    float temperature;        /* <= 0 (or < 1e-5): greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off; (0, 1] */
    float min_p;              /* <= 0: off; [0, 1] */
    float repetition_penalty; /* 1: off; > 0. HF/vLLM rule: a seen token's
                                 positive logit is divided, a negative one
                                 multiplied */
    float presence_penalty;   /* OpenAI, over generated tokens: a seen token's
                                 logit minus this (0: off; -2..2) */
    float frequency_penalty;  /* OpenAI: minus this times its count (0: off) */
    int nlogit_bias;          /* entries of logit_bias in use (0: off) */
    ig_logit_bias_t logit_bias[IG_SAMPLER_MAX_BIAS]; /* added to the logits first,
                                 before every penalty (vLLM's order); held by
                                 value so that a copy of the params is whole */
} ig_sampling_params_t;

/* temperature 1, every filter off, no penalties, no bias. */
void ig_sampling_params_default(ig_sampling_params_t *p);

#endif
