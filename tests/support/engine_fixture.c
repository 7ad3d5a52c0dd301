/* Test support: building engine batches from sequences with KV blocks. */
#include "engine_fixture.h"

#include "infergate/error.h"
#include "infergate/kernels.h"
#include "model_fixture.h"

#include <stdio.h>
#include <stdlib.h>

#include <string.h>

void ig_tbatch_init(ig_tbatch_t *b)
{
    b->nseq = 0;
    b->seq_start[0] = 0;
}

int ig_tbatch_add(ig_tbatch_t *b, ig_engine_t *e, ig_tseq_t *seq, const int *tokens, int n,
                  int logits_from)
{
    int bs = ig_engine_block_size(e);
    int need = (seq->pos + n + bs - 1) / bs;
    int start = b->seq_start[b->nseq];
    if (b->nseq >= IG_TBATCH_MAX_SEQS || start + n > IG_TBATCH_MAX_TOKENS ||
        need > IG_TSEQ_MAX_BLOCKS)
        return IG_EINVAL;
    while (seq->nblocks < need) {
        int blk = ig_engine_block_alloc(e);
        if (blk < 0)
            return blk;
        seq->blocks[seq->nblocks++] = blk;
    }
    memcpy(b->tokens + start, tokens, (size_t)n * sizeof(int));
    b->pos_start[b->nseq] = seq->pos;
    b->tables[b->nseq] = seq->blocks;
    b->logits_from[b->nseq] = logits_from;
    b->seqs[b->nseq] = seq;
    b->nseq++;
    b->seq_start[b->nseq] = start + n;
    return 0;
}

int ig_tbatch_run(ig_tbatch_t *b, ig_engine_t *e, float *logits)
{
    ig_batch_t batch = {
        .nseq = b->nseq,
        .tokens = b->tokens,
        .seq_start = b->seq_start,
        .pos_start = b->pos_start,
        .block_tables = b->tables,
        .logits_from = b->logits_from,
        .logits = logits,
    };
    int rc = ig_engine_forward(e, &batch);
    if (rc == 0)
        for (int s = 0; s < b->nseq; s++)
            b->seqs[s]->pos += b->seq_start[s + 1] - b->seq_start[s];
    return rc;
}

void ig_tseq_release(ig_tseq_t *seq, ig_engine_t *e)
{
    for (int i = 0; i < seq->nblocks; i++)
        ig_engine_block_release(e, seq->blocks[i]);
    seq->nblocks = 0;
    seq->pos = 0;
}

int ig_tbatch_prefill_all(ig_engine_t *e, const int *prompts, int stride, const int *lens, int n,
                          float *logits)
{
    if (n > IG_TBATCH_MAX_SEQS)
        return IG_EINVAL;
    ig_tseq_t seqs[IG_TBATCH_MAX_SEQS];
    memset(seqs, 0, sizeof(seqs));
    ig_tbatch_t *b = malloc(sizeof(*b));
    if (b == NULL)
        return IG_ENOMEM;
    ig_tbatch_init(b);
    int rc = 0;
    for (int p = 0; p < n && rc == 0; p++)
        rc = ig_tbatch_add(b, e, &seqs[p], prompts + (size_t)p * stride, lens[p], 0);
    if (rc == 0)
        rc = ig_tbatch_run(b, e, logits);
    for (int p = 0; p < n; p++)
        ig_tseq_release(&seqs[p], e);
    free(b);
    return rc;
}

int ig_argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

int ig_tengine_model(ig_tengine_t *t, const char *preset, int threads, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (ig_fixture_model_dir(preset, IG_DTYPE_F32, t->dir, sizeof(t->dir), NULL) != 0) {
        snprintf(err, errlen, "no model dir for preset %s", preset);
        return -1;
    }
    if (ig_model_load(&t->model, t->dir, err, errlen) != 0)
        return -1;
    if (ig_backend_cpu_create(&t->be, threads) != 0) {
        snprintf(err, errlen, "no CPU backend");
        ig_model_free(t->model);
        return -1;
    }
    t->vocab = ig_model_config(t->model)->vocab_size;
    return 0;
}

void ig_tengine_close(ig_tengine_t *t)
{
    ig_engine_free(t->e);
    t->be->destroy(t->be);
    ig_model_free(t->model);
}

void ig_tprompt(int seed, int len, int vocab, int *out)
{
    unsigned x = (unsigned)seed * 2654435761u + 1;
    for (int i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        out[i] = (int)((x >> 8) % (unsigned)vocab);
    }
}
