#ifndef INFERGATE_SCHEDULER_H
#define INFERGATE_SCHEDULER_H

/*
 * Continuous batching at iteration level. Each step runs ONE forward pass
 * that decodes one token for every running sequence and fills the rest of
 * max_batched_tokens with prefill chunks (of running sequences still in their
 * prompt, then of waiting ones admitted in FIFO order while KV blocks last).
 * When a running sequence needs a KV block and none is free, the NEWEST
 * running sequence is preempted: its blocks are freed and it goes back to the
 * head of the waiting queue, to be recomputed later (prompt + generated
 * tokens are prefilled again; its RNG state is kept, so the tokens it then
 * generates are the ones it would have generated).
 *
 * Threads: ig_sched_start() runs the steps on a dedicated engine thread.
 * submit(), cancel(), drain() and stats() are safe from any one other thread
 * (the libuv loop): requests enter through a mutex-protected queue and a
 * condition variable; outputs are queued as events and announced through the
 * notify callback (a worker passes uv_async_send there and drains on the
 * loop). The engine thread never touches anything else of the caller's.
 *
 * Without ig_sched_start() a caller may drive ig_sched_step() itself (the
 * unit tests do, with a fake engine).
 */

#include "infergate/engine.h"
#include "infergate/sampler.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ig_sched_s ig_sched_t;

/* The engine calls the scheduler needs: the real engine (engine.h) or a test
 * double. All are called on the engine thread only. */
typedef struct {
    void *ctx;
    int (*forward)(void *ctx, const ig_batch_t *batch);
    int (*block_alloc)(void *ctx); /* block id or IG_ENOKV */
    void (*block_release)(void *ctx, int block);
    int (*blocks_free)(void *ctx);
    int num_blocks;
    int block_size;
    int vocab_size;
    int max_context; /* positions the model supports */
} ig_sched_engine_t;

/* Text of tokens, for stop strings and streamed deltas. piece() writes the
 * bytes token adds to the text (possibly a partial UTF-8 sequence; 0 bytes
 * for special tokens) and returns their count, or < 0. Called on the engine
 * thread; it must be thread-safe against the loop's own tokenizer use. */
typedef struct {
    void *ctx;
    int (*piece)(void *ctx, int token, char *buf, size_t cap);
} ig_sched_detok_t;

/* Observations for histograms, reported on the engine thread. */
typedef enum {
    IG_SCHED_OBS_TTFT = 0,   /* seconds from submit to the first token */
    IG_SCHED_OBS_ITL,        /* seconds between two tokens of a sequence */
    IG_SCHED_OBS_BATCH,      /* sequences in one forward pass */
    IG_SCHED_OBS_QUEUE_TIME, /* seconds from submit to first admission */
    IG_SCHED_OBS_E2E,        /* seconds from submit to finish */
} ig_sched_obs_t;

typedef struct {
    int max_batched_tokens; /* token rows of one forward pass, an upper bound (2048) */
    /* Stall-free batching: while sequences decode, a step takes only as
     * many prompt tokens as keep it within this many ms by the step cost
     * model learned from measured steps (their time between tokens); with
     * nothing decoding, prefill takes the whole max_batched_tokens. 0 turns
     * it off (every step fills max_batched_tokens). Default
     * IG_SCHED_ITL_TARGET_MS. */
    double itl_target_ms;
    int max_num_seqs; /* running sequences (256) */
    int max_waiting;  /* waiting queue bound; submit beyond -> IG_EFULL (1024) */
    int echo_rows;    /* prompt-logprob rows of logits per step (64) */
    const int *eos;   /* the model's EOS ids (copied) */
    int neos;
    /* Called (engine thread) after events were queued, and when a step
     * that prefills starts (its stats say so: est_wait_s). */
    void (*notify)(void *data);
    void *notify_data;
    /* Optional histogram sink (engine thread). */
    void (*observe)(void *data, ig_sched_obs_t what, double value);
    void *observe_data;
    /* Monotonic clock in ns (tests pass a fake one); NULL = CLOCK_MONOTONIC,
     * the clock uv_hrtime() reads. */
    uint64_t (*now_ns)(void *data);
    void *now_data;
    /* Automatic prefix caching (1, the default): full KV blocks are kept
     * under their chained hash (infergate/prefix_hash.h, seeded with
     * prefix_seed, a worker's ig_prefix_seed(model name)); a sequence whose
     * leading blocks are cached skips their prefill, and admission counts
     * only the blocks it does not find. Blocks nobody holds stay cached in
     * an LRU until a block is needed. A request with prompt logprobs (echo)
     * computes its whole prompt, but its blocks are cached too. */
    int prefix_cache;
    uint64_t prefix_seed;
} ig_sched_opts_t;

/* The default itl_target_ms (docs/engine.md, "Stall-free batching"). */
#define IG_SCHED_ITL_TARGET_MS 40.0

void ig_sched_opts_default(ig_sched_opts_t *opts);

/* One sequence to generate. Everything is copied by submit. */
typedef struct {
    const int *prompt; /* (nprompt) token ids, used as given */
    int nprompt;
    ig_sampling_params_t sampling;
    int has_seed; /* else a seed is drawn from the clock */
    uint64_t seed;
    int max_tokens; /* >= 1 */
    int ignore_eos;
    const int *stop_ids; /* (nstop_ids) extra stop token ids */
    int nstop_ids;
    const char *const *stop; /* (nstop) stop strings, matched on the text */
    int nstop;
    int logprobs;         /* -1: none; else the top N (0..20) with each token */
    int prompt_logprobs;  /* echo: logprobs of prompt positions 1.. too */
    uint64_t deadline_ns; /* on now_ns's clock; 0 = none */
    void *user;           /* handed back in every event */
} ig_sched_req_t;

/* What one step produced for one sequence. Owned by the scheduler; valid
 * during the drain callback only. */
typedef struct {
    uint64_t id;
    void *user;
    /* Prompt logprobs (echo): positions prompt_lp_from .. + nprompt_lp - 1
     * (position 0 never has one), in order over successive events. */
    const ig_sample_t *prompt_lp;
    int nprompt_lp;
    int prompt_lp_from;
    /* Generated tokens (0 or 1 per step); a stop token (EOS, stop id) is not
     * listed, but it is counted in completion_tokens. */
    const ig_sample_t *tokens;
    int ntokens;
    /* Text that can be shown now: complete UTF-8, without a matched stop
     * string and without a tail that could still become one. */
    const char *text;
    size_t text_len;
    ig_finish_t finish; /* NONE until the last event of the sequence */
    int error;          /* IG_E* with IG_FINISH_ERROR */
    int prompt_tokens;
    int completion_tokens;
} ig_sched_event_t;

typedef void (*ig_sched_event_cb)(const ig_sched_event_t *ev, void *data);

/* Validates opts against the engine and allocates logits and the sampler.
 * The scheduler borrows eng->ctx and detok->ctx. */
int ig_sched_create(ig_sched_t **out, const ig_sched_engine_t *eng, const ig_sched_detok_t *detok,
                    const ig_sched_opts_t *opts);

/* Starts the engine thread. 0 or IG_ENOMEM / IG_ESTATE. */
int ig_sched_start(ig_sched_t *s);

/* Stops and joins the engine thread (after the step in progress); every
 * sequence left gets a CANCELLED event, to be drained. */
void ig_sched_stop(ig_sched_t *s);

/* Frees everything, undrained events included. Stop first. */
void ig_sched_free(ig_sched_t *s);

/*
 * Queues a sequence. Returns 0 and its id, IG_EFULL when max_waiting
 * sequences already wait (the API answers 429), IG_ETOOLONG when it can never
 * fit (prompt + max_tokens over the context or over the whole KV cache),
 * IG_EINVAL for a bad token id or argument, IG_ESTATE after stop.
 */
int ig_sched_submit(ig_sched_t *s, const ig_sched_req_t *req, uint64_t *id);

/* Cancels a sequence (no-op when unknown or finished). Its blocks are freed
 * at the start of the next step; it then gets a CANCELLED event. */
void ig_sched_cancel(ig_sched_t *s, uint64_t id);

/* Pauses (1) or resumes (0) a sequence from the next step on: a paused
 * sequence keeps its KV blocks but is not stepped, so a stream whose client
 * reads slowly stops generating instead of buffering. No-op when unknown. */
void ig_sched_pause(ig_sched_t *s, uint64_t id, int paused);

/* Runs one step on the calling thread (only when not started). Returns the
 * number of sequences in the forward pass (0 when idle) or an IG_E* error
 * of the engine (the sequences of that batch then finish with ERROR). */
int ig_sched_step(ig_sched_t *s);

/*
 * How many leading full blocks of tokens[0 .. ntok) are cached now, in
 * blocks (multiply by block_size for tokens): what a router asks before it
 * sends a prompt. Safe from any thread; it takes the scheduler's lock
 * while it reads the table (prompts of thousands of tokens: microseconds).
 */
int ig_sched_prefix_match(ig_sched_t *s, const int *tokens, int ntok);

/* The same for a prompt given as its block hashes (ig_prefix_hashes with
 * this scheduler's prefix_seed and block size): how many of hashes[0 .. n)
 * are cached, as a leading run. Any thread. */
int ig_sched_prefix_match_hashes(ig_sched_t *s, const uint64_t *hashes, int n);

/*
 * KV cache events (docs/worker.md, "KV events"): what the prefix cache
 * holds, as a numbered log. A block is STORED when its full KV is committed
 * under its chained hash (infergate/prefix_hash.h, with this scheduler's
 * prefix_seed and block size) and REMOVED when it is evicted for reuse.
 * The log is a ring of about four events per KV block, so a reader that
 * does not keep up loses its place rather than growing a queue.
 */
typedef enum { IG_KV_STORED = 1, IG_KV_REMOVED = 2 } ig_kv_event_kind_t;
typedef struct {
    uint64_t seq; /* 1, 2, ... in the order the cache changed */
    ig_kv_event_kind_t kind;
    uint64_t hash;
    uint64_t parent; /* the previous block's hash (the seed for block 0) */
} ig_kv_event_t;

/* Copies the events numbered after `after` (at most cap, in order) into
 * out: how many (0: none new), or IG_ERANGE when some of them are gone
 * from the ring (or `after` is ahead of the log): take a snapshot. Any
 * thread (the scheduler's cache lock, briefly). */
int ig_sched_kv_events(ig_sched_t *s, uint64_t after, ig_kv_event_t *out, int cap);

/* The blocks committed now, their hashes and parents (at most cap; the
 * engine's num_blocks is always enough), and in *seq the number of the
 * last event they include: events after *seq come on top. Any thread. */
int ig_sched_kv_snapshot(ig_sched_t *s, uint64_t *hashes, uint64_t *parents, int cap,
                         uint64_t *seq);

/* Calls cb for each queued event in order, then frees them. Returns the
 * number of events. */
int ig_sched_drain(ig_sched_t *s, ig_sched_event_cb cb, void *data);

typedef struct {
    int waiting; /* submitted, not running (preempted ones included) */
    int running;
    int waiting_prefill_tokens; /* the waiting prompts' tokens not in the prefix cache */
    int max_waiting;
    int kv_blocks_used;
    int kv_blocks_total;
    double decode_tokens_per_s;  /* EWMA over steps */
    double prefill_tokens_per_s; /* EWMA over steps */
    double est_wait_s;           /* predicted queueing delay of a new request */
    uint64_t steps;
    uint64_t prompt_tokens_total;     /* prefilled, recomputation excluded */
    uint64_t generation_tokens_total; /* sampled */
    uint64_t preemptions_total;
    uint64_t finished_total[IG_FINISH_ERROR + 1]; /* by ig_finish_t */
    uint64_t rejected_total;                      /* submit -> IG_EFULL */
    /* Prefix cache: prompt tokens looked up at a sequence's first admission,
     * and those found cached (recomputes after preemption excluded); blocks
     * committed now (held or cached); cached blocks evicted for reuse. */
    uint64_t prefix_queried_tokens_total;
    uint64_t prefix_hit_tokens_total;
    int prefix_cached_blocks;
    uint64_t prefix_evictions_total;
    int block_size;
} ig_sched_stats_t;

void ig_sched_stats(ig_sched_t *s, ig_sched_stats_t *out);

#endif
