/*
 * Private to gateway/worker/: the worker process state (worker_t), one
 * generation request (wreq_t) and its choices, and the functions the
 * worker's files call across each other. worker.c owns the process,
 * generate.c the generation requests, metrics.c the metric families.
 */
#ifndef IG_WORKER_INTERNAL_H
#define IG_WORKER_INTERNAL_H

#include "infergate/api.h"
#include "infergate/chat.h"
#include "infergate/engine.h"
#include "infergate/http.h"
#include "infergate/kernels.h"
#include "infergate/load.h"
#include "infergate/metrics.h"
#include "infergate/model.h"
#include "infergate/scheduler.h"
#include "infergate/tokenizer.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* ---- options ------------------------------------------------------------ */

typedef struct {
    const char *model_dir;
    const char *device;
    const char *listen;
    const char *name;
    int threads;
    int kv_blocks;
    int block_size;
    int max_batched_tokens;
    double itl_target_ms; /* stall-free batching's step budget; 0 = off */
    int max_num_seqs;
    int max_waiting;
    double request_timeout_s; /* deadline of one generation request */
    double stall_timeout_s;   /* a stream whose client reads nothing this long is cancelled */
    size_t stream_buffer;     /* bytes buffered per paused stream before it is cancelled */
    double drain_timeout_s;   /* SIGTERM: how long in-flight work may take */
    int max_prompt_tokens;    /* longest prompt accepted; 0 = the context length */
    int prefix_cache;         /* automatic prefix caching (1) */
    const char *quantize;     /* "q8_0": weights quantized at load; NULL = as stored */
    ig_dtype_t kv_dtype;      /* --kv-dtype: the KV cache's element type (F32) */
    size_t kv_events_buffer;  /* unsent /kv/events bytes before a subscriber is dropped */
} worker_opts_t;

typedef enum { W_LOADING = 0, W_READY, W_FAILED, W_DRAINING } wstate_t;

typedef struct wreq_s wreq_t;
typedef struct kvsub_s kvsub_t;

typedef struct {
    wreq_t *r;
    int index;  /* the choice's index: prompt * n + sample */
    int sample; /* 0 for the first choice of its prompt (the leader) */
    uint64_t seq_id;
    int deferred; /* a follower waiting for its leader's prefill (n > 1) */
    int submitted;
    int finished;
    ig_finish_t finish;
    int error;
    int prompt_tokens, completion_tokens;
    int *prompt; /* token ids */
    int nprompt;
    char *prompt_text; /* echo: the prompt as text */
    size_t prompt_text_len;
    char *text; /* generated text (non-stream) */
    size_t text_len, text_cap;
    ig_api_token_logprob_t *lp; /* logprob entries (prompt first when echo) */
    int nlp, cap_lp;
    size_t lp_offset;     /* text_offset of the next entry */
    int prompt_lp_done;   /* echo entries built */
    int echo_sent;        /* stream: echo chunk sent */
    int lp_sent;          /* stream: entries already sent */
    size_t sent;          /* tools, stream: bytes of text already sent as content */
    double cum_logprob;   /* best_of: the sum of its tokens' logprobs */
    char (*call_ids)[48]; /* tools, stream: ids of the calls announced (heads) */
    size_t *args_sent;    /* tools, stream: bytes of each call's arguments sent */
    int heads, cap_heads; /* tools, stream: calls announced */
} choice_t;

struct wreq_s {
    struct worker_s *w;
    ig_http_req_t *http;
    ig_api_request_t api;
    char id[64];
    long long created;
    choice_t *choices; /* (nchoices) = prompts x per_prompt */
    int nchoices;
    int per_prompt;       /* sequences per prompt: best_of when given, else n */
    uint64_t deadline_ns; /* of every sequence; 0 = none */
    int tools;            /* chat with tools rendered: answers are read for tool calls */
    char forced[IG_API_MAX_NAME + 64]; /* the start of a call a tool_choice forced */
    size_t forced_len;
    const char **tool_names; /* (ntool_names) the declared functions (borrowed from api) */
    int ntool_names;
    int nfinished;
    int http_done;
    int aborted;
    int cancelled;
    int stream_started;
    int paused;            /* the last write said IG_EBUSY */
    uint64_t paused_since; /* ns */
    char *pending;         /* SSE bytes waiting for the drain */
    size_t pending_len, pending_cap;
    struct wreq_s *prev, *next;
};

typedef struct worker_s {
    worker_opts_t o;
    uv_loop_t *loop;
    ig_http_server_t *server;
    uv_signal_t sigterm, sigint;
    uv_async_t async;
    uv_timer_t tick;
    uv_work_t load_work;
    wstate_t state;
    int exit_code;
    char load_err[512];
    uint64_t drain_started;
    int closing;

    ig_model_t *model;
    ig_backend_t *be;
    ig_engine_t *engine;
    ig_tokenizer_t *tok;
    ig_sched_t *sched;
    char model_name[256];
    long long created;
    int vocab;
    int context;
    int kv_tokens; /* tokens the whole KV cache holds */
    int eos[IG_MAX_EOS + 16];
    int neos;
    int chat_stop[32];
    int nchat_stop;
    ig_chat_style_t chat_style;
    ig_chat_tools_t chat_tools; /* the template's tool convention */
    const char *chat_source;    /* "detected", "default" (no template) or "fallback" */
    const char *chat_why;       /* the sentence ig_chat_detect_why() gave */

    wreq_t *reqs; /* generation requests in flight */
    int nreqs;

    /* metrics */
    ig_metric_t *m_ttft, *m_itl, *m_batch, *m_queue, *m_e2e, *m_prompt, *m_gen, *m_preempt,
        *m_finished, *m_rejected, *m_pc_queries, *m_pc_hits, *m_pc_evictions, *m_kv_bytes,
        *m_kv_dropped;
    ig_sched_stats_t last_stats;

    /* GET /kv/events (kv_events.c) */
    kvsub_t *kv_subs;
    int nkv_subs;
    uint64_t kv_cursor; /* events up to this one were sent to every subscriber */
    char kv_epoch[48];  /* this process's cache: a new one after each start */
    ig_load_t kv_load;  /* the last "load" event sent (its strings the worker's) */
} worker_t;

/* ---- metrics.c ----------------------------------------------------------- */

/* The scheduler's stats now; zeros while the model loads (d is a worker_t). */
ig_sched_stats_t ig__worker_stats(void *d);
/* Registers the infergate_worker_* families (once, before the load). */
void ig__worker_metrics_register(worker_t *w);
/* The scheduler's observe hook (engine thread): histogram observations. */
void ig__worker_metrics_observe(void *data, ig_sched_obs_t what, double v);
/* Loop thread: brings the counters up to the scheduler's totals. */
void ig__worker_metrics_sync(worker_t *w);
/* Loop thread, once the engine is up: the KV cache's bytes, by dtype. */
void ig__worker_metrics_kv(worker_t *w);

/* 503 "Loading model" with Retry-After, finishing req: what a supervisor's
 * /health probe waits out. Inline here, as every file of the worker answers
 * it and none of them owns the others. */
static inline void ig__worker_respond_loading(ig_http_req_t *req)
{
    ig_api_error_t e;
    ig_api_error(&e, 503, NULL, "Loading model");
    ig_api_respond_error(req, &e);
}

/* ---- generate.c ---------------------------------------------------------- */

/* The scheduler's detokenizer hook: a token's bytes (none for specials). */
int ig__worker_tok_piece(void *ctx, int token, char *buf, size_t cap);
/* After the load: the chat family (logged with its reason) and its
 * end-of-turn ids. */
void ig__worker_chat_setup(worker_t *w);
/* Cancels every running sequence of r once; the final events still come and
 * finish the request. */
void ig__worker_cancel(wreq_t *r);
/* w->async's callback: drains the scheduler's events into the requests. */
void ig__worker_on_async(uv_async_t *h);
/* The scheduler's notify hook (engine thread): wakes w->async (data). */
void ig__worker_on_sched_notify(void *data);
/* ---- tokenize.c ----------------------------------------------------------- */

/* POST /v1/tokenize: a prompt or chat messages (with tools) as this worker
 * tokenizes them, {"count", "max_model_len", "tokens"}; finishes req. */
void ig__worker_tokenize(worker_t *w, ig_http_req_t *req);
/* POST /v1/detokenize: {"tokens": [ids]} -> {"prompt": text}; finishes req. */
void ig__worker_detokenize(worker_t *w, ig_http_req_t *req);
/* GET /v1/tokenizer/NAME: one of the model's tokenizer files (tokenize.c). */
void ig__worker_tokenizer_file(worker_t *w, ig_http_req_t *req, const char *name);

/* POST /v1/completions and /v1/chat/completions: parse, tokenize, submit;
 * answers errors itself and finishes req, now or when the last choice ends. */
void ig__worker_generate(worker_t *w, ig_http_req_t *req, ig_api_kind_t kind);

/* The /load report of w now (metrics.c). */
void ig__worker_load_of(worker_t *w, ig_load_t *out);

/* ---- kv_events.c ---------------------------------------------------------- */

/* GET /kv/events: subscribes req (a snapshot, then the events); answers
 * 503 while loading or draining. */
void ig__worker_kv_subscribe(worker_t *w, ig_http_req_t *req);
/* Loop thread: sends the cache's new events to every subscriber. */
void ig__worker_kv_pump(worker_t *w);
/* Loop thread: a "load" event to every subscriber when the /load report
 * has moved since the last one. */
void ig__worker_kv_load(worker_t *w);
/* Once a second: pump, and a comment line as a heartbeat. */
void ig__worker_kv_tick(worker_t *w);
/* Ends every subscription (the worker drains). */
void ig__worker_kv_close_all(worker_t *w);

#endif
