#ifndef INFERGATE_CUDA_SAMPLING_H
#define INFERGATE_CUDA_SAMPLING_H

/*
 * Device-side sampling for the CUDA backend: picks the next token of each
 * logits row on the GPU, so that a decode step downloads rows x 4 bytes of
 * token ids instead of rows x vocab x 4 bytes of logits. Only built with
 * CUDA (IG_HAVE_CUDA). Not called by the engine yet: the sampler
 * (gateway/engine/sampler.c) downloads the logits and samples on the host
 * for every backend; test_cuda_kernels checks these kernels against it, and
 * wiring them into decode is left for the GPU session (issue 18). Both
 * functions return IG_EINVAL when `be` is not a CUDA backend.
 */

#include "infergate/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-row sampling parameters. temperature <= 0 means greedy; top_k <= 0 (or
 * >= vocab) keeps every token; top_p >= 1 keeps every token; u is the
 * caller's uniform random number in [0, 1) for the row (the sampler's own
 * seeded generator draws it, so a request's seed reproduces). */
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float u;
} ig_cuda_sample_params_t;

/*
 * tokens(rows), host memory, = the index of the largest logit of each row of
 * logits(rows, vocab), backend memory (lowest index on ties). Waits for the
 * stream.
 */
int ig_cuda_argmax(ig_backend_t *be, int *tokens, const float *logits, int rows, int vocab);

/*
 * tokens(rows), host memory, = one draw per row from softmax(logits / T)
 * restricted to the top_k largest logits and then to the smallest set of the
 * largest whose probability reaches top_p (ties at either cut are all kept).
 * The draw walks the kept tokens in index order: token i is picked when the
 * cumulative mass crosses u * kept_mass. params(rows) is host memory. Waits
 * for the stream.
 */
int ig_cuda_sample(ig_backend_t *be, int *tokens, const float *logits, int rows, int vocab,
                   const ig_cuda_sample_params_t *params);

#ifdef __cplusplus
}
#endif

#endif
