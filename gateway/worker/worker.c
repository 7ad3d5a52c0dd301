/*
 * infergate worker: one execution-core instance. It loads the model in the
 * background (/health says 503 "Loading model" meanwhile), then serves the
 * OpenAI endpoints through the api module, with the scheduler running the
 * engine on its own thread. Events come back to the loop through one
 * uv_async_t; the engine thread touches nothing else of the loop's.
 *
 * Lifecycle of one generation request (wreq_t): parsed and tokenized on the
 * loop, one scheduler sequence per prompt (a choice), events fill the choices,
 * the HTTP request is finished once every choice has its final event (also
 * after a client abort: the sequences are cancelled and their final events
 * still come). Only then is the wreq freed, so no event can outlive it.
 */
#include "infergate/api.h"
#include "infergate/chat.h"
#include "infergate/cli.h"
#include "infergate/engine.h"
#include "infergate/error.h"
#include "infergate/http.h"
#include "infergate/kernels.h"
#include "infergate/load.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/model.h"
#include "infergate/scheduler.h"
#include "infergate/tokenizer.h"

#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
    int max_num_seqs;
    int max_waiting;
    double request_timeout_s; /* deadline of one generation request */
    double stall_timeout_s;   /* a stream whose client reads nothing this long is cancelled */
    size_t stream_buffer;     /* bytes buffered per paused stream before it is cancelled */
    double drain_timeout_s;   /* SIGTERM: how long in-flight work may take */
    int max_prompt_tokens;    /* longest prompt accepted; 0 = the context length */
} worker_opts_t;

typedef enum { W_LOADING = 0, W_READY, W_FAILED, W_DRAINING } wstate_t;

typedef struct wreq_s wreq_t;

typedef struct {
    wreq_t *r;
    int index;
    uint64_t seq_id;
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
    size_t lp_offset;   /* text_offset of the next entry */
    int prompt_lp_done; /* echo entries built */
    int echo_sent;      /* stream: echo chunk sent */
    int lp_sent;        /* stream: entries already sent */
} choice_t;

struct wreq_s {
    struct worker_s *w;
    ig_http_req_t *http;
    ig_api_request_t api;
    char id[64];
    long long created;
    choice_t *choices;
    int nchoices;
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
    const char *chat_source; /* "detected", "default" (no template) or "fallback" */
    const char *chat_why;    /* the sentence ig_chat_detect_why() gave */

    wreq_t *reqs; /* generation requests in flight */
    int nreqs;

    /* metrics */
    ig_metric_t *m_ttft, *m_itl, *m_batch, *m_queue, *m_e2e, *m_prompt, *m_gen, *m_preempt,
        *m_finished, *m_rejected;
    ig_sched_stats_t last_stats;
} worker_t;

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

/* ---- metrics (thin: one place that knows the metric names) --------------- */

static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

/* The scheduler's counters now; zeros while the model loads. */
static ig_sched_stats_t stats_of(void *d)
{
    worker_t *w = d;
    ig_sched_stats_t st;
    memset(&st, 0, sizeof(st));
    if (w->sched)
        ig_sched_stats(w->sched, &st);
    return st;
}

static double g_running(void *d)
{
    return stats_of(d).running;
}

static double g_waiting(void *d)
{
    return stats_of(d).waiting;
}

static double g_kv_usage(void *d)
{
    ig_sched_stats_t st = stats_of(d);
    return st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0;
}

static double g_decode_rate(void *d)
{
    return stats_of(d).decode_tokens_per_s;
}

static double g_ready(void *d)
{
    return ((worker_t *)d)->state == W_READY;
}

static void metrics_register(worker_t *w)
{
    ig_metrics_gauge_fn("infergate_worker_requests_running", "Sequences in the running batch",
                        g_running, w);
    ig_metrics_gauge_fn("infergate_worker_requests_waiting", "Sequences waiting for admission",
                        g_waiting, w);
    ig_metrics_gauge_fn("infergate_worker_kv_cache_usage_ratio", "Share of KV blocks in use",
                        g_kv_usage, w);
    ig_metrics_gauge_fn("infergate_worker_decode_tokens_per_second",
                        "Decode throughput (EWMA over steps)", g_decode_rate, w);
    ig_metrics_gauge_fn("infergate_worker_ready", "1 when the worker takes traffic", g_ready, w);
    w->m_ttft = ig_metrics_histogram("infergate_worker_time_to_first_token_seconds",
                                     "Submit to first token", NULL, NULL, 0);
    w->m_itl = ig_metrics_histogram("infergate_worker_inter_token_latency_seconds",
                                    "Time between two tokens of a sequence", NULL, NULL, 0);
    w->m_e2e = ig_metrics_histogram("infergate_worker_e2e_request_latency_seconds",
                                    "Submit to finish of a sequence", NULL, NULL, 0);
    w->m_queue = ig_metrics_histogram("infergate_worker_request_queue_time_seconds",
                                      "Submit to first admission", NULL, NULL, 0);
    w->m_batch =
        ig_metrics_histogram("infergate_worker_batch_size", "Sequences in one forward pass", NULL,
                             batch_buckets, sizeof(batch_buckets) / sizeof(batch_buckets[0]));
    w->m_prompt =
        ig_metrics_counter("infergate_worker_prompt_tokens_total", "Prompt tokens prefilled", NULL);
    w->m_gen =
        ig_metrics_counter("infergate_worker_generation_tokens_total", "Tokens generated", NULL);
    w->m_preempt = ig_metrics_counter("infergate_worker_preemptions_total",
                                      "Sequences preempted for KV blocks", NULL);
    w->m_finished = ig_metrics_counter("infergate_worker_request_success_total",
                                       "Sequences finished, by reason", "finished_reason");
    w->m_rejected = ig_metrics_counter("infergate_worker_requests_rejected_total",
                                       "Requests refused because the queue was full", NULL);
}

/* Engine thread: histogram observations. */
static void metrics_observe(void *data, ig_sched_obs_t what, double v)
{
    worker_t *w = data;
    ig_metric_t *m = what == IG_SCHED_OBS_TTFT         ? w->m_ttft
                     : what == IG_SCHED_OBS_ITL        ? w->m_itl
                     : what == IG_SCHED_OBS_BATCH      ? w->m_batch
                     : what == IG_SCHED_OBS_QUEUE_TIME ? w->m_queue
                                                       : w->m_e2e;
    if (m)
        ig_metric_observe(m, v);
}

/* Loop thread: counters follow the scheduler's totals. */
static void metrics_sync(worker_t *w)
{
    if (!w->sched || !w->m_prompt)
        return;
    ig_sched_stats_t st, *l = &w->last_stats;
    ig_sched_stats(w->sched, &st);
    ig_metric_add(w->m_prompt, (double)(st.prompt_tokens_total - l->prompt_tokens_total));
    ig_metric_add(w->m_gen, (double)(st.generation_tokens_total - l->generation_tokens_total));
    ig_metric_add(w->m_preempt, (double)(st.preemptions_total - l->preemptions_total));
    ig_metric_add(w->m_rejected, (double)(st.rejected_total - l->rejected_total));
    for (int f = IG_FINISH_STOP; f <= IG_FINISH_ERROR; f++)
        if (st.finished_total[f] != l->finished_total[f])
            ig_metric_add(w->m_finished, (double)(st.finished_total[f] - l->finished_total[f]),
                          ig_finish_reason((ig_finish_t)f));
    *l = st;
}

/* ---- tokenizer layer (thin: the worker's only contact with it) ----------- */

static int tok_piece(void *ctx, int token, char *buf, size_t cap)
{
    const ig_tokenizer_t *tok = ctx;
    if (ig_tokenizer_is_special(tok, token))
        return 0;
    const char *b;
    size_t len;
    if (ig_tokenizer_token_bytes(tok, token, &b, &len) < 0)
        return 0;
    if (len > cap)
        len = cap;
    memcpy(buf, b, len);
    return (int)len;
}

/* The bytes of a token as logprobs show it (special tokens by their name). */
static void tok_bytes(worker_t *w, int token, const char **b, size_t *len)
{
    if (ig_tokenizer_is_special(w->tok, token)) {
        const char *s = ig_tokenizer_token_str(w->tok, token);
        *b = s ? s : "";
        *len = strlen(*b);
        return;
    }
    if (ig_tokenizer_token_bytes(w->tok, token, b, len) < 0) {
        *b = "";
        *len = 0;
    }
}

static int tok_encode(worker_t *w, const char *text, size_t len, int add_bos, int **ids, int *n)
{
    ig_tokvec_t v;
    ig_tokvec_init(&v);
    int rc = ig_tokenizer_encode(w->tok, text, len, add_bos ? IG_TOKENIZER_ADD_BOS : 0, &v);
    if (rc < 0) {
        ig_tokvec_dispose(&v);
        return rc;
    }
    *ids = malloc(sizeof(int) * (v.len ? v.len : 1));
    if (!*ids) {
        ig_tokvec_dispose(&v);
        return IG_ENOMEM;
    }
    for (size_t i = 0; i < v.len; i++)
        (*ids)[i] = v.ids[i];
    *n = (int)v.len;
    ig_tokvec_dispose(&v);
    return 0;
}

/* Chat messages into prompt ids with the model's template: markers as
 * their special tokens, message content as plain text. */
static int chat_encode(worker_t *w, const ig_api_request_t *a, int **ids, int *n, char *err,
                       size_t errlen)
{
    ig_chat_msg_t *m = calloc((size_t)a->nmessages, sizeof(*m));
    if (!m)
        return IG_ENOMEM;
    for (int i = 0; i < a->nmessages; i++) {
        /* OpenAI's newer "developer" role is the system prompt. */
        m[i].role = strcmp(a->messages[i].role, "developer") == 0 ? "system" : a->messages[i].role;
        m[i].content = a->messages[i].content;
        m[i].content_len = strlen(a->messages[i].content);
    }
    ig_tokvec_t v;
    ig_tokvec_init(&v);
    int rc = ig_chat_encode(w->chat_style, w->tok, m, (size_t)a->nmessages, 1, &v, err, errlen);
    free(m);
    if (rc == 0) {
        *ids = malloc(sizeof(int) * (v.len ? v.len : 1));
        rc = *ids ? 0 : IG_ENOMEM;
        for (size_t i = 0; rc == 0 && i < v.len; i++)
            (*ids)[i] = v.ids[i];
        *n = (int)v.len;
    }
    ig_tokvec_dispose(&v);
    return rc;
}

/* The chat family, said once at load (a fallback as a warning: the model
 * may have been trained on another format), and its end-of-turn ids. */
static void chat_setup(worker_t *w)
{
    const char *tpl = ig_tokenizer_chat_template(w->tok);
    int32_t ids[32];
    w->chat_style = ig_chat_detect_why(tpl, &w->chat_why);
    w->chat_source = tpl == NULL                    ? "default"
                     : ig_chat_detect_fallback(tpl) ? "fallback"
                                                    : "detected";
    if (strcmp(w->chat_source, "fallback") == 0)
        IG_WARN("chat template: %s (%s)", ig_chat_style_name(w->chat_style), w->chat_why);
    else
        IG_INFO("chat template: %s (%s)", ig_chat_style_name(w->chat_style), w->chat_why);
    size_t n = ig_chat_stop_ids(w->chat_style, w->tok, ids, 32);
    for (size_t i = 0; i < n && i < 32; i++)
        w->chat_stop[w->nchat_stop++] = ids[i];
}

/* ---- small HTTP helpers --------------------------------------------------- */

static void respond_json(ig_http_req_t *req, int status, json_t *doc)
{
    size_t len = 0;
    char *s = doc ? ig_api_dumps(doc, &len) : NULL;
    json_decref(doc);
    if (!s) {
        ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    ig_http_respond(req, status, "application/json", s, len);
    free(s);
}

static void respond_api_error(ig_http_req_t *req, const ig_api_error_t *e)
{
    if (e->status == 429 || e->status == 503)
        ig_http_add_header(req, "Retry-After", "1");
    respond_json(req, e->status, ig_api_error_json(e));
}

static void respond_loading(ig_http_req_t *req)
{
    static const char body[] =
        "{\"error\":{\"code\":503,\"message\":\"Loading model\",\"type\":\"unavailable_error\"}}";
    ig_http_add_header(req, "Retry-After", "1");
    ig_http_respond(req, 503, "application/json", body, sizeof(body) - 1);
}

/* ---- generation requests: memory ----------------------------------------- */

static void choice_dispose(choice_t *c)
{
    free(c->prompt);
    free(c->prompt_text);
    free(c->text);
    for (int i = 0; i < c->nlp; i++)
        free((void *)c->lp[i].top);
    free(c->lp);
}

static void wreq_free(wreq_t *r)
{
    worker_t *w = r->w;
    if (r->prev)
        r->prev->next = r->next;
    else if (w->reqs == r)
        w->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    w->nreqs--;
    for (int i = 0; i < r->nchoices; i++)
        choice_dispose(&r->choices[i]);
    free(r->choices);
    free(r->pending);
    ig_api_request_dispose(&r->api);
    free(r);
}

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return IG_ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* One logprob entry: token's bytes, its logprob and the top list. */
static int add_lp(worker_t *w, choice_t *c, const ig_sample_t *s, int has, int token, int ntop)
{
    if (c->nlp == c->cap_lp) {
        int cap = c->cap_lp ? c->cap_lp * 2 : 32;
        ig_api_token_logprob_t *lp = realloc(c->lp, sizeof(*lp) * (size_t)cap);
        if (!lp)
            return IG_ENOMEM;
        c->lp = lp;
        c->cap_lp = cap;
    }
    ig_api_token_logprob_t *e = &c->lp[c->nlp];
    memset(e, 0, sizeof(*e));
    tok_bytes(w, token, &e->token, &e->len);
    e->has_logprob = has;
    e->text_offset = c->lp_offset;
    /* Special tokens are listed by name but are not part of the text. */
    if (!ig_tokenizer_is_special(w->tok, token))
        c->lp_offset += e->len;
    if (has && s) {
        e->logprob = s->logprob;
        int n = s->ntop < ntop ? s->ntop : ntop;
        if (n > 0) {
            ig_api_top_logprob_t *top = calloc((size_t)n, sizeof(*top));
            if (!top)
                return IG_ENOMEM;
            for (int k = 0; k < n; k++) {
                tok_bytes(w, s->top_tokens[k], &top[k].token, &top[k].len);
                top[k].logprob = s->top_logprobs[k];
            }
            e->top = top;
            e->ntop = n;
        }
    }
    c->nlp++;
    return 0;
}

/* ---- generation requests: output ------------------------------------------ */

static void on_drain(ig_http_req_t *req, void *data);

/* Stops (or restarts) generation for a stream whose client reads slowly, so
 * that what is held back stays a token or so per choice. */
static void pause_choices(wreq_t *r, int paused)
{
    for (int i = 0; i < r->nchoices; i++)
        if (r->choices[i].submitted && !r->choices[i].finished)
            ig_sched_pause(r->w->sched, r->choices[i].seq_id, paused);
}

static void stream_write(wreq_t *r, const char *p, size_t n)
{
    if (r->aborted || r->http_done || n == 0)
        return;
    if (r->paused) {
        append(&r->pending, &r->pending_len, &r->pending_cap, p, n);
        return;
    }
    int rc = ig_http_stream_write(r->http, p, n);
    if (rc == IG_EBUSY) {
        /* Queued, but the client reads slower than we write: pause the
         * sequences and hold what is already on its way (bounded, see tick)
         * until the drain callback. */
        r->paused = 1;
        r->paused_since = now_ns();
        pause_choices(r, 1);
    }
}

static void on_drain(ig_http_req_t *req, void *data)
{
    wreq_t *r = data;
    if (!r->paused)
        return;
    r->paused = 0;
    if (r->pending_len) {
        size_t n = r->pending_len;
        r->pending_len = 0;
        stream_write(r, r->pending, n);
    }
    if (!r->paused)
        pause_choices(r, 0);
}

static void cancel_all(wreq_t *r)
{
    if (r->cancelled)
        return;
    r->cancelled = 1;
    for (int i = 0; i < r->nchoices; i++)
        if (r->choices[i].submitted && !r->choices[i].finished)
            ig_sched_cancel(r->w->sched, r->choices[i].seq_id);
}

static const char *finish_reason(ig_finish_t f)
{
    return f == IG_FINISH_LENGTH ? "length" : "stop";
}

/* The first non-normal finish of any choice decides the error, if any. */
static int request_error(wreq_t *r, ig_api_error_t *e)
{
    for (int i = 0; i < r->nchoices; i++) {
        choice_t *c = &r->choices[i];
        if (c->finish == IG_FINISH_TIMEOUT) {
            ig_api_error(e, 504, NULL, "the request's deadline passed after %d tokens",
                         c->completion_tokens);
            return 1;
        }
        if (c->finish == IG_FINISH_ERROR || c->finish == IG_FINISH_CANCELLED) {
            ig_api_error(e, c->finish == IG_FINISH_CANCELLED ? 503 : 500, NULL, "%s: %s",
                         c->finish == IG_FINISH_CANCELLED ? "generation cancelled"
                                                          : "generation failed",
                         ig_strerror(c->error));
            return 1;
        }
    }
    return 0;
}

static void usage_of(wreq_t *r, ig_api_usage_t *u)
{
    u->prompt_tokens = u->completion_tokens = 0;
    for (int i = 0; i < r->nchoices; i++) {
        u->prompt_tokens += r->choices[i].nprompt;
        u->completion_tokens += r->choices[i].completion_tokens;
    }
}

static void finish_whole(wreq_t *r)
{
    ig_api_error_t e;
    if (r->aborted) {
        ig_http_respond(r->http, 499, "text/plain", "", 0);
        return;
    }
    if (request_error(r, &e)) {
        respond_api_error(r->http, &e);
        return;
    }
    ig_api_choice_t *ch = calloc((size_t)r->nchoices, sizeof(*ch));
    char **texts = calloc((size_t)r->nchoices, sizeof(char *));
    if (!ch || !texts) {
        free(ch);
        free(texts);
        ig_http_respond_error(r->http, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    for (int i = 0; i < r->nchoices; i++) {
        choice_t *c = &r->choices[i];
        ch[i].index = i;
        if (r->api.echo) {
            size_t n = c->prompt_text_len + c->text_len;
            texts[i] = malloc(n + 1);
            if (texts[i]) {
                memcpy(texts[i], c->prompt_text, c->prompt_text_len);
                if (c->text_len)
                    memcpy(texts[i] + c->prompt_text_len, c->text, c->text_len);
                texts[i][n] = 0;
                ch[i].text = texts[i];
                ch[i].len = n;
            }
        } else {
            ch[i].text = c->text ? c->text : "";
            ch[i].len = c->text_len;
        }
        ch[i].finish_reason = finish_reason(c->finish);
        ch[i].has_logprobs = r->api.logprobs >= 0;
        ch[i].lp = c->lp;
        ch[i].nlp = c->nlp;
    }
    ig_api_usage_t u;
    usage_of(r, &u);
    respond_json(r->http, 200,
                 ig_api_response_json(r->api.kind, r->id, r->created, r->w->model_name, ch,
                                      r->nchoices, &u));
    for (int i = 0; i < r->nchoices; i++)
        free(texts[i]);
    free(texts);
    free(ch);
}

/* Sends one chunk for choice c: text and the logprob entries not yet sent. */
static void send_chunk(wreq_t *r, choice_t *c, const char *text, size_t len, const char *finish,
                       int lp_upto)
{
    ig_api_choice_t ch = {.index = c->index,
                          .text = text,
                          .len = len,
                          .finish_reason = finish,
                          .has_logprobs = r->api.logprobs >= 0,
                          .lp = c->lp + c->lp_sent,
                          .nlp = lp_upto - c->lp_sent};
    if (!finish && len == 0 && ch.nlp == 0)
        return; /* nothing to say yet (text held back) */
    size_t n;
    char *s = ig_api_chunk_sse(r->api.kind, r->id, r->created, r->w->model_name, &ch, 0,
                               r->api.include_usage, &n);
    c->lp_sent = lp_upto;
    if (s)
        stream_write(r, s, n);
    free(s);
}

static void stream_end(wreq_t *r)
{
    ig_api_error_t e;
    if (!r->aborted) {
        if (request_error(r, &e) && !r->cancelled) {
            size_t n;
            char *s = ig_api_error_sse(&e, &n);
            if (s)
                stream_write(r, s, n);
            free(s);
        } else if (r->api.include_usage) {
            ig_api_usage_t u;
            usage_of(r, &u);
            size_t n;
            char *s = ig_api_usage_sse(r->api.kind, r->id, r->created, r->w->model_name, &u, &n);
            if (s)
                stream_write(r, s, n);
            free(s);
        }
        stream_write(r, IG_API_SSE_DONE, strlen(IG_API_SSE_DONE));
        if (r->paused && r->pending_len) {
            /* Hand the rest to the server's queue: ending the stream is the
             * last write, and the connection owns its bytes from here. */
            r->paused = 0;
            size_t n = r->pending_len;
            r->pending_len = 0;
            ig_http_stream_write(r->http, r->pending, n);
        }
    }
    ig_http_stream_end(r->http);
}

static void on_event(const ig_sched_event_t *ev, void *data)
{
    choice_t *c = ev->user;
    wreq_t *r = c->r;
    worker_t *w = data;
    int want_lp = r->api.logprobs >= 0;
    int ntop = want_lp ? r->api.logprobs : 0;

    /* Echo: prompt entries, the first with a null logprob. */
    if (r->api.echo && want_lp) {
        if (!c->prompt_lp_done) {
            add_lp(w, c, NULL, 0, c->prompt[0], 0);
            c->prompt_lp_done = 1;
        }
        for (int i = 0; i < ev->nprompt_lp; i++) {
            int pos = ev->prompt_lp_from + i;
            if (pos == c->prompt_lp_done && pos < c->nprompt) {
                add_lp(w, c, &ev->prompt_lp[i], 1, c->prompt[pos], ntop);
                c->prompt_lp_done++;
            }
        }
    }
    if (r->api.echo && c->lp_offset < c->prompt_text_len && (ev->ntokens || ev->finish))
        c->lp_offset = c->prompt_text_len; /* generated offsets follow the echoed text */
    int lp_prompt_end = c->nlp;
    for (int i = 0; i < ev->ntokens; i++)
        if (want_lp)
            add_lp(w, c, &ev->tokens[i], 1, ev->tokens[i].token, ntop);
    if (ev->finish != IG_FINISH_NONE) {
        c->finished = 1;
        c->finish = ev->finish;
        c->error = ev->error;
        c->completion_tokens = ev->completion_tokens;
        r->nfinished++;
    }

    if (r->api.stream) {
        if (!r->http_done) {
            if (r->api.echo && !c->echo_sent && (ev->ntokens || ev->finish)) {
                send_chunk(r, c, c->prompt_text ? c->prompt_text : "", c->prompt_text_len, NULL,
                           lp_prompt_end);
                c->echo_sent = 1;
            }
            int normal = ev->finish == IG_FINISH_STOP || ev->finish == IG_FINISH_LENGTH;
            send_chunk(r, c, ev->text, ev->text_len, normal ? finish_reason(ev->finish) : NULL,
                       c->nlp);
        }
    } else if (ev->text_len) {
        append(&c->text, &c->text_len, &c->text_cap, ev->text, ev->text_len);
    }

    if (r->nfinished == r->nchoices && !r->http_done) {
        if (r->api.stream)
            stream_end(r);
        else
            finish_whole(r);
        r->http_done = 1;
        wreq_free(r);
    }
}

static void on_async(uv_async_t *h)
{
    worker_t *w = h->data;
    if (w->sched)
        ig_sched_drain(w->sched, on_event, w);
}

static void on_sched_notify(void *data)
{
    uv_async_send(data);
}

static void on_abort(ig_http_req_t *req, void *data)
{
    wreq_t *r = data;
    r->aborted = 1;
    cancel_all(r);
}

/* ---- generation requests: intake ------------------------------------------ */

static int prepare_prompts(worker_t *w, wreq_t *r, ig_api_error_t *e)
{
    ig_api_request_t *a = &r->api;
    int n = a->kind == IG_API_CHAT ? 1 : a->nprompts;
    r->choices = calloc((size_t)n, sizeof(choice_t));
    if (!r->choices)
        return ig_api_error(e, 500, NULL, "out of memory");
    r->nchoices = n;
    for (int i = 0; i < n; i++) {
        choice_t *c = &r->choices[i];
        c->r = r;
        c->index = i;
        int rc;
        if (a->kind == IG_API_CHAT) {
            char err[256] = "";
            rc = chat_encode(w, a, &c->prompt, &c->nprompt, err, sizeof(err));
            if (rc == IG_EINVAL)
                return ig_api_error(e, 400, "messages", "%s",
                                    err[0] ? err : "the messages cannot be rendered");
        } else if (a->prompts[i].text) {
            const ig_api_prompt_t *p = &a->prompts[i];
            size_t bad = 0;
            if (ig_tokenizer_utf8_check(p->text, p->text_len, &bad) < 0)
                return ig_api_error(e, 400, "prompt", "'prompt' is not valid UTF-8 (byte %zu)",
                                    bad);
            rc = tok_encode(w, p->text, p->text_len, 1, &c->prompt, &c->nprompt);
            if (rc == 0 && a->echo) {
                c->prompt_text = strdup(p->text);
                c->prompt_text_len = p->text_len;
            }
        } else {
            const ig_api_prompt_t *p = &a->prompts[i];
            for (int k = 0; k < p->nids; k++)
                if (p->ids[k] >= w->vocab)
                    return ig_api_error(e, 400, "prompt",
                                        "token id %d at position %d is outside the vocabulary "
                                        "(size %d)",
                                        p->ids[k], k, w->vocab);
            c->prompt = malloc(sizeof(int) * (size_t)p->nids);
            rc = c->prompt ? 0 : IG_ENOMEM;
            if (rc == 0) {
                memcpy(c->prompt, p->ids, sizeof(int) * (size_t)p->nids);
                c->nprompt = p->nids;
            }
            if (rc == 0 && a->echo) {
                int32_t *ids32 = malloc(sizeof(int32_t) * (size_t)p->nids);
                char *txt = NULL;
                size_t tl = 0;
                for (int k = 0; ids32 && k < p->nids; k++)
                    ids32[k] = p->ids[k];
                if (ids32 && ig_tokenizer_decode(w->tok, ids32, (size_t)p->nids,
                                                 IG_TOKENIZER_SKIP_SPECIAL, &txt, &tl) == 0) {
                    c->prompt_text = txt;
                    c->prompt_text_len = tl;
                }
                free(ids32);
            }
        }
        if (rc == IG_ENOMEM)
            return ig_api_error(e, 500, NULL, "out of memory");
        if (rc < 0)
            return ig_api_error(e, 400, a->kind == IG_API_CHAT ? "messages" : "prompt",
                                "the prompt cannot be tokenized: %s", ig_strerror(rc));
        if (ig_api_check_prompt_limit(a, c->nprompt, w->o.max_prompt_tokens, e) < 0 ||
            ig_api_check_context(a, c->nprompt, w->context, e) < 0)
            return IG_EINVAL;
    }
    return 0;
}

static void handle_generate(worker_t *w, ig_http_req_t *req, ig_api_kind_t kind)
{
    ig_api_error_t e;
    if (w->state == W_LOADING) {
        respond_loading(req);
        return;
    }
    if (w->state != W_READY) {
        ig_api_error(&e, 503, NULL,
                     w->state == W_DRAINING ? "the worker is shutting down"
                                            : "the model failed "
                                              "to load");
        respond_api_error(req, &e);
        return;
    }
    wreq_t *r = calloc(1, sizeof(*r));
    if (!r) {
        ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    r->w = w;
    r->http = req;
    r->next = w->reqs;
    if (w->reqs)
        w->reqs->prev = r;
    w->reqs = r;
    w->nreqs++;

    size_t len;
    const char *body = ig_http_req_body(req, &len);
    if (ig_api_parse(kind, body, len, &r->api, &e) < 0)
        goto fail;
    if (r->api.model && strcmp(r->api.model, w->model_name) != 0) {
        ig_api_error(&e, 404, "model", "The model `%s` does not exist.", r->api.model);
        e.code = "model_not_found";
        goto fail;
    }
    if (prepare_prompts(w, r, &e) < 0)
        goto fail;

    /* Queue room for every prompt first: no half-submitted batch. Only this
     * thread submits, so the check cannot go stale before the submits. */
    ig_sched_stats_t st;
    ig_sched_stats(w->sched, &st);
    if (st.waiting + r->nchoices > st.max_waiting) {
        ig_api_error(&e, 429, NULL, "the worker's queue is full (%d waiting); retry later",
                     st.waiting);
        char ra[32];
        snprintf(ra, sizeof(ra), "%d", (int)ceil(st.est_wait_s > 1 ? st.est_wait_s : 1));
        ig_http_add_header(req, "Retry-After", ra);
        respond_json(req, 429, ig_api_error_json(&e));
        wreq_free(r);
        return;
    }

    ig_api_make_id(r->id, sizeof(r->id), kind == IG_API_CHAT ? "chatcmpl-" : "cmpl-");
    r->created = (long long)time(NULL);
    uint64_t deadline = 0;
    double tmo = w->o.request_timeout_s;
    const char *h = ig_http_req_header(req, "x-infergate-timeout-ms");
    if (h && atof(h) > 0 && (tmo <= 0 || atof(h) / 1000.0 < tmo))
        tmo = atof(h) / 1000.0;
    if (tmo > 0)
        deadline = ig_http_req_start_ns(req) + (uint64_t)(tmo * 1e9);

    for (int i = 0; i < r->nchoices; i++) {
        choice_t *c = &r->choices[i];
        ig_sched_req_t sr;
        memset(&sr, 0, sizeof(sr));
        sr.prompt = c->prompt;
        sr.nprompt = c->nprompt;
        sr.sampling = r->api.sampling;
        sr.has_seed = r->api.has_seed;
        sr.seed = r->api.seed + (uint64_t)i; /* each prompt of a batch its own stream */
        if (r->api.max_tokens > 0) {
            sr.max_tokens = r->api.max_tokens;
        } else { /* chat without a limit: up to the context, and what the KV cache holds */
            int room = w->context < w->kv_tokens ? w->context : w->kv_tokens;
            sr.max_tokens = room - c->nprompt > 1 ? room - c->nprompt : 1;
        }
        sr.ignore_eos = r->api.ignore_eos;
        int ids[IG_API_MAX_STOP_IDS + 32];
        int nids = 0;
        for (int k = 0; k < r->api.nstop_ids; k++)
            ids[nids++] = r->api.stop_ids[k];
        /* The template's end-of-turn tokens are EOS-like: ignore_eos (what
         * benchmarks send to get the asked length) runs through them too, as
         * vLLM does with generation_config's EOS ids. */
        if (kind == IG_API_CHAT && !r->api.ignore_eos)
            for (int k = 0; k < w->nchat_stop; k++)
                ids[nids++] = w->chat_stop[k];
        sr.stop_ids = ids;
        sr.nstop_ids = nids;
        sr.stop = (const char *const *)r->api.stop;
        sr.nstop = r->api.nstop;
        sr.logprobs = r->api.logprobs;
        sr.prompt_logprobs = r->api.echo && r->api.logprobs >= 0;
        sr.deadline_ns = deadline;
        sr.user = c;
        int rc = ig_sched_submit(w->sched, &sr, &c->seq_id);
        if (rc < 0) {
            if (i == 0) {
                if (rc == IG_EFULL)
                    ig_api_error(&e, 429, NULL, "the worker's queue is full; retry later");
                else if (rc == IG_ETOOLONG)
                    ig_api_error(&e, 400, kind == IG_API_CHAT ? "messages" : "prompt",
                                 "the prompt (%d tokens) and max_tokens (%d) do not fit in this "
                                 "worker's KV cache",
                                 c->nprompt, sr.max_tokens);
                else
                    ig_api_error(&e, 500, NULL, "cannot queue the request: %s", ig_strerror(rc));
                goto fail;
            }
            /* Later prompts of a batch: the earlier ones are running, so
             * finish this choice as failed; the response reports it. */
            c->finished = 1;
            c->finish = IG_FINISH_ERROR;
            c->error = rc;
            r->nfinished++;
            continue;
        }
        c->submitted = 1;
    }
    ig_http_req_set_data(req, r);
    ig_http_req_on_abort(req, on_abort, r);
    if (r->api.stream) {
        ig_http_req_on_drain(req, on_drain, r);
        ig_http_add_header(req, "Cache-Control", "no-cache");
        ig_http_stream_start(req, 200, "text/event-stream");
        r->stream_started = 1;
        if (kind == IG_API_CHAT) {
            for (int i = 0; i < r->nchoices; i++) {
                ig_api_choice_t ch = {.index = i, .text = "", .len = 0};
                size_t n;
                char *s = ig_api_chunk_sse(kind, r->id, r->created, w->model_name, &ch, 1,
                                           r->api.include_usage, &n);
                if (s)
                    stream_write(r, s, n);
                free(s);
            }
        }
    }
    if (r->nfinished == r->nchoices) { /* every submit failed after the first */
        if (r->api.stream)
            stream_end(r);
        else
            finish_whole(r);
        r->http_done = 1;
        wreq_free(r);
    }
    return;
fail:
    respond_api_error(req, &e);
    /* Submitted choices (none when i == 0 failed) cannot exist here. */
    wreq_free(r);
}

/* ---- other endpoints ---------------------------------------------------- */

static void handle_load(worker_t *w, ig_http_req_t *req)
{
    ig_sched_stats_t st = stats_of(w);
    ig_load_t l;
    ig_load_init(&l);
    l.has = IG_LOAD_WORKER_FIELDS | (w->chat_source != NULL ? IG_LOAD_CHAT_TEMPLATE : 0);
    l.waiting = st.waiting;
    l.running = st.running;
    l.kv_blocks_used = st.kv_blocks_used;
    l.kv_blocks_total = st.kv_blocks_total;
    l.decode_tokens_per_s = st.decode_tokens_per_s;
    l.prefill_tokens_per_s = st.prefill_tokens_per_s;
    l.est_wait_s = st.est_wait_s;
    l.max_waiting = w->o.max_waiting;
    l.model = w->model_name;
    l.state = w->state == W_LOADING    ? "loading"
              : w->state == W_READY    ? "ready"
              : w->state == W_DRAINING ? "draining"
                                       : "failed";
    l.ready = w->state == W_READY;
    l.inflight = w->nreqs;
    l.max_num_seqs = w->o.max_num_seqs;
    l.max_batched_tokens = w->o.max_batched_tokens;
    if (w->chat_source != NULL)
        l.chat_template = ig_chat_style_name(w->chat_style);
    json_t *o = ig_load_encode(&l);
    respond_json(req, 200, o);
}

static void handle_metrics(worker_t *w, ig_http_req_t *req)
{
    metrics_sync(w);
    size_t len = 0;
    char *s = ig_metrics_render(&len);
    if (!s) {
        ig_http_respond_error(req, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    ig_http_respond(req, 200, "text/plain; version=0.0.4", s, len);
    free(s);
}

/* The one model, with what a client cannot see elsewhere: the context, the
 * prompt limit and the chat template in use (and why it was chosen). */
static void handle_models(worker_t *w, ig_http_req_t *req)
{
    const char *ids[1] = {w->model_name};
    json_t *doc = ig_api_models_json(ids, 1, w->created, "infergate");
    json_t *m = json_array_get(json_object_get(doc, "data"), 0);
    if (m != NULL && w->tok != NULL && w->chat_source != NULL) {
        json_object_set_new(m, "max_model_len", json_integer(w->context));
        json_object_set_new(
            m, "max_prompt_tokens",
            json_integer(w->o.max_prompt_tokens > 0 ? w->o.max_prompt_tokens : w->context));
        json_object_set_new(m, "chat_template", json_string(ig_chat_style_name(w->chat_style)));
        json_object_set_new(m, "chat_template_source", json_string(w->chat_source));
        json_object_set_new(m, "chat_template_reason", json_string(w->chat_why));
    }
    respond_json(req, 200, doc);
}

static void on_request(ig_http_req_t *req, void *data)
{
    worker_t *w = data;
    const char *m = ig_http_req_method(req), *p = ig_http_req_path(req);
    int get = strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0, post = strcmp(m, "POST") == 0;
    if (strcmp(p, "/v1/completions") == 0 || strcmp(p, "/v1/chat/completions") == 0) {
        int chat = p[4] == 'c' && p[5] == 'h';
        ig_http_req_set_route(req, chat ? "/v1/chat/completions" : "/v1/completions");
        if (!post) {
            ig_http_add_header(req, "Allow", "POST");
            ig_http_respond_error(req, 405, NULL, NULL, NULL, "use POST");
            return;
        }
        handle_generate(w, req, chat ? IG_API_CHAT : IG_API_COMPLETION);
        return;
    }
    static const char *gets[] = {"/health", "/ready", "/load", "/metrics", "/v1/models"};
    int route = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(p, gets[i]) == 0)
            route = i;
    if (route < 0) {
        ig_http_respond_error(req, 404, NULL, NULL, NULL, "no route for %s", p);
        return;
    }
    ig_http_req_set_route(req, gets[route]);
    if (!get) {
        ig_http_add_header(req, "Allow", "GET");
        ig_http_respond_error(req, 405, NULL, NULL, NULL, "use GET");
        return;
    }
    switch (route) {
    case 0: /* live: the process works; loading says so with 503 */
        if (w->state == W_LOADING)
            respond_loading(req);
        else if (w->state == W_FAILED)
            ig_http_respond_error(req, 503, "unavailable_error", NULL, NULL,
                                  "model failed to load: %s", w->load_err);
        else
            ig_http_respond(req, 200, "application/json", "{\"status\":\"ok\"}", 15);
        break;
    case 1: /* ready: loaded and not draining */
        if (w->state == W_READY)
            ig_http_respond(req, 200, "application/json", "{\"status\":\"ready\"}", 18);
        else if (w->state == W_LOADING)
            respond_loading(req);
        else
            ig_http_respond_error(req, 503, "unavailable_error", NULL, NULL, "%s",
                                  w->state == W_DRAINING ? "draining" : "not ready");
        break;
    case 2:
        handle_load(w, req);
        break;
    case 3:
        handle_metrics(w, req);
        break;
    default:
        handle_models(w, req);
    }
}

static void begin_close(worker_t *w);

/* ---- loading -------------------------------------------------------------- */

static int eng_forward(void *ctx, const ig_batch_t *b)
{
    return ig_engine_forward(ctx, b);
}
static int eng_alloc(void *ctx)
{
    return ig_engine_block_alloc(ctx);
}
static void eng_release(void *ctx, int b)
{
    ig_engine_block_release(ctx, b);
}
static int eng_free(void *ctx)
{
    return ig_engine_blocks_free(ctx);
}

/* Thread pool: everything slow (mmap, upload, KV allocation, tokenizer). */
static void load_work(uv_work_t *req)
{
    worker_t *w = req->data;
    char err[400] = "";
    /* Test hook: a slow load, so that tests can watch /health say 503. */
    const char *delay = getenv("IG_WORKER_LOAD_DELAY_MS");
    if (delay && atoi(delay) > 0)
        uv_sleep((unsigned)atoi(delay));
    int rc = ig_model_load(&w->model, w->o.model_dir, err, sizeof(err));
    if (rc < 0) {
        snprintf(w->load_err, sizeof(w->load_err), "model: %s", err[0] ? err : ig_strerror(rc));
        return;
    }
    rc = ig_tokenizer_load(w->o.model_dir, &w->tok, err, sizeof(err));
    if (rc < 0) {
        snprintf(w->load_err, sizeof(w->load_err), "tokenizer: %s", err[0] ? err : ig_strerror(rc));
        return;
    }
    rc = ig_backend_open(&w->be, w->o.device, w->o.threads, err, sizeof(err));
    if (rc < 0) {
        snprintf(w->load_err, sizeof(w->load_err), "device %s: %s", w->o.device,
                 err[0] ? err : ig_strerror(rc));
        return;
    }
    ig_engine_opts_t eo;
    ig_engine_opts_default(&eo);
    if (w->o.kv_blocks > 0)
        eo.kv_blocks = w->o.kv_blocks;
    if (w->o.block_size > 0)
        eo.block_size = w->o.block_size;
    eo.max_batched_tokens = w->o.max_batched_tokens;
    eo.max_num_seqs = w->o.max_num_seqs;
    rc = ig_engine_create(&w->engine, w->model, w->be, &eo, err, sizeof(err));
    if (rc < 0)
        snprintf(w->load_err, sizeof(w->load_err), "engine: %s", err[0] ? err : ig_strerror(rc));
}

static void after_load(uv_work_t *req, int status)
{
    worker_t *w = req->data;
    if (w->state == W_DRAINING && !w->engine)
        return; /* SIGTERM during the load: shutdown goes on */
    if (!w->engine) {
        IG_ERROR("load failed: %s", w->load_err[0] ? w->load_err : "cancelled");
        w->state = W_FAILED;
        w->exit_code = IG_EXIT_FAILURE;
        begin_close(w);
        return;
    }
    const ig_model_config_t *cfg = ig_engine_config(w->engine);
    w->vocab = cfg->vocab_size;
    w->context = cfg->max_position_embeddings;
    for (int i = 0; i < cfg->n_eos; i++)
        w->eos[w->neos++] = cfg->eos_token_ids[i];
    const int32_t *te;
    size_t nte = ig_tokenizer_eos_ids(w->tok, &te);
    for (size_t i = 0; i < nte && w->neos < (int)(sizeof(w->eos) / sizeof(w->eos[0])); i++) {
        int dup = 0;
        for (int k = 0; k < w->neos; k++)
            dup |= w->eos[k] == te[i];
        if (!dup)
            w->eos[w->neos++] = te[i];
    }
    chat_setup(w);
    w->kv_tokens = ig_engine_num_blocks(w->engine) * ig_engine_block_size(w->engine);

    ig_sched_engine_t se = {.ctx = w->engine,
                            .forward = eng_forward,
                            .block_alloc = eng_alloc,
                            .block_release = eng_release,
                            .blocks_free = eng_free,
                            .num_blocks = ig_engine_num_blocks(w->engine),
                            .block_size = ig_engine_block_size(w->engine),
                            .vocab_size = cfg->vocab_size,
                            .max_context = cfg->max_position_embeddings};
    ig_sched_detok_t dt = {w->tok, tok_piece};
    ig_sched_opts_t so;
    ig_sched_opts_default(&so);
    so.max_batched_tokens = w->o.max_batched_tokens;
    so.max_num_seqs = w->o.max_num_seqs;
    so.max_waiting = w->o.max_waiting;
    so.eos = w->eos;
    so.neos = w->neos;
    so.notify = on_sched_notify;
    so.notify_data = &w->async;
    so.observe = metrics_observe;
    so.observe_data = w;
    int rc = ig_sched_create(&w->sched, &se, &dt, &so);
    if (rc == 0)
        rc = ig_sched_start(w->sched);
    if (rc < 0) {
        IG_ERROR("scheduler: %s", ig_strerror(rc));
        w->state = W_FAILED;
        w->exit_code = IG_EXIT_FAILURE;
        begin_close(w);
        return;
    }
    if (w->state == W_LOADING)
        w->state = W_READY;
    IG_INFO("model %s ready on %s: vocab %d, context %d, %d KV blocks of %d tokens", w->model_name,
            w->o.device, w->vocab, w->context, se.num_blocks, se.block_size);
}

/* ---- shutdown ------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {}

static void on_server_closed(ig_http_server_t *server, void *data)
{
    worker_t *w = data;
    w->server = NULL;
    if (w->sched) {
        ig_sched_stop(w->sched);
        ig_sched_drain(w->sched, NULL, NULL); /* the requests are gone */
    }
    uv_close((uv_handle_t *)&w->async, on_handle_closed);
    uv_close((uv_handle_t *)&w->tick, on_handle_closed);
    uv_close((uv_handle_t *)&w->sigterm, on_handle_closed);
    uv_close((uv_handle_t *)&w->sigint, on_handle_closed);
}

static void begin_close(worker_t *w)
{
    if (w->closing)
        return;
    w->closing = 1;
    IG_INFO("drained; closing");
    ig_http_server_close(w->server, 1000, on_server_closed, w);
}

static void on_signal(uv_signal_t *h, int signum)
{
    worker_t *w = h->data;
    if (w->state == W_DRAINING || w->closing) {
        if (signum == SIGINT)
            IG_WARN("second signal: closing now");
        else
            return;
        for (wreq_t *r = w->reqs; r; r = r->next)
            cancel_all(r);
        return;
    }
    if (w->state != W_FAILED)
        IG_INFO("signal %d: draining (%d requests in flight)", signum, w->nreqs);
    w->state = w->state == W_FAILED ? W_FAILED : W_DRAINING;
    w->drain_started = now_ns();
    if (w->nreqs == 0 && (w->sched || w->state == W_FAILED))
        begin_close(w);
}

/* Once a second: streams whose client stopped reading, drain progress. */
static void on_tick(uv_timer_t *t)
{
    worker_t *w = t->data;
    uint64_t now = now_ns();
    for (wreq_t *r = w->reqs; r; r = r->next) {
        if (!r->api.stream || r->cancelled)
            continue;
        int stalled = r->paused && (double)(now - r->paused_since) / 1e9 > w->o.stall_timeout_s;
        if (stalled || r->pending_len > w->o.stream_buffer) {
            IG_WARN("%s: client does not read (%zu bytes held); cancelling", r->id, r->pending_len);
            cancel_all(r);
        }
    }
    metrics_sync(w);
    if (w->state == W_DRAINING || w->state == W_FAILED) {
        if (w->nreqs && (double)(now - w->drain_started) / 1e9 > w->o.drain_timeout_s) {
            IG_WARN("drain timeout: cancelling %d requests", w->nreqs);
            for (wreq_t *r = w->reqs; r; r = r->next)
                cancel_all(r);
        }
        /* Loading still in the pool: its after_work decides. */
        if (w->nreqs == 0 && (w->sched || w->state == W_FAILED))
            begin_close(w);
    }
}

/* ---- command ------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: infergate worker --model DIR --device cpu|cpu:N|cuda:N|MIG-<uuid>\n"
            "                        --listen unix:PATH|HOST:PORT [options]\n\n"
            "Serves one model: POST /v1/completions, POST /v1/chat/completions,\n"
            "GET /v1/models, /health, /ready, /load, /metrics.\n\n"
            "options:\n"
            "  --threads N              CPU threads (0 = all cores)\n"
            "  --kv-blocks N            KV cache blocks (0 = size from memory)\n"
            "  --block-size N           tokens per KV block (default 16)\n"
            "  --max-batched-tokens N   token rows of one forward pass (2048)\n"
            "  --max-num-seqs N         sequences of one forward pass (256)\n"
            "  --max-waiting N          waiting queue bound; beyond it 429 (1024)\n"
            "  --request-timeout S      deadline of one request in seconds (600; 0 = none)\n"
            "  --stream-stall-timeout S cancel a stream whose client reads nothing this long (30)\n"
            "  --max-prompt-tokens N    longest prompt accepted; longer ones get 400\n"
            "                           (0 = the model's context length)\n"
            "  --name NAME              the model id clients use (directory name)\n"
            "  --log-level debug|info|warn|error\n"
            "  --log-format text|json\n"
            "  --help\n");
}

static int parse_int(const char *s, const char *flag, int lo, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < lo || v > INT_MAX) {
        fprintf(stderr, "infergate worker: %s: '%s' is not an integer >= %d\n", flag, s, lo);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int ig_cmd_worker(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"device", required_argument, NULL, 'd'},
        {"listen", required_argument, NULL, 'l'},
        {"threads", required_argument, NULL, 't'},
        {"kv-blocks", required_argument, NULL, 'k'},
        {"block-size", required_argument, NULL, 'B'},
        {"max-batched-tokens", required_argument, NULL, 'b'},
        {"max-num-seqs", required_argument, NULL, 's'},
        {"max-waiting", required_argument, NULL, 'w'},
        {"request-timeout", required_argument, NULL, 'r'},
        {"name", required_argument, NULL, 'n'},
        {"stream-stall-timeout", required_argument, NULL, 'S'},
        {"max-prompt-tokens", required_argument, NULL, 'P'},
        {"log-level", required_argument, NULL, 'L'},
        {"log-format", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    worker_t *w = calloc(1, sizeof(*w));
    if (!w)
        return IG_EXIT_FAILURE;
    w->o.device = "cpu";
    w->o.max_batched_tokens = 2048;
    w->o.max_num_seqs = 256;
    w->o.max_waiting = 1024;
    w->o.request_timeout_s = 600;
    w->o.stall_timeout_s = 30;
    w->o.stream_buffer = 1 << 20;
    w->o.drain_timeout_s = 60;
    ig_log_level_t level = IG_LOG_INFO;
    ig_log_format_t format = IG_LOG_TEXT;
    int rc = IG_EXIT_USAGE, c;
    optind = 1;
    opterr = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm':
            w->o.model_dir = optarg;
            break;
        case 'd':
            w->o.device = optarg;
            break;
        case 'l':
            w->o.listen = optarg;
            break;
        case 't':
            if (parse_int(optarg, "--threads", 0, &w->o.threads) < 0)
                goto out;
            break;
        case 'B':
            if (parse_int(optarg, "--block-size", 1, &w->o.block_size) < 0)
                goto out;
            break;
        case 'k':
            if (parse_int(optarg, "--kv-blocks", 0, &w->o.kv_blocks) < 0)
                goto out;
            break;
        case 'b':
            if (parse_int(optarg, "--max-batched-tokens", 1, &w->o.max_batched_tokens) < 0)
                goto out;
            break;
        case 's':
            if (parse_int(optarg, "--max-num-seqs", 1, &w->o.max_num_seqs) < 0)
                goto out;
            break;
        case 'w':
            if (parse_int(optarg, "--max-waiting", 0, &w->o.max_waiting) < 0)
                goto out;
            break;
        case 'r': {
            char *end;
            w->o.request_timeout_s = strtod(optarg, &end);
            if (*end || w->o.request_timeout_s < 0) {
                fprintf(stderr, "infergate worker: --request-timeout: '%s' is not seconds\n",
                        optarg);
                goto out;
            }
            break;
        }
        case 'n':
            w->o.name = optarg;
            break;
        case 'P':
            if (parse_int(optarg, "--max-prompt-tokens", 0, &w->o.max_prompt_tokens) < 0)
                goto out;
            break;
        case 'S': {
            char *end;
            w->o.stall_timeout_s = strtod(optarg, &end);
            if (*end || w->o.stall_timeout_s <= 0) {
                fprintf(stderr, "infergate worker: --stream-stall-timeout: '%s' is not seconds\n",
                        optarg);
                goto out;
            }
            break;
        }
        case 'L':
            if (ig_log_level_parse(optarg, &level) < 0) {
                fprintf(stderr,
                        "infergate worker: --log-level: '%s' is not one of debug, info, "
                        "warn, error\n",
                        optarg);
                goto out;
            }
            break;
        case 'F':
            if (ig_log_format_parse(optarg, &format) < 0) {
                fprintf(stderr, "infergate worker: --log-format: '%s' is not text or json\n",
                        optarg);
                goto out;
            }
            break;
        case 'h':
            usage(stdout);
            rc = IG_EXIT_OK;
            goto out;
        default:
            usage(stderr);
            goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "infergate worker: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (!w->o.model_dir || !w->o.listen) {
        fprintf(stderr, "infergate worker: --model and --listen are required\n\n");
        usage(stderr);
        goto out;
    }
    ig_log_setup(level, format);
    ig_log_set_component("worker");
    /* A client that went away must cost an EPIPE, not the process. */
    signal(SIGPIPE, SIG_IGN);
    if (w->o.name) {
        snprintf(w->model_name, sizeof(w->model_name), "%s", w->o.name);
    } else {
        /* The directory's last component, as vLLM names a local model. */
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof(tmp), "%s", w->o.model_dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/')
            tmp[--n] = 0;
        const char *base = strrchr(tmp, '/');
        snprintf(w->model_name, sizeof(w->model_name), "%.*s", (int)sizeof(w->model_name) - 1,
                 base ? base + 1 : tmp);
    }
    w->created = (long long)time(NULL);

    uv_loop_t loop;
    uv_loop_init(&loop);
    w->loop = &loop;
    ig_http_limits_t limits;
    ig_http_limits_default(&limits);
    int err = ig_http_server_start(&w->server, &loop, w->o.listen, &limits, on_request, w);
    if (err < 0) {
        fprintf(stderr, "infergate worker: cannot listen on %s: %s\n", w->o.listen,
                ig_strerror(err));
        uv_loop_close(&loop);
        rc = err == IG_EINVAL ? IG_EXIT_USAGE : IG_EXIT_FAILURE;
        goto out;
    }
    if (ig_http_server_port(w->server))
        IG_INFO("listening on %s (port %d)", w->o.listen, ig_http_server_port(w->server));
    else
        IG_INFO("listening on %s", w->o.listen);
    metrics_register(w);
    uv_async_init(&loop, &w->async, on_async);
    w->async.data = w;
    uv_timer_init(&loop, &w->tick);
    w->tick.data = w;
    uv_timer_start(&w->tick, on_tick, 1000, 1000);
    uv_signal_init(&loop, &w->sigterm);
    w->sigterm.data = w;
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_init(&loop, &w->sigint);
    w->sigint.data = w;
    uv_signal_start(&w->sigint, on_signal, SIGINT);

    w->state = W_LOADING;
    w->load_work.data = w;
    IG_INFO("loading %s on %s", w->o.model_dir, w->o.device);
    uv_queue_work(&loop, &w->load_work, load_work, after_load);

    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    rc = w->exit_code;
    IG_INFO("exit %d", rc);
    ig_sched_free(w->sched);
    ig_engine_free(w->engine);
    if (w->be)
        w->be->destroy(w->be);
    ig_tokenizer_free(w->tok);
    ig_model_free(w->model);
out:
    free(w);
    return rc;
}
