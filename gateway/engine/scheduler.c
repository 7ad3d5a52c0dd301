/*
 * Continuous batching. The policy is in step(): cancellations and deadlines
 * first, then decodes of running sequences (preempting the newest when KV
 * blocks run out), then prefill chunks of running sequences, then admission
 * of waiting ones, all within max_batched_tokens; one forward pass; then
 * sampling, stop rules and events.
 *
 * Ownership of sequences: the incoming queue belongs to the mutex; once a
 * step has moved a sequence out of it, only the stepping thread touches it.
 *
 * KV blocks come from the prefix cache (prefix_cache.c), which hands out
 * the engine's free blocks and keeps full ones under their hash; a
 * sequence's blocks[0 .. nhashed) are full and committed, bhash[] their
 * hashes.
 */
#include "infergate/scheduler.h"
#include "infergate/clock.h"
#include "infergate/error.h"
#include "infergate/prefix_hash.h"
#include "infergate/utf8.h"

#include "base/list.h"
#include "prefix_cache_internal.h"
#include "step_cost_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- sequences ------------------------------------------------------------ */

typedef enum { SEQ_WAITING = 0, SEQ_RUNNING } seq_state_t;

typedef struct seq_s {
    uint64_t id; /* also the arrival order: larger is newer */
    void *user;
    seq_state_t state;

    int *tokens; /* prompt then generated */
    int ntokens, cap_tokens;
    int wait_tokens; /* what it adds to waiting_prefill_tokens while it waits */
    int nprompt;
    int ncomputed; /* tokens whose KV is cached */
    int ngen;      /* generated, stop token included */

    int *blocks;
    uint64_t *bhash; /* (cap_blocks) hashes of blocks[0 .. nhashed) */
    int nblocks, cap_blocks;
    int nhashed; /* leading blocks that are full and committed */

    ig_sampling_params_t sp;
    ig_rng_t rng;
    int max_tokens;
    int ignore_eos;
    int *stop_ids;
    int nstop_ids;
    char **stop;
    size_t *stop_len;
    int nstop;
    size_t max_stop_len;
    int logprobs;
    int prompt_lp;      /* echo: prompt logprobs wanted */
    int prompt_lp_next; /* next prompt position whose logprob is owed */

    char *text; /* generated text so far */
    size_t text_len, text_cap;
    size_t emitted; /* bytes of text already in events */

    uint64_t deadline_ns;
    uint64_t submit_ns, last_token_ns;
    int admitted_once;
    int paused; /* its client reads slower than it generates: not stepped */

    /* Per-step scratch: this step's chunk. */
    int sched_n;
    int sched_logits_from;

    ig_list_t node; /* in one of the scheduler's seq_list_t */
} seq_t;

/* A list of sequences and its length. */
typedef struct {
    ig_list_t head; /* of seq_t, by node */
    int n;
} seq_list_t;

typedef enum { OP_CANCEL = 0, OP_PAUSE, OP_RESUME } seq_op_kind_t;

typedef struct {
    uint64_t id;
    seq_op_kind_t op;
} seq_op_t;

#define SEQ_OF(n) IG_LIST_DATA(n, seq_t, node)

static seq_t *seq_first(const seq_list_t *l)
{
    ig_list_t *n = ig_list_first(&l->head);
    return n ? SEQ_OF(n) : NULL;
}

static seq_t *seq_last(const seq_list_t *l)
{
    ig_list_t *n = ig_list_last(&l->head);
    return n ? SEQ_OF(n) : NULL;
}

/* The sequence after (before) q in l, or NULL at the end. */
static seq_t *seq_next(const seq_list_t *l, const seq_t *q)
{
    return q->node.next == &l->head ? NULL : SEQ_OF(q->node.next);
}

static seq_t *seq_prev(const seq_list_t *l, const seq_t *q)
{
    return q->node.prev == &l->head ? NULL : SEQ_OF(q->node.prev);
}

static void list_remove(seq_list_t *l, seq_t *q)
{
    ig_list_remove(&q->node);
    l->n--;
}

static void list_push_back(seq_list_t *l, seq_t *q)
{
    ig_list_push_back(&l->head, &q->node);
    l->n++;
}

static void list_push_front(seq_list_t *l, seq_t *q)
{
    ig_list_push_front(&l->head, &q->node);
    l->n++;
}

/* Keeps the list ordered by id (oldest first): preempted sequences come back
 * in their arrival place. */
static void list_insert_sorted(seq_list_t *l, seq_t *q)
{
    seq_t *at = seq_last(l);
    while (at && at->id > q->id)
        at = seq_prev(l, at);
    ig_list_insert_after(at ? &at->node : &l->head, &q->node);
    l->n++;
}

static void seq_free(seq_t *q)
{
    if (!q)
        return;
    free(q->tokens);
    free(q->blocks);
    free(q->bhash);
    free(q->stop_ids);
    for (int i = 0; i < q->nstop; i++)
        free(q->stop[i]);
    free(q->stop);
    free(q->stop_len);
    free(q->text);
    free(q);
}

/* ---- events ------------------------------------------------------------- */

typedef struct event_s {
    ig_sched_event_t ev;
    ig_sample_t *prompt_lp;
    ig_sample_t token;
    char *text;
    struct event_s *next;
} event_t;

/* ---- the scheduler -------------------------------------------------------- */

struct ig_sched_s {
    ig_sched_engine_t eng;
    ig_sched_detok_t detok;
    ig_sched_opts_t opts;
    int *eos;
    int neos;
    ig_sampler_t *sampler;
    float *logits; /* (logit_rows, vocab) */
    int logit_rows;

    /* Batch arrays, sized once. */
    int *b_tokens, *b_seq_start, *b_pos_start, *b_logits_from;
    const int **b_tables;
    seq_t **b_seqs;

    /* Stepping thread only, except that pc_mu guards the cache's hash table
     * (commits and evictions) against ig_sched_prefix_match(). */
    ig__pcache_t pc;
    pthread_mutex_t pc_mu;
    ig__step_cost_t cost; /* what a step costs on this backend */
    seq_list_t waiting, running;
    int watermark;
    int waiting_prefill_tokens;
    int step_prefill_tokens; /* prompt tokens of the step being computed */

    /* Shared, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    seq_list_t incoming;
    seq_op_t *ops; /* cancel / pause / resume, applied at the next step */
    int nops, cap_ops;
    uint64_t input_gen; /* bumped by every submit and op: wakes an idle engine */
    event_t *ev_head, *ev_tail;
    uint64_t next_id;
    int stopping, started, stopped;
    ig_sched_stats_t stats;
    pthread_t thread;

    /* Pending events of the current step (stepping thread), published under
     * mu at the end of the step. */
    event_t *pend_head, *pend_tail;
    uint64_t last_step_ns;
};

static uint64_t mono_ns(void *data)
{
    return ig_clock_ns();
}

static uint64_t now(const ig_sched_t *s)
{
    return s->opts.now_ns(s->opts.now_data);
}

static void observe(ig_sched_t *s, ig_sched_obs_t what, double v)
{
    if (s->opts.observe)
        s->opts.observe(s->opts.observe_data, what, v);
}

void ig_sched_opts_default(ig_sched_opts_t *o)
{
    ig_engine_opts_t eng;
    ig_engine_opts_default(&eng);
    memset(o, 0, sizeof(*o));
    /* A step is one forward pass: the engine's limits. */
    o->max_batched_tokens = eng.max_batched_tokens;
    o->max_num_seqs = eng.max_num_seqs;
    o->max_waiting = 1024;
    o->echo_rows = 64;
    o->itl_target_ms = IG_SCHED_ITL_TARGET_MS;
    o->prefix_cache = 1;
    o->prefix_seed = ig_prefix_seed(NULL);
}

/* The buffers ig_sched_create() allocates, and s itself. */
static void free_buffers(ig_sched_t *s)
{
    free(s->eos);
    free(s->logits);
    free(s->b_tokens);
    free(s->b_seq_start);
    free(s->b_pos_start);
    free(s->b_logits_from);
    free(s->b_tables);
    free(s->b_seqs);
    free(s);
}

int ig_sched_create(ig_sched_t **out, const ig_sched_engine_t *eng, const ig_sched_detok_t *detok,
                    const ig_sched_opts_t *opts)
{
    if (!eng || !eng->forward || !eng->block_alloc || !eng->block_release || !eng->blocks_free ||
        eng->num_blocks <= 0 || eng->block_size <= 0 || eng->vocab_size <= 0 ||
        eng->max_context <= 0 || !opts || opts->max_batched_tokens <= 0 ||
        opts->max_num_seqs <= 0 || opts->max_waiting < 0 || opts->echo_rows < 0 ||
        !(opts->itl_target_ms >= 0))
        return IG_EINVAL;
    ig_sched_t *s = calloc(1, sizeof(*s));
    if (!s)
        return IG_ENOMEM;
    ig_list_init(&s->incoming.head);
    ig_list_init(&s->waiting.head);
    ig_list_init(&s->running.head);
    s->eng = *eng;
    if (detok)
        s->detok = *detok;
    s->opts = *opts;
    ig__step_cost_init(&s->cost);
    if (!s->opts.now_ns)
        s->opts.now_ns = mono_ns;
    if (opts->max_num_seqs > opts->max_batched_tokens)
        s->opts.max_num_seqs = opts->max_batched_tokens;
    if (opts->neos > 0) {
        s->eos = malloc(sizeof(int) * (size_t)opts->neos);
        if (!s->eos)
            goto fail;
        memcpy(s->eos, opts->eos, sizeof(int) * (size_t)opts->neos);
        s->neos = opts->neos;
    }
    s->opts.eos = s->eos;
    s->logit_rows = s->opts.max_num_seqs + s->opts.echo_rows;
    size_t nb = (size_t)s->opts.max_batched_tokens, ns = (size_t)s->opts.max_num_seqs;
    s->logits = malloc(sizeof(float) * (size_t)s->logit_rows * (size_t)eng->vocab_size);
    s->b_tokens = malloc(sizeof(int) * nb);
    s->b_seq_start = malloc(sizeof(int) * (ns + 1));
    s->b_pos_start = malloc(sizeof(int) * ns);
    s->b_logits_from = malloc(sizeof(int) * ns);
    s->b_tables = malloc(sizeof(int *) * ns);
    s->b_seqs = malloc(sizeof(seq_t *) * ns);
    if (!s->logits || !s->b_tokens || !s->b_seq_start || !s->b_pos_start || !s->b_logits_from ||
        !s->b_tables || !s->b_seqs)
        goto fail;
    if (ig_sampler_create(&s->sampler, eng->vocab_size) < 0)
        goto fail;
    if (ig__pcache_init(&s->pc, eng, opts->prefix_cache, opts->prefix_seed) < 0) {
        ig_sampler_free(s->sampler);
        goto fail;
    }
    pthread_mutex_init(&s->pc_mu, NULL);
    /* Admission keeps ~1% of the blocks free so that running sequences can
     * grow a little before anything has to be preempted. */
    s->watermark = eng->num_blocks / 100;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->next_id = 1;
    s->stats.kv_blocks_total = eng->num_blocks;
    s->stats.block_size = eng->block_size;
    s->stats.max_waiting = opts->max_waiting;
    *out = s;
    return 0;
fail:
    free_buffers(s);
    return IG_ENOMEM;
}

static void free_events(event_t *e)
{
    while (e) {
        event_t *n = e->next;
        free(e->prompt_lp);
        free(e->text);
        free(e);
        e = n;
    }
}

static void free_list(seq_list_t *l)
{
    ig_list_t *it, *tmp;
    IG_LIST_FOREACH_SAFE(it, tmp, &l->head)
    {
        seq_free(SEQ_OF(it));
    }
    ig_list_init(&l->head);
    l->n = 0;
}

void ig_sched_free(ig_sched_t *s)
{
    if (!s)
        return;
    if (s->started && !s->stopped)
        ig_sched_stop(s);
    free_list(&s->incoming);
    free_list(&s->waiting);
    free_list(&s->running);
    free_events(s->ev_head);
    free_events(s->pend_head);
    ig__pcache_dispose(&s->pc);
    pthread_mutex_destroy(&s->pc_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    ig_sampler_free(s->sampler);
    free(s->ops);
    free_buffers(s);
}

/* ---- submit / cancel ------------------------------------------------------ */

static int blocks_for(const ig_sched_t *s, int ntok)
{
    return (ntok + s->eng.block_size - 1) / s->eng.block_size;
}

int ig_sched_submit(ig_sched_t *s, const ig_sched_req_t *r, uint64_t *id)
{
    if (!r || r->nprompt <= 0 || !r->prompt || r->max_tokens <= 0 || r->nstop < 0 ||
        r->nstop_ids < 0 || r->logprobs > IG_SAMPLER_MAX_TOP ||
        (r->prompt_logprobs && s->opts.echo_rows <= 0))
        return IG_EINVAL;
    for (int i = 0; i < r->nprompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->eng.vocab_size)
            return IG_EINVAL;
    long long total = (long long)r->nprompt + r->max_tokens;
    if (total > s->eng.max_context ||
        blocks_for(s, (int)(total > 0x3fffffff ? 0x3fffffff : total)) > s->eng.num_blocks)
        return IG_ETOOLONG;

    seq_t *q = calloc(1, sizeof(*q));
    if (!q)
        return IG_ENOMEM;
    q->cap_tokens = r->nprompt + (r->max_tokens < 256 ? r->max_tokens : 256);
    q->tokens = malloc(sizeof(int) * (size_t)q->cap_tokens);
    if (!q->tokens)
        goto fail;
    memcpy(q->tokens, r->prompt, sizeof(int) * (size_t)r->nprompt);
    q->ntokens = q->nprompt = r->nprompt;
    q->sp = r->sampling;
    q->max_tokens = r->max_tokens;
    q->ignore_eos = r->ignore_eos;
    q->logprobs = r->logprobs;
    q->prompt_lp = r->prompt_logprobs;
    q->prompt_lp_next = 1;
    q->deadline_ns = r->deadline_ns;
    q->user = r->user;
    if (r->nstop_ids > 0) {
        q->stop_ids = malloc(sizeof(int) * (size_t)r->nstop_ids);
        if (!q->stop_ids)
            goto fail;
        memcpy(q->stop_ids, r->stop_ids, sizeof(int) * (size_t)r->nstop_ids);
        q->nstop_ids = r->nstop_ids;
    }
    if (r->nstop > 0) {
        q->stop = calloc((size_t)r->nstop, sizeof(char *));
        q->stop_len = calloc((size_t)r->nstop, sizeof(size_t));
        if (!q->stop || !q->stop_len)
            goto fail;
        for (int i = 0; i < r->nstop; i++) {
            size_t len = strlen(r->stop[i]);
            if (len == 0)
                continue; /* an empty stop string would match everywhere */
            if (!(q->stop[q->nstop] = strdup(r->stop[i])))
                goto fail;
            q->stop_len[q->nstop++] = len;
            if (len > q->max_stop_len)
                q->max_stop_len = len;
        }
    }
    uint64_t t = now(s);
    q->submit_ns = t;
    ig_rng_seed(&q->rng, r->has_seed ? r->seed : t ^ ((uint64_t)(uintptr_t)q << 16));

    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        seq_free(q);
        return IG_ESTATE;
    }
    if (s->stats.waiting >= s->opts.max_waiting) {
        s->stats.rejected_total++;
        pthread_mutex_unlock(&s->mu);
        seq_free(q);
        return IG_EFULL;
    }
    q->id = s->next_id++;
    list_push_back(&s->incoming, q);
    s->input_gen++;
    s->stats.waiting++; /* counted at once, so back-to-back submits see it */
    if (id)
        *id = q->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
fail:
    seq_free(q);
    return IG_ENOMEM;
}

static void push_op(ig_sched_t *s, uint64_t id, seq_op_kind_t op)
{
    pthread_mutex_lock(&s->mu);
    if (s->nops == s->cap_ops) {
        int cap = s->cap_ops ? s->cap_ops * 2 : 16;
        seq_op_t *o = realloc(s->ops, sizeof(seq_op_t) * (size_t)cap);
        if (!o) {
            pthread_mutex_unlock(&s->mu);
            return; /* the deadline or the client's end will finish it */
        }
        s->ops = o;
        s->cap_ops = cap;
    }
    s->ops[s->nops].id = id;
    s->ops[s->nops++].op = op;
    s->input_gen++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ig_sched_cancel(ig_sched_t *s, uint64_t id)
{
    push_op(s, id, OP_CANCEL);
}

void ig_sched_pause(ig_sched_t *s, uint64_t id, int paused)
{
    push_op(s, id, paused ? OP_PAUSE : OP_RESUME);
}

/* ---- events --------------------------------------------------------------- */

static event_t *event_new(ig_sched_t *s, seq_t *q)
{
    /* One event per sequence per step: reuse the pending one if the step
     * already made one for this sequence. */
    if (s->pend_tail && s->pend_tail->ev.id == q->id)
        return s->pend_tail;
    event_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->ev.id = q->id;
    e->ev.user = q->user;
    e->ev.prompt_lp_from = q->prompt_lp_next;
    if (s->pend_tail)
        s->pend_tail->next = e;
    else
        s->pend_head = e;
    s->pend_tail = e;
    return e;
}

static void event_text(event_t *e, const char *p, size_t n)
{
    if (n == 0)
        return;
    char *t = realloc(e->text, e->ev.text_len + n + 1);
    if (!t)
        return;
    memcpy(t + e->ev.text_len, p, n);
    e->ev.text_len += n;
    t[e->ev.text_len] = 0;
    e->text = t;
}

static void publish(ig_sched_t *s)
{
    if (!s->pend_head)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->ev_tail)
        s->ev_tail->next = s->pend_head;
    else
        s->ev_head = s->pend_head;
    s->ev_tail = s->pend_tail;
    pthread_mutex_unlock(&s->mu);
    s->pend_head = s->pend_tail = NULL;
    if (s->opts.notify)
        s->opts.notify(s->opts.notify_data);
}

int ig_sched_drain(ig_sched_t *s, ig_sched_event_cb cb, void *data)
{
    pthread_mutex_lock(&s->mu);
    event_t *e = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    int n = 0;
    for (event_t *it = e; it; it = it->next, n++) {
        it->ev.prompt_lp = it->prompt_lp;
        it->ev.tokens = it->ev.ntokens ? &it->token : NULL;
        it->ev.text = it->text ? it->text : "";
        if (cb)
            cb(&it->ev, data);
    }
    free_events(e);
    return n;
}

/* ---- finishing, preemption ------------------------------------------------ */

/* Last block first: the LRU then evicts a sequence's tail before its
 * head, which more prompts share. */
static void release_blocks(ig_sched_t *s, seq_t *q)
{
    for (int i = q->nblocks - 1; i >= 0; i--)
        ig__pcache_release(&s->pc, q->blocks[i]);
    q->nblocks = 0;
    q->nhashed = 0;
}

/* Free blocks for a sequence: the engine's free list and the cached blocks
 * nobody holds. */
static int blocks_avail(const ig_sched_t *s)
{
    return ig__pcache_available(&s->pc);
}

static int block_alloc(ig_sched_t *s)
{
    pthread_mutex_lock(&s->pc_mu); /* an eviction edits the hash table */
    int b = ig__pcache_alloc(&s->pc);
    pthread_mutex_unlock(&s->pc_mu);
    return b;
}

/* Commits q's blocks that the last forward pass filled. */
static void commit_full_blocks(ig_sched_t *s, seq_t *q)
{
    int bs = s->eng.block_size;
    while ((q->nhashed + 1) * bs <= q->ncomputed && q->nhashed < q->nblocks) {
        uint64_t parent = q->nhashed ? q->bhash[q->nhashed - 1] : s->pc.seed;
        pthread_mutex_lock(&s->pc_mu);
        q->bhash[q->nhashed] = ig__pcache_commit(&s->pc, q->blocks[q->nhashed], parent,
                                                 q->tokens + (size_t)q->nhashed * bs);
        pthread_mutex_unlock(&s->pc_mu);
        q->nhashed++;
    }
}

/* Flushes any text still held back (a stop-string prefix, a partial UTF-8
 * tail) unless a stop string matched, then emits the final event and frees
 * the sequence. */
static void finish(ig_sched_t *s, seq_t *q, ig_finish_t why, int error, int flush)
{
    event_t *e = event_new(s, q);
    if (e) {
        if (flush && q->emitted < q->text_len)
            event_text(e, q->text + q->emitted, q->text_len - q->emitted);
        e->ev.finish = why;
        e->ev.error = error;
        e->ev.prompt_tokens = q->nprompt;
        e->ev.completion_tokens = q->ngen;
    }
    release_blocks(s, q);
    list_remove(q->state == SEQ_RUNNING ? &s->running : &s->waiting, q);
    if (q->state == SEQ_WAITING)
        s->waiting_prefill_tokens -= q->wait_tokens;
    uint64_t t = now(s);
    observe(s, IG_SCHED_OBS_E2E, (double)(t - q->submit_ns) / 1e9);
    pthread_mutex_lock(&s->mu);
    s->stats.finished_total[why]++;
    pthread_mutex_unlock(&s->mu);
    seq_free(q);
}

/* q waits: its prompt's tokens that the prefix cache does not hold now
 * count toward est_wait_s (a prompt whose prefix is cached costs only the
 * rest; what the cache holds may change before q runs). */
static void wait_for_prefill(ig_sched_t *s, seq_t *q)
{
    int hit = s->pc.enabled && q->ntokens > 1
                  ? ig_sched_prefix_match(s, q->tokens, q->ntokens - 1) * s->eng.block_size
                  : 0;
    q->wait_tokens = q->ntokens - hit;
    s->waiting_prefill_tokens += q->wait_tokens;
}

static void preempt(ig_sched_t *s, seq_t *q)
{
    release_blocks(s, q);
    q->ncomputed = 0;
    list_remove(&s->running, q);
    q->state = SEQ_WAITING;
    list_push_front(&s->waiting, q); /* older than anything that waits */
    wait_for_prefill(s, q);
    pthread_mutex_lock(&s->mu);
    s->stats.preemptions_total++;
    pthread_mutex_unlock(&s->mu);
}

/* Grows q's block table to cover ntok positions. 0, or IG_ENOKV (the
 * blocks it took stay with it). */
static int reserve_blocks(seq_t *q, int need)
{
    if (need > q->cap_blocks) {
        int cap = q->cap_blocks ? q->cap_blocks : 4;
        while (cap < need)
            cap *= 2;
        int *b = realloc(q->blocks, sizeof(int) * (size_t)cap);
        if (!b)
            return IG_ENOMEM;
        q->blocks = b;
        uint64_t *h = realloc(q->bhash, sizeof(uint64_t) * (size_t)cap);
        if (!h)
            return IG_ENOMEM;
        q->bhash = h;
        q->cap_blocks = cap;
    }
    return 0;
}

static int grow_blocks(ig_sched_t *s, seq_t *q, int ntok)
{
    int need = blocks_for(s, ntok);
    if (reserve_blocks(q, need) < 0)
        return IG_ENOMEM;
    while (q->nblocks < need) {
        int b = block_alloc(s);
        if (b < 0)
            return IG_ENOKV;
        q->blocks[q->nblocks++] = b;
    }
    return 0;
}

/*
 * Finds the leading blocks of waiting sequence q that the cache holds, at
 * most (ntokens - 1) / block_size of them (the last token is always
 * computed: its logits sample the next one), none for a sequence that
 * still owes prompt logprobs. Writes them to q->blocks and q->bhash
 * without taking references (q->nblocks stays 0) and returns their count;
 * *idle gets how many of them nobody holds, which admission cannot count
 * as free once q takes them.
 */
static int prefix_find(ig_sched_t *s, seq_t *q, int *idle)
{
    int bs = s->eng.block_size, max = (q->ntokens - 1) / bs, n = 0;
    *idle = 0;
    if (!s->pc.enabled || max <= 0 || (q->prompt_lp && q->prompt_lp_next < q->nprompt) ||
        reserve_blocks(q, max) < 0)
        return 0;
    uint64_t parent = s->pc.seed, h;
    for (; n < max; n++) {
        int b = ig__pcache_lookup(&s->pc, parent, q->tokens + (size_t)n * bs, &h);
        if (b < 0)
            break;
        q->blocks[n] = b;
        q->bhash[n] = h;
        *idle += ig__pcache_idle(&s->pc, b);
        parent = h;
    }
    return n;
}

/* q holds the nhit blocks prefix_find() wrote: their KV is computed. */
static void prefix_take(ig_sched_t *s, seq_t *q, int nhit)
{
    for (int i = 0; i < nhit; i++)
        ig__pcache_acquire(&s->pc, q->blocks[i]);
    q->nblocks = q->nhashed = nhit;
    q->ncomputed = nhit * s->eng.block_size;
}

int ig_sched_prefix_match(ig_sched_t *s, const int *tokens, int ntok)
{
    int bs = s->eng.block_size, n = 0;
    uint64_t parent = s->pc.seed, h;
    pthread_mutex_lock(&s->pc_mu);
    for (; tokens && (n + 1) * bs <= ntok; n++) {
        if (ig__pcache_lookup(&s->pc, parent, tokens + (size_t)n * bs, &h) < 0)
            break;
        parent = h;
    }
    pthread_mutex_unlock(&s->pc_mu);
    return n;
}

int ig_sched_prefix_match_hashes(ig_sched_t *s, const uint64_t *hashes, int n)
{
    int k = 0;
    pthread_mutex_lock(&s->pc_mu);
    for (; hashes && k < n; k++)
        if (ig__pcache_find_hash(&s->pc, k ? hashes[k - 1] : s->pc.seed, hashes[k]) < 0)
            break;
    pthread_mutex_unlock(&s->pc_mu);
    return k;
}

int ig_sched_kv_events(ig_sched_t *s, uint64_t after, ig_kv_event_t *out, int cap)
{
    pthread_mutex_lock(&s->pc_mu);
    int n = ig__pcache_events(&s->pc, after, out, cap);
    pthread_mutex_unlock(&s->pc_mu);
    return n;
}

int ig_sched_kv_snapshot(ig_sched_t *s, uint64_t *hashes, uint64_t *parents, int cap, uint64_t *seq)
{
    pthread_mutex_lock(&s->pc_mu);
    int n = ig__pcache_snapshot(&s->pc, hashes, parents, cap, seq);
    pthread_mutex_unlock(&s->pc_mu);
    return n;
}

static int blocks_needed(const ig_sched_t *s, const seq_t *q, int n)
{
    int need = blocks_for(s, q->ncomputed + n) - q->nblocks;
    return need > 0 ? need : 0;
}

/* ---- text and stop strings ------------------------------------------------ */

static int append_text(seq_t *q, const char *p, size_t n)
{
    if (q->text_len + n + 1 > q->text_cap) {
        size_t cap = q->text_cap ? q->text_cap * 2 : 64;
        while (cap < q->text_len + n + 1)
            cap *= 2;
        char *t = realloc(q->text, cap);
        if (!t)
            return IG_ENOMEM;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, p, n);
    q->text_len += n;
    q->text[q->text_len] = 0;
    return 0;
}

/* After new text arrived (old_len bytes before it): a stop string match ends
 * the sequence (1, the text before it emitted); else emits what can no longer
 * be part of a stop string nor a partial UTF-8 character (0). */
static int update_text(ig_sched_t *s, seq_t *q, event_t *e, size_t old_len)
{
    if (q->nstop) {
        size_t from = old_len >= q->max_stop_len ? old_len - q->max_stop_len + 1 : 0;
        if (from < q->emitted)
            from = q->emitted;
        size_t best = (size_t)-1;
        for (int i = 0; i < q->nstop; i++) {
            const char *m = q->text_len > from ? memmem(q->text + from, q->text_len - from,
                                                        q->stop[i], q->stop_len[i])
                                               : NULL;
            if (m && (size_t)(m - q->text) < best)
                best = (size_t)(m - q->text);
        }
        if (best != (size_t)-1) {
            if (e && best > q->emitted)
                event_text(e, q->text + q->emitted, best - q->emitted);
            q->emitted = q->text_len; /* nothing more is shown */
            return 1;
        }
    }
    size_t hold = ig_utf8_incomplete_tail(q->text, q->text_len);
    size_t avail = q->text_len - q->emitted;
    if (q->nstop) {
        size_t maxl = q->max_stop_len - 1 < avail ? q->max_stop_len - 1 : avail;
        for (size_t l = maxl; l > hold; l--) {
            const char *tail = q->text + q->text_len - l;
            int prefix = 0;
            for (int i = 0; i < q->nstop && !prefix; i++)
                prefix = q->stop_len[i] > l && memcmp(q->stop[i], tail, l) == 0;
            if (prefix) {
                hold = l;
                break;
            }
        }
    }
    if (hold > avail)
        hold = avail;
    if (e && avail > hold)
        event_text(e, q->text + q->emitted, avail - hold);
    q->emitted = q->text_len - hold;
    return 0;
}

/* ---- after the forward pass ----------------------------------------------- */

static ig_stop_rule_t stop_rule(const ig_sched_t *s, const seq_t *q)
{
    ig_stop_rule_t r = {.max_tokens = q->max_tokens,
                        .ignore_eos = q->ignore_eos,
                        .eos = s->eos,
                        .neos = s->neos,
                        .stop_ids = q->stop_ids,
                        .nstop_ids = q->nstop_ids};
    return r;
}

static int push_token(seq_t *q, int tok)
{
    if (q->ntokens == q->cap_tokens) {
        int cap = q->cap_tokens * 2;
        int *t = realloc(q->tokens, sizeof(int) * (size_t)cap);
        if (!t)
            return IG_ENOMEM;
        q->tokens = t;
        q->cap_tokens = cap;
    }
    q->tokens[q->ntokens++] = tok;
    return 0;
}

/* Consumes q's rows of logits: prompt logprobs, then the sampled token. */
static void after_forward(ig_sched_t *s, seq_t *q, const float *rows, int nrows, uint64_t t)
{
    const int V = s->eng.vocab_size;
    int n = q->sched_n, from = q->sched_logits_from;
    int pos0 = q->ncomputed; /* position of the chunk's first token */
    event_t *e = NULL;

    /* Row j is position pos0 + from + j; it predicts the token after it. */
    for (int j = 0; j < nrows; j++) {
        int target = pos0 + from + j + 1;
        if (!q->prompt_lp || target >= q->nprompt || target < q->prompt_lp_next)
            continue;
        if (!e && !(e = event_new(s, q)))
            break;
        ig_sample_t *lp =
            realloc(e->prompt_lp, sizeof(ig_sample_t) * (size_t)(e->ev.nprompt_lp + 1));
        if (!lp)
            break;
        e->prompt_lp = lp;
        ig_sampler_logprobs(s->sampler, rows + (size_t)j * V, q->tokens[target],
                            q->logprobs > 0 ? q->logprobs : 0, &lp[e->ev.nprompt_lp++]);
        q->prompt_lp_next = target + 1;
    }
    q->ncomputed += n;
    commit_full_blocks(s, q);
    if (q->ncomputed < q->ntokens || nrows == 0)
        return;

    /* The last row samples the next token. */
    const float *row = rows + (size_t)(nrows - 1) * V;
    ig_sample_t smp;
    ig_sampler_sample(s->sampler, row, &q->sp, &q->rng, q->tokens, q->ntokens, q->nprompt,
                      q->logprobs, &smp);
    if (push_token(q, smp.token) < 0) {
        finish(s, q, IG_FINISH_ERROR, IG_ENOMEM, 1);
        return;
    }
    q->ngen++;
    if (!e && !(e = event_new(s, q))) {
        finish(s, q, IG_FINISH_ERROR, IG_ENOMEM, 1);
        return;
    }
    observe(s, q->ngen == 1 ? IG_SCHED_OBS_TTFT : IG_SCHED_OBS_ITL,
            (double)(t - (q->ngen == 1 ? q->submit_ns : q->last_token_ns)) / 1e9);
    q->last_token_ns = t;
    pthread_mutex_lock(&s->mu);
    s->stats.generation_tokens_total++;
    pthread_mutex_unlock(&s->mu);

    ig_stop_rule_t rule = stop_rule(s, q);
    ig_finish_t why = ig_stop_check(&rule, smp.token, q->ngen);
    if (!ig_stop_is_stop_token(&rule, smp.token)) {
        e->token = smp;
        e->ev.ntokens = 1;
        char piece[256];
        int len =
            s->detok.piece ? s->detok.piece(s->detok.ctx, smp.token, piece, sizeof(piece)) : 0;
        size_t old = q->text_len;
        if (len > 0 &&
            append_text(q, piece, (size_t)(len < (int)sizeof(piece) ? len : (int)sizeof(piece))) ==
                0 &&
            update_text(s, q, e, old)) {
            finish(s, q, IG_FINISH_STOP, 0, 0);
            return;
        }
    }
    if (why == IG_FINISH_NONE && q->ntokens >= s->eng.max_context)
        why = IG_FINISH_LENGTH;
    if (why != IG_FINISH_NONE)
        finish(s, q, why, 0, 1);
}

/* ---- the step ------------------------------------------------------------- */

static seq_t *find_seq(seq_list_t *l, uint64_t id)
{
    for (seq_t *q = seq_first(l); q; q = seq_next(l, q))
        if (q->id == id)
            return q;
    return NULL;
}

/* Moves submitted sequences in and applies cancellations and deadlines. */
static void intake(ig_sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    seq_list_t in;
    ig_list_move(&in.head, &s->incoming.head);
    s->incoming.n = 0;
    int nops = s->nops;
    seq_op_t *ops = NULL;
    if (nops) {
        ops = s->ops;
        s->ops = NULL;
        s->nops = s->cap_ops = 0;
    }
    pthread_mutex_unlock(&s->mu);
    ig_list_t *it;
    while ((it = ig_list_pop_front(&in.head)) != NULL) {
        seq_t *q = SEQ_OF(it);
        q->state = SEQ_WAITING;
        list_push_back(&s->waiting, q);
        wait_for_prefill(s, q);
    }
    for (int i = 0; i < nops; i++) {
        seq_t *q = find_seq(&s->running, ops[i].id);
        if (!q)
            q = find_seq(&s->waiting, ops[i].id);
        if (!q)
            continue;
        if (ops[i].op == OP_CANCEL)
            finish(s, q, IG_FINISH_CANCELLED, IG_ECANCELED, 1);
        else
            q->paused = ops[i].op == OP_PAUSE;
    }
    free(ops);
    uint64_t t = now(s);
    seq_list_t *lists[2] = {&s->running, &s->waiting};
    for (int l = 0; l < 2; l++) {
        for (seq_t *q = seq_first(lists[l]), *n; q; q = n) {
            n = seq_next(lists[l], q);
            if (q->deadline_ns && t >= q->deadline_ns)
                finish(s, q, IG_FINISH_TIMEOUT, IG_ETIMEDOUT, 1);
        }
    }
}

/* Rows of logits a chunk of n tokens needs, and where they start. */
static int plan_rows(const seq_t *q, int n, int *from)
{
    int end = q->ncomputed + n;
    int last = end == q->ntokens; /* the chunk ends where sampling happens */
    if (q->prompt_lp && q->prompt_lp_next < q->nprompt && q->ncomputed < q->nprompt - 1) {
        *from = 0;
        return n;
    }
    *from = last ? n - 1 : n;
    return last ? 1 : 0;
}

static void update_rates(ig_sched_t *s, int decode_tok, int prefill_tok, uint64_t t0, uint64_t t1)
{
    double dt = (double)(t1 - t0) / 1e9;
    if (dt <= 0)
        dt = 1e-9;
    /* EWMA with a time constant of ~5 s of busy time: long steps weigh more. */
    double a = 1.0 - exp(-dt / 5.0);
    if (a < 0.05)
        a = 0.05;
    pthread_mutex_lock(&s->mu);
    if (decode_tok) {
        double r = decode_tok / dt;
        s->stats.decode_tokens_per_s =
            s->stats.decode_tokens_per_s ? s->stats.decode_tokens_per_s * (1 - a) + r * a : r;
    }
    if (prefill_tok) {
        double r = prefill_tok / dt;
        s->stats.prefill_tokens_per_s =
            s->stats.prefill_tokens_per_s ? s->stats.prefill_tokens_per_s * (1 - a) + r * a : r;
    }
    pthread_mutex_unlock(&s->mu);
}

static void update_stats(ig_sched_t *s)
{
    int used = s->eng.num_blocks - blocks_avail(s);
    pthread_mutex_lock(&s->mu);
    s->stats.waiting = s->waiting.n + s->incoming.n;
    s->stats.running = s->running.n;
    s->stats.waiting_prefill_tokens = s->waiting_prefill_tokens;
    s->stats.kv_blocks_used = used;
    s->stats.prefix_cached_blocks = s->pc.ncommitted;
    s->stats.prefix_evictions_total = s->pc.evictions;
    /* A new request waits for the queued prompts and those of the step
     * being computed to be prefilled and, when the running set is full,
     * for a running sequence to finish. */
    double est = 0;
    double pre = s->stats.prefill_tokens_per_s > 0 ? s->stats.prefill_tokens_per_s : 0;
    if (pre > 0)
        est += (s->waiting_prefill_tokens + s->step_prefill_tokens) / pre;
    else if (s->waiting_prefill_tokens > 0)
        est += 1.0; /* no rate yet (a first step): a second is the guess */
    if (s->running.n >= s->opts.max_num_seqs || s->waiting.n > 0) {
        double per_seq = s->stats.decode_tokens_per_s > 0 && s->running.n
                             ? s->stats.decode_tokens_per_s / s->running.n
                             : 0;
        long long left = 0;
        for (seq_t *q = seq_first(&s->running); q; q = seq_next(&s->running, q))
            left += q->max_tokens - q->ngen;
        if (per_seq > 0 && s->running.n)
            est += (double)left / s->running.n / per_seq;
    }
    s->stats.est_wait_s = est;
    pthread_mutex_unlock(&s->mu);
}

/* What one step has put in its batch so far, and what room is left. */
typedef struct {
    int nseq;        /* sequences in b_seqs */
    int budget;      /* tokens still allowed (max_batched_tokens) */
    int echo_left;   /* prompt-logprob rows still allowed (echo_rows) */
    int prefill_tok; /* prompt tokens planned */
} plan_t;

/* Plans q's prefill chunk: n tokens, logits from row `from` on; a chunk
 * whose logits start at 0 spends its rows of the echo allowance. */
static void plan_prefill(ig_sched_t *s, plan_t *p, seq_t *q, int n, int from, int rows)
{
    if (from == 0)
        p->echo_left -= rows;
    q->sched_n = n;
    q->sched_logits_from = from;
    s->b_seqs[p->nseq++] = q;
    p->budget -= n;
    p->prefill_tok += n;
}

/* Pairs of (query, key) a chunk of n tokens from position pos attends. */
static double attended(int pos, int n)
{
    return (double)n * pos + (double)n * (n + 1) / 2.0;
}

/* Prompt tokens a step with `rows` decode rows may add (at most `most`):
 * what the cost model allows within the ITL target, or a cold-start chunk
 * until it has seen enough steps. When the decodes alone take longer than
 * the target (many streams on a slow backend), prompts may still lengthen
 * the step by DECODE_SLACK of its decode-only time: a fixed small chunk
 * there would make a prompt's TTFT grow with the number of streams. Never
 * below MIN_PREFILL_CHUNK. */
#define COLD_PREFILL_CHUNK 64
#define MIN_PREFILL_CHUNK 16
#define DECODE_SLACK 0.25
static int prefill_budget(ig_sched_t *s, int rows, int most)
{
    double att = 0;
    int pos = -1;
    for (seq_t *q = seq_first(&s->running); q; q = seq_next(&s->running, q)) {
        if (q->sched_n == 1)
            att += attended(q->ncomputed, 1);
        else if (pos < 0 && !q->paused && q->ntokens - q->ncomputed > 1)
            pos = q->ncomputed; /* the first prompt to be chunked */
    }
    if (pos < 0)
        pos = 0; /* a new prompt (a prefix hit only lowers the cost) */
    if (!ig__step_cost_ready(&s->cost))
        return COLD_PREFILL_CHUNK < most ? COLD_PREFILL_CHUNK : most;
    double target = s->opts.itl_target_ms,
           floor = (1 + DECODE_SLACK) * ig__step_cost_predict(&s->cost, rows, att);
    int cap =
        ig__step_cost_prefill_cap(&s->cost, rows, att, pos, target > floor ? target : floor, most);
    if (cap < MIN_PREFILL_CHUNK)
        cap = MIN_PREFILL_CHUNK;
    return cap < most ? cap : most;
}

int ig_sched_step(ig_sched_t *s)
{
    intake(s);
    uint64_t t0 = now(s);
again:;
    plan_t p = {.budget = s->opts.max_batched_tokens, .echo_left = s->opts.echo_rows};
    int ntok = 0, decode_tok = 0, prompt_new = 0, preempted = 0;

    for (seq_t *q = seq_first(&s->running); q; q = seq_next(&s->running, q))
        q->sched_n = 0;
    /* 1. Decodes of running sequences, oldest first. When blocks run out,
     * the newest running sequence gives its blocks back (maybe q itself). */
    for (seq_t *q = seq_first(&s->running), *next; q && p.budget > 0; q = next) {
        next = seq_next(&s->running, q);
        if (q->ntokens - q->ncomputed != 1 || q->paused)
            continue;
        int ok = 1;
        while (blocks_needed(s, q, 1) > blocks_avail(s)) {
            seq_t *victim = seq_last(&s->running);
            if (victim == q && s->running.n == 1) {
                /* Alone and still no room: cannot happen for a sequence
                 * submit accepted, but never spin on it. */
                finish(s, q, IG_FINISH_LENGTH, IG_ENOKV, 1);
                ok = 0;
                break;
            }
            if (victim == next)
                next = NULL; /* the victim was the rest of the list */
            preempt(s, victim);
            preempted = 1;
            if (victim == q) {
                ok = 0;
                break;
            }
        }
        if (!ok)
            continue;
        if (grow_blocks(s, q, q->ncomputed + 1) < 0) {
            finish(s, q, IG_FINISH_ERROR, IG_ENOKV, 1);
            continue;
        }
        q->sched_n = 1;
        q->sched_logits_from = 0;
        s->b_seqs[p.nseq++] = q;
        p.budget--;
        decode_tok++;
    }
    /* Stall-free batching: with decodes in the step, prompt tokens only
     * as far as the step stays within the ITL target. */
    if (decode_tok > 0 && s->opts.itl_target_ms > 0 && p.budget > 0)
        p.budget = prefill_budget(s, decode_tok, p.budget);
    /* 2. Prefill chunks of running sequences still in their prompt (or in a
     * recompute), as far as free blocks allow; no preemption for these. */
    for (seq_t *q = seq_first(&s->running); q && p.budget > 0 && p.nseq < s->opts.max_num_seqs;
         q = seq_next(&s->running, q)) {
        int left = q->ntokens - q->ncomputed;
        if (left <= 1 || q->sched_n || q->paused)
            continue;
        int n = left < p.budget ? left : p.budget;
        int fit = (q->nblocks + blocks_avail(s)) * s->eng.block_size - q->ncomputed;
        if (n > fit)
            n = fit;
        int from, rows = plan_rows(q, n, &from);
        if (from == 0 && rows > p.echo_left) {
            n = p.echo_left;
            rows = plan_rows(q, n, &from);
        }
        if (n <= 0)
            continue;
        if (grow_blocks(s, q, q->ncomputed + n) < 0)
            continue;
        plan_prefill(s, &p, q, n, from, rows);
    }
    /* 3. Admission, FIFO: stop at the first sequence that does not fit. A
     * sequence is admitted only when blocks for its whole prompt (and the
     * token after) are free beyond the watermark, even if it is prefilled
     * in chunks, and never in a step that had to preempt: admitting what
     * was just evicted would only thrash. */
    seq_t *next_w;
    for (seq_t *q = seq_first(&s->waiting);
         !preempted && q && p.budget > 0 && s->running.n < s->opts.max_num_seqs &&
         p.nseq < s->opts.max_num_seqs;
         q = next_w) {
        next_w = seq_next(&s->waiting, q);
        if (q->paused)
            continue; /* its client is not reading: not worth blocks now */
        int idle, nhit = prefix_find(s, q, &idle);
        if (blocks_for(s, q->ntokens + 1) - nhit > blocks_avail(s) - idle - s->watermark) {
            /* Paused sequences hold blocks without making progress: the
             * newest of them gives its blocks back before anything waits on
             * it (it is recomputed once its client reads again). */
            seq_t *victim = seq_last(&s->running);
            while (victim && !victim->paused)
                victim = seq_prev(&s->running, victim);
            if (!victim)
                break;
            preempt(s, victim);
            next_w = q; /* try q again */
            continue;
        }
        q->ncomputed = nhit * s->eng.block_size; /* planned from there on */
        int rest = q->ntokens - q->ncomputed;
        int n = rest < p.budget ? rest : p.budget;
        int from, rows = plan_rows(q, n, &from);
        if (from == 0 && rows > p.echo_left) {
            n = p.echo_left;
            if (n <= 0) {
                q->ncomputed = 0;
                break;
            }
            rows = plan_rows(q, n, &from);
        }
        list_remove(&s->waiting, q);
        s->waiting_prefill_tokens -= q->wait_tokens;
        q->state = SEQ_RUNNING;
        list_insert_sorted(&s->running, q);
        prefix_take(s, q, nhit);
        if (grow_blocks(s, q, q->ncomputed + n) < 0) {
            finish(s, q, IG_FINISH_ERROR, IG_ENOKV, 1);
            continue;
        }
        if (!q->admitted_once) {
            q->admitted_once = 1;
            observe(s, IG_SCHED_OBS_QUEUE_TIME, (double)(t0 - q->submit_ns) / 1e9);
            prompt_new += q->nprompt;
            int hit = q->ncomputed < q->nprompt ? q->ncomputed : q->nprompt;
            pthread_mutex_lock(&s->mu);
            s->stats.prefix_queried_tokens_total += (uint64_t)q->nprompt;
            s->stats.prefix_hit_tokens_total += (uint64_t)hit;
            pthread_mutex_unlock(&s->mu);
        }
        plan_prefill(s, &p, q, n, from, rows);
    }

    int active = 0;
    for (seq_t *q = seq_first(&s->running); q; q = seq_next(&s->running, q))
        active += !q->paused;
    if (p.nseq == 0 && active > 0 && s->running.n > 1) {
        /* Every running sequence is mid-prefill and the blocks are gone:
         * the newest gives its blocks back so that the older ones move. */
        preempt(s, seq_last(&s->running));
        goto again;
    }
    if (p.nseq == 0 && active == 1 && s->running.n == 1 && s->waiting.n == 0) {
        finish(s, seq_first(&s->running), IG_FINISH_LENGTH, IG_ENOKV, 1);
    }
    if (p.nseq == 0) {
        update_stats(s);
        publish(s);
        return 0;
    }

    /* Build the batch in b_seqs order. */
    int rows_total = 0;
    s->b_seq_start[0] = 0;
    for (int i = 0; i < p.nseq; i++) {
        seq_t *q = s->b_seqs[i];
        int n = q->sched_n;
        memcpy(s->b_tokens + ntok, q->tokens + q->ncomputed, sizeof(int) * (size_t)n);
        ntok += n;
        s->b_seq_start[i + 1] = ntok;
        s->b_pos_start[i] = q->ncomputed;
        s->b_tables[i] = q->blocks;
        s->b_logits_from[i] = q->sched_logits_from;
        rows_total += n - q->sched_logits_from;
    }
    ig_batch_t batch = {.nseq = p.nseq,
                        .tokens = s->b_tokens,
                        .seq_start = s->b_seq_start,
                        .pos_start = s->b_pos_start,
                        .block_tables = s->b_tables,
                        .logits_from = s->b_logits_from,
                        .logits = s->logits};
    if (p.prefill_tok > 0) {
        /* A prefill holds the engine for a while: say so now, so that the
         * loop can tell the gateways (a worker's /kv/events "load"). */
        s->step_prefill_tokens = p.prefill_tok;
        update_stats(s);
        if (s->opts.notify)
            s->opts.notify(s->opts.notify_data);
    }
    int rc = rows_total <= s->logit_rows ? s->eng.forward(s->eng.ctx, &batch) : IG_ESTATE;
    uint64_t t1 = now(s);
    s->step_prefill_tokens = 0;
    observe(s, IG_SCHED_OBS_BATCH, p.nseq);
    if (rc < 0) {
        for (int i = 0; i < p.nseq; i++)
            finish(s, s->b_seqs[i], IG_FINISH_ERROR, rc, 1);
        update_stats(s);
        publish(s);
        return rc;
    }
    double att = 0;
    for (int i = 0; i < p.nseq; i++)
        att += attended(s->b_pos_start[i], s->b_seqs[i]->sched_n);
    const float *row = s->logits;
    for (int i = 0; i < p.nseq; i++) {
        seq_t *q = s->b_seqs[i];
        int nrows = q->sched_n - q->sched_logits_from;
        after_forward(s, q, row, nrows, t1);
        row += (size_t)nrows * (size_t)s->eng.vocab_size;
    }
    /* The whole step, sampling and detokenizing included: what a decoding
     * sequence waits between two tokens. */
    ig__step_cost_observe(&s->cost, ntok, att, (double)(now(s) - t0) / 1e6);
    pthread_mutex_lock(&s->mu);
    s->stats.steps++;
    s->stats.prompt_tokens_total += (uint64_t)prompt_new;
    pthread_mutex_unlock(&s->mu);
    update_rates(s, decode_tok, p.prefill_tok, t0, t1);
    update_stats(s);
    publish(s);
    return p.nseq;
}

/* ---- the engine thread ---------------------------------------------------- */

static void *engine_main(void *arg)
{
    ig_sched_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && ig_list_empty(&s->incoming.head) && !s->nops &&
               ig_list_empty(&s->running.head) && ig_list_empty(&s->waiting.head))
            pthread_cond_wait(&s->cv, &s->mu);
        int stop = s->stopping;
        uint64_t gen = s->input_gen;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (ig_sched_step(s) != 0)
            continue;
        /* Nothing could run (every sequence paused, or waiting for blocks
         * that paused ones hold): sleep until something changes, waking
         * now and then for deadlines. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->input_gen == gen &&
               pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
            ;
        pthread_mutex_unlock(&s->mu);
    }
    /* Whatever is left is cancelled, so that every sequence gets its end. */
    intake(s);
    while (!ig_list_empty(&s->running.head))
        finish(s, seq_first(&s->running), IG_FINISH_CANCELLED, IG_ECANCELED, 1);
    while (!ig_list_empty(&s->waiting.head))
        finish(s, seq_first(&s->waiting), IG_FINISH_CANCELLED, IG_ECANCELED, 1);
    update_stats(s);
    publish(s);
    return NULL;
}

int ig_sched_start(ig_sched_t *s)
{
    if (s->started)
        return IG_ESTATE;
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0)
        return IG_ENOMEM;
    s->started = 1;
    return 0;
}

void ig_sched_stop(ig_sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started && !s->stopped) {
        pthread_join(s->thread, NULL);
        s->stopped = 1;
    }
}

void ig_sched_stats(ig_sched_t *s, ig_sched_stats_t *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}
