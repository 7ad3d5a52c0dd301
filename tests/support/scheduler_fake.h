/*
 * A test double of the engine for the scheduler's unit tests. It keeps a
 * fake paged KV cache (the token id stored at each slot) and computes each
 * logits row from a hash of every token the row's sequence holds up to that
 * position, read back through the block table. So a wrong block table, a
 * block shared by two sequences or a missed recompute changes the tokens a
 * test sees. A "script" mode makes the next token a fixed function of the
 * last one, for tests that need known text. The fixture at the end (ctx_t)
 * puts a scheduler over it; it asserts, so cmocka.h comes first.
 */
#ifndef IG_TEST_SCHEDULER_FAKE_H
#define IG_TEST_SCHEDULER_FAKE_H

#include "infergate/error.h"
#include "infergate/scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_VOCAB 40
#define FAKE_EOS (FAKE_VOCAB - 1)

typedef struct {
    int num_blocks, block_size;
    int *kv;       /* (num_blocks * block_size) token per slot, -1 empty */
    int *free_ids; /* free list */
    int nfree;
    int *owner_check; /* (num_blocks) 1 when allocated */
    int forwards;
    int max_nseq_seen;
    int last_nseq, last_ntok;
    int fail_next; /* forward returns this error once when non-zero */
    int script;    /* 1: next token = script_next[last token] */
    int script_next[FAKE_VOCAB];
    int eos_allowed; /* else EOS gets -inf in hash mode */
    /* Gate (thread tests): when gated, each forward takes one permit and
     * waits for it, so a test controls how far the engine thread gets. */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gated, permits;
} fake_engine_t;

__attribute__((unused)) static void fake_gate(fake_engine_t *f, int gated, int permits)
{
    pthread_mutex_lock(&f->gate_mu);
    f->gated = gated;
    f->permits += permits;
    pthread_cond_broadcast(&f->gate_cv);
    pthread_mutex_unlock(&f->gate_mu);
}

static int fake_alloc(void *ctx)
{
    fake_engine_t *f = ctx;
    if (f->nfree == 0)
        return IG_ENOKV;
    int b = f->free_ids[--f->nfree];
    if (f->owner_check[b])
        return IG_ESTATE;
    f->owner_check[b] = 1;
    return b;
}

static void fake_release(void *ctx, int b)
{
    fake_engine_t *f = ctx;
    if (b < 0 || b >= f->num_blocks || !f->owner_check[b]) {
        fprintf(stderr, "fake engine: double release of block %d\n", b);
        abort();
    }
    f->owner_check[b] = 0;
    for (int i = 0; i < f->block_size; i++)
        f->kv[b * f->block_size + i] = -1;
    f->free_ids[f->nfree++] = b;
}

static int fake_blocks_free(void *ctx)
{
    return ((fake_engine_t *)ctx)->nfree;
}

static uint64_t fake_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

/* The logits a sequence whose tokens are t[0..n) gets for its next token. */
static void fake_logits_of(const fake_engine_t *f, const int *t, int n, float *out)
{
    if (f->script) {
        for (int v = 0; v < FAKE_VOCAB; v++)
            out[v] = 0.0f;
        out[f->script_next[t[n - 1]]] = 20.0f;
        return;
    }
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++)
        h = fake_mix(h, (uint64_t)t[i] + 1);
    for (int v = 0; v < FAKE_VOCAB; v++)
        out[v] = (float)(fake_mix(h, (uint64_t)v) % 1000) / 250.0f - 2.0f;
    if (!f->eos_allowed)
        out[FAKE_EOS] = -INFINITY;
}

static int fake_forward(void *ctx, const ig_batch_t *b)
{
    fake_engine_t *f = ctx;
    pthread_mutex_lock(&f->gate_mu);
    while (f->gated && f->permits == 0)
        pthread_cond_wait(&f->gate_cv, &f->gate_mu);
    if (f->gated)
        f->permits--;
    pthread_mutex_unlock(&f->gate_mu);
    f->forwards++;
    if (f->fail_next) {
        int rc = f->fail_next;
        f->fail_next = 0;
        return rc;
    }
    f->last_nseq = b->nseq;
    f->last_ntok = b->seq_start[b->nseq];
    if (b->nseq > f->max_nseq_seen)
        f->max_nseq_seen = b->nseq;
    float *out = b->logits;
    int hist[4096];
    for (int s = 0; s < b->nseq; s++) {
        int len = b->seq_start[s + 1] - b->seq_start[s];
        const int *table = b->block_tables[s];
        /* append this chunk to the cache */
        for (int i = 0; i < len; i++) {
            int pos = b->pos_start[s] + i;
            int blk = table[pos / f->block_size];
            if (blk < 0 || blk >= f->num_blocks || !f->owner_check[blk])
                return IG_ESTATE;
            f->kv[blk * f->block_size + pos % f->block_size] = b->tokens[b->seq_start[s] + i];
        }
        for (int i = b->logits_from[s]; i < len; i++) {
            int pos = b->pos_start[s] + i;
            for (int p = 0; p <= pos; p++) {
                int v = f->kv[table[p / f->block_size] * f->block_size + p % f->block_size];
                if (v < 0)
                    return IG_ESTATE; /* a position the cache never got */
                hist[p] = v;
            }
            fake_logits_of(f, hist, pos + 1, out);
            out += FAKE_VOCAB;
        }
    }
    return 0;
}

static void fake_init(fake_engine_t *f, int num_blocks, int block_size)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->gate_mu, NULL);
    pthread_cond_init(&f->gate_cv, NULL);
    f->num_blocks = num_blocks;
    f->block_size = block_size;
    f->kv = malloc(sizeof(int) * (size_t)(num_blocks * block_size));
    f->free_ids = malloc(sizeof(int) * (size_t)num_blocks);
    f->owner_check = calloc((size_t)num_blocks, sizeof(int));
    for (int i = 0; i < num_blocks * block_size; i++)
        f->kv[i] = -1;
    for (int i = 0; i < num_blocks; i++)
        f->free_ids[i] = num_blocks - 1 - i;
    f->nfree = num_blocks;
}

static void fake_dispose(fake_engine_t *f)
{
    free(f->kv);
    free(f->free_ids);
    free(f->owner_check);
}

/* Scheduler options for the fake engine: its EOS token and these limits,
 * the rest at their defaults. */
static int fake_eos = FAKE_EOS;
__attribute__((unused)) static void fake_sched_opts(ig_sched_opts_t *o, int max_batched,
                                                    int max_seqs, int max_waiting)
{
    ig_sched_opts_default(o);
    o->max_batched_tokens = max_batched;
    o->max_num_seqs = max_seqs;
    o->max_waiting = max_waiting;
    o->eos = &fake_eos;
    o->neos = 1;
}

static ig_sched_engine_t fake_iface(fake_engine_t *f)
{
    ig_sched_engine_t e = {.ctx = f,
                           .forward = fake_forward,
                           .block_alloc = fake_alloc,
                           .block_release = fake_release,
                           .blocks_free = fake_blocks_free,
                           .num_blocks = f->num_blocks,
                           .block_size = f->block_size,
                           .vocab_size = FAKE_VOCAB,
                           .max_context = 4096};
    return e;
}

/* Text of a token: letters for 0..25, digits for 26..35, nothing for the
 * rest (special). Tests override with their own table when they need to. */
static const char *fake_pieces[FAKE_VOCAB];

static int fake_piece(void *ctx, int token, char *buf, size_t cap)
{
    if (token < 0 || token >= FAKE_VOCAB)
        return IG_EINVAL;
    if (fake_pieces[token]) {
        size_t n = strlen(fake_pieces[token]);
        memcpy(buf, fake_pieces[token], n < cap ? n : cap);
        return (int)n;
    }
    if (token < 26) {
        buf[0] = (char)('a' + token);
        return 1;
    }
    if (token < 36) {
        buf[0] = (char)('0' + token - 26);
        return 1;
    }
    return 0;
}

/* ---- collecting events ---------------------------------------------------- */

#define COLLECT_MAX 64

typedef struct {
    uint64_t id;
    int tokens[1024];
    int ntokens;
    char text[4096];
    size_t text_len;
    int prompt_lp_pos[1024];
    float prompt_lp[1024];
    int nprompt_lp;
    ig_finish_t finish;
    int error;
    int completion_tokens, prompt_tokens;
    int events;
} collected_t;

typedef struct {
    collected_t c[COLLECT_MAX];
    int n;
} collector_t;

static collected_t *collector_get(collector_t *col, uint64_t id)
{
    for (int i = 0; i < col->n; i++)
        if (col->c[i].id == id)
            return &col->c[i];
    if (col->n == COLLECT_MAX) {
        /* Full: later ids share the last slot (tests that overflow do not
         * inspect them). */
        return &col->c[COLLECT_MAX - 1];
    }
    collected_t *c = &col->c[col->n++];
    memset(c, 0, sizeof(*c));
    c->id = id;
    return c;
}

static void collect_cb(const ig_sched_event_t *ev, void *data)
{
    collected_t *c = collector_get(data, ev->id);
    c->events++;
    for (int i = 0; i < ev->nprompt_lp; i++) {
        c->prompt_lp_pos[c->nprompt_lp] = ev->prompt_lp_from + i;
        c->prompt_lp[c->nprompt_lp++] = ev->prompt_lp[i].logprob;
    }
    for (int i = 0; i < ev->ntokens; i++)
        c->tokens[c->ntokens++] = ev->tokens[i].token;
    memcpy(c->text + c->text_len, ev->text, ev->text_len);
    c->text_len += ev->text_len;
    c->text[c->text_len] = 0;
    if (ev->finish != IG_FINISH_NONE) {
        c->finish = ev->finish;
        c->error = ev->error;
        c->completion_tokens = ev->completion_tokens;
        c->prompt_tokens = ev->prompt_tokens;
    }
}

/* A request for prompt (n ids): default sampling with this seed, max_tokens,
 * no logprobs; the rest zero. */
__attribute__((unused)) static ig_sched_req_t fake_req(const int *prompt, int n, int max_tokens,
                                                       uint64_t seed)
{
    ig_sched_req_t r;
    memset(&r, 0, sizeof(r));
    r.prompt = prompt;
    r.nprompt = n;
    ig_sampling_params_default(&r.sampling);
    r.has_seed = 1;
    r.seed = seed;
    r.max_tokens = max_tokens;
    r.logprobs = -1;
    return r;
}

/* ---- a scheduler over the fake engine ------------------------------------ */

/* The clock the tests move: options get it as now_ns where time matters. */
static uint64_t fake_now;
__attribute__((unused)) static uint64_t fake_clock(void *d)
{
    (void)d;
    return fake_now;
}

typedef struct {
    fake_engine_t fe;
    ig_sched_t *s;
    collector_t col;
} ctx_t;

/* A scheduler over a fresh fake engine of blocks blocks of bs tokens, with
 * options o (fake_sched_opts' and the test's own) and, where forward is not
 * NULL, that forward pass in place of fake_forward. Free with ctx_free. */
__attribute__((unused)) static ctx_t *ctx_start(int blocks, int bs, const ig_sched_opts_t *o,
                                                int (*forward)(void *, const ig_batch_t *))
{
    ctx_t *c = calloc(1, sizeof(*c));
    fake_init(&c->fe, blocks, bs);
    ig_sched_engine_t e = fake_iface(&c->fe);
    if (forward != NULL)
        e.forward = forward;
    ig_sched_detok_t d = {NULL, fake_piece};
    assert_int_equal(ig_sched_create(&c->s, &e, &d, o), 0);
    return c;
}

__attribute__((unused)) static void ctx_free(ctx_t *c)
{
    ig_sched_free(c->s);
    fake_dispose(&c->fe);
    free(c);
}

/* No sequence holds a block (each is free or cached, held by nobody), and
 * once the scheduler is gone every block is back in the engine's free list
 * (the fake aborts on a double release); frees c. */
__attribute__((unused)) static void ctx_free_all_back(ctx_t *c)
{
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    ig_sched_free(c->s);
    c->s = NULL;
    assert_int_equal(c->fe.nfree, c->fe.num_blocks);
    ctx_free(c);
}

/* Submits r, which must be accepted, and returns its id. */
__attribute__((unused)) static uint64_t submit_ok(ctx_t *c, const ig_sched_req_t *r)
{
    uint64_t id;
    assert_int_equal(ig_sched_submit(c->s, r, &id), 0);
    return id;
}

/* Steps and drains until expect_done collected sequences finished: the
 * steps it took, or -1 after max_steps. */
__attribute__((unused)) static int run_until_done(ctx_t *c, int expect_done, int max_steps)
{
    int steps = 0;
    for (; steps < max_steps; steps++) {
        ig_sched_step(c->s);
        ig_sched_drain(c->s, collect_cb, &c->col);
        int done = 0;
        for (int i = 0; i < c->col.n; i++)
            done += c->col.c[i].finish != IG_FINISH_NONE;
        if (done >= expect_done)
            return steps + 1;
    }
    return -1;
}

#endif
