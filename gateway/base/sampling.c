/* A request's sampling parameters (include/infergate/sampling.h). */
#include "infergate/sampling.h"

void ig_sampling_params_default(ig_sampling_params_t *p)
{
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->nlogit_bias = 0;
}
