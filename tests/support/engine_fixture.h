#ifndef INFERGATE_TESTS_ENGINE_FIXTURE_H
#define INFERGATE_TESTS_ENGINE_FIXTURE_H

/*
 * Test support for the engine tests: sequences that own KV blocks from an
 * engine's free list, and a builder of one forward-pass batch out of chunks
 * of several sequences.
 */

#include "infergate/engine.h"

#define IG_TSEQ_MAX_BLOCKS 256
#define IG_TBATCH_MAX_SEQS 64
#define IG_TBATCH_MAX_TOKENS 4096

typedef struct {
    int pos; /* positions already in the KV cache */
    int blocks[IG_TSEQ_MAX_BLOCKS];
    int nblocks;
} ig_tseq_t;

typedef struct {
    int nseq;
    int tokens[IG_TBATCH_MAX_TOKENS];
    int seq_start[IG_TBATCH_MAX_SEQS + 1];
    int pos_start[IG_TBATCH_MAX_SEQS];
    const int *tables[IG_TBATCH_MAX_SEQS];
    int logits_from[IG_TBATCH_MAX_SEQS];
    ig_tseq_t *seqs[IG_TBATCH_MAX_SEQS];
} ig_tbatch_t;

void ig_tbatch_init(ig_tbatch_t *b);

/* Adds tokens[0..n) of seq at its next positions, taking blocks from the
 * engine as needed; logits for rows i >= logits_from. 0 or IG_ENOKV. */
int ig_tbatch_add(ig_tbatch_t *b, ig_engine_t *e, ig_tseq_t *seq, const int *tokens, int n,
                  int logits_from);

/* Runs the batch into logits (rows, vocab) and advances each sequence's
 * position. Returns ig_engine_forward's code. */
int ig_tbatch_run(ig_tbatch_t *b, ig_engine_t *e, float *logits);

/* Gives a sequence's blocks back to the engine. */
void ig_tseq_release(ig_tseq_t *seq, ig_engine_t *e);

/* Prefills n prompts (prompt p: lens[p] ids at prompts + p * stride) in one
 * batch and writes the logits of every position, prompts in order; the
 * sequences' blocks are released after. 0 or the engine's error. */
int ig_tbatch_prefill_all(ig_engine_t *e, const int *prompts, int stride, const int *lens, int n,
                          float *logits);

/* A model, a backend and an engine over them: what an engine test drives. */
typedef struct {
    char dir[4096]; /* the model's directory */
    ig_model_t *model;
    ig_backend_t *be;
    ig_engine_t *e;
    int vocab;
} ig_tengine_t;

/* The preset's F32 model (ig_fixture_model_dir) and a CPU backend of
 * threads threads in *t, with no engine yet (t->e NULL): for tests that make
 * engines with options of their own. 0, or -1 with err set. */
int ig_tengine_model(ig_tengine_t *t, const char *preset, int threads, char *err, size_t errlen);

/* Frees the engine, the backend and the model (the directory stays). */
void ig_tengine_close(ig_tengine_t *t);

/* len pseudo-random token ids below vocab, the same for the same seed. */
void ig_tprompt(int seed, int len, int vocab, int *out);

/* Index of the largest of n values (the first on ties). */
int ig_argmax(const float *v, int n);

#endif
