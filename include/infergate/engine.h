#ifndef INFERGATE_ENGINE_H
#define INFERGATE_ENGINE_H

/*
 * An engine is one model on one backend: the weights uploaded once, the
 * paged KV cache, and work buffers sized for the largest batch. It runs one
 * forward pass over a batch of sequences at a time; the scheduler decides
 * what goes into each batch and owns the KV block tables.
 *
 * Not thread-safe: one thread (the worker's engine thread) drives it.
 */

#include "infergate/kernels.h"
#include "infergate/model.h"

typedef struct ig_engine_s ig_engine_t;

typedef struct {
    int kv_blocks;              /* blocks in the KV cache; 0 = size from memory */
    int block_size;             /* tokens per block (16) */
    int max_batched_tokens;     /* rows of one forward pass (2048) */
    int max_num_seqs;           /* sequences of one forward pass (256) */
    double gpu_memory_fraction; /* share of free device memory for weights+KV (0.9) */
    /* Element type of the KV cache: IG_DTYPE_F32 (the default), or F16 /
     * BF16 (half the bytes per block, so twice the blocks for the same
     * memory; K and V rounded to nearest, ties to even, at kv_append). A
     * backend that cannot hold it fails ig_engine_create with IG_ENOTSUP. */
    ig_dtype_t kv_dtype;
} ig_engine_opts_t;

void ig_engine_opts_default(ig_engine_opts_t *opts);

/* Uploads the model's weights to the backend and allocates the KV cache.
 * The engine borrows model and backend; both must outlive it. */
int ig_engine_create(ig_engine_t **out, const ig_model_t *model, ig_backend_t *be,
                     const ig_engine_opts_t *opts, char *err, size_t errlen);
void ig_engine_free(ig_engine_t *engine);

/*
 * One forward pass. Sequence s contributes tokens[seq_start[s] ..
 * seq_start[s+1]) at positions pos_start[s], pos_start[s]+1, ...; its KV
 * block table must already cover every position up to the last of them.
 * Logits are written for the rows i of sequence s with i >= logits_from[s]
 * (len - 1: only the last token; 0: every token, for prompt logprobs; len:
 * none, a prefill chunk that is not the last), in batch order, into
 * logits (rows, vocab), host memory.
 */
typedef struct {
    int nseq;
    const int *tokens;              /* (ntok) */
    const int *seq_start;           /* (nseq + 1) */
    const int *pos_start;           /* (nseq) */
    const int *const *block_tables; /* (nseq) each (blocks covering its positions) */
    const int *logits_from;         /* (nseq) */
    float *logits;                  /* out (rows, vocab) */
} ig_batch_t;

int ig_engine_forward(ig_engine_t *engine, const ig_batch_t *batch);

/* Rows of logits a batch produces: sum over s of len(s) - logits_from[s]. */
int ig_batch_logit_rows(const ig_batch_t *batch);

const ig_model_config_t *ig_engine_config(const ig_engine_t *engine);
int ig_engine_block_size(const ig_engine_t *engine);
int ig_engine_num_blocks(const ig_engine_t *engine);
size_t ig_engine_kv_bytes(const ig_engine_t *engine);
ig_dtype_t ig_engine_kv_dtype(const ig_engine_t *engine);

/* The KV dtype a user writes ("f32", "f16", "bf16": batching.kv_dtype,
 * worker --kv-dtype), 0 or IG_EINVAL; and its name in that spelling. */
int ig_engine_kv_dtype_parse(const char *name, ig_dtype_t *out);
const char *ig_engine_kv_dtype_name(ig_dtype_t dtype);

/* ---- KV blocks: a free list over the engine's cache --------------------- */

/* Takes a free block id, or IG_ENOKV when none is left. */
int ig_engine_block_alloc(ig_engine_t *engine);
void ig_engine_block_release(ig_engine_t *engine, int block);
int ig_engine_blocks_free(const ig_engine_t *engine);

#endif
