/*
 * infergate worker, the process: the CLI, the route table and the endpoints
 * other than generation (/health, /ready, /load, /metrics, /v1/models), the
 * model load on the libuv thread pool (the socket listens at once and
 * /health says 503 "Loading model" meanwhile), and the drain and shutdown.
 * Generation requests are generate.c's, the metric families metrics.c's.
 *
 * The scheduler runs the engine on its own thread; its events come back to
 * the loop through one uv_async_t, and the engine thread touches nothing
 * else of the loop's.
 */
#include "worker_internal.h"

#include "infergate/clock.h"
#include "infergate/cli.h"
#include "infergate/error.h"
#include "infergate/http_route.h"
#include "infergate/load.h"
#include "infergate/prefix.h"
#include "infergate/log.h"

#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- other endpoints ---------------------------------------------------- */

static void handle_load(ig_http_req_t *req, void *data)
{
    ig_load_t l;
    ig__worker_load_of(data, &l);
    json_t *o = ig_load_encode(&l);
    ig_api_respond_json(req, 200, o);
}

#define PREFIX_MAX_BLOCKS 65536 /* hashes of one query (a 1M-token prompt) */

/*
 * The cache query a router asks before it sends a prompt (docs/routing.md,
 * "Prefix-aware routing"): POST /prefix {"hashes": ["<16 hex>", ...]} (the
 * prompt's block hashes, ig_prefix_hashes with ig_prefix_seed(model) and
 * this worker's block_size) or {"tokens": [ids]}; the answer is the /load
 * report plus "block_size", "prefix_cache" (on/off), "matched_blocks" and
 * "matched_tokens" (the leading blocks it holds now) and
 * "prefix_cached_blocks": its cache and its wait in one answer.
 */
static void handle_prefix(ig_http_req_t *req, void *data)
{
    worker_t *w = data;
    ig_api_error_t e;
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *hashes = json_object_get(doc, "hashes"), *tokens = json_object_get(doc, "tokens");
    if (!json_is_object(doc) || (hashes && !json_is_array(hashes)) ||
        (tokens && !json_is_array(tokens)) || (!hashes && !tokens)) {
        json_decref(doc);
        ig_api_error(&e, 400, "hashes", "expected {\"hashes\": [\"<16 hex digits>\", ...]}");
        ig_api_respond_error(req, &e);
        return;
    }
    json_t *arr = hashes ? hashes : tokens;
    size_t n = json_array_size(arr);
    if (n > PREFIX_MAX_BLOCKS * (size_t)(tokens && !hashes ? 16 : 1)) {
        json_decref(doc);
        ig_api_error(&e, 400, hashes ? "hashes" : "tokens", "at most %d blocks, please",
                     PREFIX_MAX_BLOCKS);
        ig_api_respond_error(req, &e);
        return;
    }
    uint64_t *h = malloc(sizeof(uint64_t) * (n ? n : 1));
    int *ids = malloc(sizeof(int) * (n ? n : 1));
    if (!h || !ids) {
        free(h);
        free(ids);
        json_decref(doc);
        ig_api_respond_oom(req);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        int bad =
            hashes ? !json_is_string(v) || ig_prefix_hash_parse(json_string_value(v),
                                                                json_string_length(v), &h[i]) != 0
                   : !json_is_integer(v);
        if (bad) {
            free(h);
            free(ids);
            json_decref(doc);
            ig_api_error(&e, 400, hashes ? "hashes" : "tokens",
                         hashes ? "hashes[%zu] is not 16 hex digits" : "tokens[%zu] is not an id",
                         i);
            ig_api_respond_error(req, &e);
            return;
        }
        if (!hashes)
            ids[i] = (int)json_integer_value(v);
    }
    json_decref(doc);
    int matched = 0, bs = w->engine ? ig_engine_block_size(w->engine) : 0;
    if (w->sched)
        matched = hashes ? ig_sched_prefix_match_hashes(w->sched, h, (int)n)
                         : ig_sched_prefix_match(w->sched, ids, (int)n);
    free(h);
    free(ids);
    ig_load_t l;
    ig__worker_load_of(w, &l);
    json_t *o = ig_load_encode(&l);
    ig_sched_stats_t st = ig__worker_stats(w);
    if (o) {
        json_object_set_new(o, "block_size", json_integer(bs));
        json_object_set_new(o, "prefix_cache", json_boolean(w->o.prefix_cache));
        json_object_set_new(o, "matched_blocks", json_integer(matched));
        json_object_set_new(o, "matched_tokens", json_integer((json_int_t)matched * bs));
        json_object_set_new(o, "prefix_cached_blocks", json_integer(st.prefix_cached_blocks));
    }
    ig_api_respond_json(req, 200, o);
}

static void handle_metrics(ig_http_req_t *req, void *data)
{
    ig__worker_metrics_sync(data);
    size_t len = 0;
    char *s = ig_metrics_render(&len);
    if (!s) {
        ig_api_respond_oom(req);
        return;
    }
    ig_http_respond(req, 200, "text/plain; version=0.0.4", s, len);
    free(s);
}

/* The one model, with what a client cannot see elsewhere: the context, the
 * prompt limit and the chat template in use (and why it was chosen). */
static void handle_models(ig_http_req_t *req, void *data)
{
    worker_t *w = data;
    const char *ids[1] = {w->model_name};
    json_t *doc = ig_api_models_json(ids, 1, w->created, "infergate");
    json_t *m = json_array_get(json_object_get(doc, "data"), 0);
    if (m != NULL && w->tok != NULL && w->chat_source != NULL) {
        json_object_set_new(m, "max_model_len", json_integer(w->context));
        json_object_set_new(
            m, "max_prompt_tokens",
            json_integer(w->o.max_prompt_tokens > 0 ? w->o.max_prompt_tokens : w->context));
        json_object_set_new(m, "chat_template", json_string(ig_chat_style_name(w->chat_style)));
        json_object_set_new(m, "chat_tools", json_string(ig_chat_tools_name(w->chat_tools)));
        json_object_set_new(m, "chat_template_source", json_string(w->chat_source));
        json_object_set_new(m, "chat_template_reason", json_string(w->chat_why));
    }
    ig_api_respond_json(req, 200, doc);
}

/* Live: the process works; loading says so with 503. */
static void handle_health(ig_http_req_t *req, void *data)
{
    worker_t *w = data;
    if (w->state == W_LOADING)
        ig__worker_respond_loading(req);
    else if (w->state == W_FAILED)
        ig_http_respond_error(req, 503, "unavailable_error", NULL, NULL, "model failed to load: %s",
                              w->load_err);
    else
        ig_http_respond(req, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

/* Ready: loaded and not draining. */
static void handle_ready(ig_http_req_t *req, void *data)
{
    worker_t *w = data;
    if (w->state == W_READY)
        ig_http_respond(req, 200, "application/json", "{\"status\":\"ready\"}", 18);
    else if (w->state == W_LOADING)
        ig__worker_respond_loading(req);
    else
        ig_http_respond_error(req, 503, "unavailable_error", NULL, NULL, "%s",
                              w->state == W_DRAINING ? "draining" : "not ready");
}

static void handle_completions(ig_http_req_t *req, void *data)
{
    ig__worker_generate(data, req, IG_API_COMPLETION);
}

static void handle_chat(ig_http_req_t *req, void *data)
{
    ig__worker_generate(data, req, IG_API_CHAT);
}

static void handle_tokenize(ig_http_req_t *req, void *data)
{
    ig__worker_tokenize(data, req);
}

static void handle_tokenizer_json(ig_http_req_t *req, void *data)
{
    ig__worker_tokenizer_file(data, req, "tokenizer.json");
}

static void handle_tokenizer_config(ig_http_req_t *req, void *data)
{
    ig__worker_tokenizer_file(data, req, "tokenizer_config.json");
}

static void handle_generation_config(ig_http_req_t *req, void *data)
{
    ig__worker_tokenizer_file(data, req, "generation_config.json");
}

static void handle_detokenize(ig_http_req_t *req, void *data)
{
    ig__worker_detokenize(data, req);
}

/* An endpoint of the OpenAI API this worker does not implement: 404 naming
 * it, which tells a gateway to route it elsewhere (ig_router_upstream_t's
 * lacks) rather than the generic "no route". */
static void handle_not_served(ig_http_req_t *req, void *data)
{
    (void)data;
    ig_http_respond_error(req, 404, "not_found_error", NULL, "endpoint_not_served",
                          "this worker does not serve %s %s", ig_http_req_method(req),
                          ig_http_req_path(req));
}

static void handle_kv_events(ig_http_req_t *req, void *data)
{
    ig__worker_kv_subscribe(data, req);
}

/* The worker's routes (include/infergate/http_route.h); no API keys here:
 * a worker listens where only its gateway reaches it. */
static const ig_http_route_t routes[] = {
    {"POST", "/v1/completions", handle_completions, 0},
    {"POST", "/v1/chat/completions", handle_chat, 0},
    {"POST", "/v1/tokenize", handle_tokenize, 0},
    {"POST", "/v1/detokenize", handle_detokenize, 0},
    {"GET", "/v1/tokenizer/tokenizer.json", handle_tokenizer_json, 0},
    {"GET", "/v1/tokenizer/tokenizer_config.json", handle_tokenizer_config, 0},
    {"GET", "/v1/tokenizer/generation_config.json", handle_generation_config, 0},
    {"POST", "/v1/embeddings", handle_not_served, 0},
    {"POST", "/v1/responses", handle_not_served, 0},
    {"GET", "/v1/models", handle_models, 0},
    {"GET", "/health", handle_health, 0},
    {"GET", "/ready", handle_ready, 0},
    {"GET", "/load", handle_load, 0},
    {"POST", "/prefix", handle_prefix, 0},
    {"GET", "/metrics", handle_metrics, 0},
    {"GET", "/kv/events", handle_kv_events, 0},
};

static void on_request(ig_http_req_t *req, void *data)
{
    ig_http_route_dispatch(routes, sizeof(routes) / sizeof(routes[0]), req, data);
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
    if (w->o.quantize != NULL &&
        (rc = ig_model_quantize(w->model,
                                strcmp(w->o.quantize, "q4_0") == 0 ? IG_DTYPE_Q4_0 : IG_DTYPE_Q8_0,
                                err, sizeof(err))) < 0) {
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
    eo.kv_dtype = w->o.kv_dtype;
    rc = ig_engine_create(&w->engine, w->model, w->be, &eo, err, sizeof(err));
    if (rc < 0)
        snprintf(w->load_err, sizeof(w->load_err), "engine: %s", err[0] ? err : ig_strerror(rc));
    else
        ig_model_drop_owned(w->model); /* the backend holds its own copy */
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
    ig__worker_chat_setup(w);
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
    ig_sched_detok_t dt = {w->tok, ig__worker_tok_piece};
    ig_sched_opts_t so;
    ig_sched_opts_default(&so);
    so.max_batched_tokens = w->o.max_batched_tokens;
    so.itl_target_ms = w->o.itl_target_ms;
    so.max_num_seqs = w->o.max_num_seqs;
    so.max_waiting = w->o.max_waiting;
    so.eos = w->eos;
    so.neos = w->neos;
    so.notify = ig__worker_on_sched_notify;
    so.notify_data = &w->async;
    so.observe = ig__worker_metrics_observe;
    so.observe_data = w;
    so.prefix_cache = w->o.prefix_cache;
    so.prefix_seed = ig_prefix_seed(w->model_name);
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
    ig__worker_metrics_kv(w);
    IG_INFO("model %s ready on %s: vocab %d, context %d, %d KV blocks of %d tokens (%s, %zu bytes)",
            w->model_name, w->o.device, w->vocab, w->context, se.num_blocks, se.block_size,
            ig_engine_kv_dtype_name(ig_engine_kv_dtype(w->engine)), ig_engine_kv_bytes(w->engine));
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
    ig__worker_kv_close_all(w);
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
            ig__worker_cancel(r);
        return;
    }
    if (w->state != W_FAILED)
        IG_INFO("signal %d: draining (%d requests in flight)", signum, w->nreqs);
    w->state = w->state == W_FAILED ? W_FAILED : W_DRAINING;
    w->drain_started = ig_clock_ns();
    if (w->nreqs == 0 && (w->sched || w->state == W_FAILED))
        begin_close(w);
}

/* Once a second: streams whose client stopped reading, drain progress. */
static void on_tick(uv_timer_t *t)
{
    worker_t *w = t->data;
    uint64_t now = ig_clock_ns();
    for (wreq_t *r = w->reqs; r; r = r->next) {
        if (!r->api.stream || r->cancelled)
            continue;
        int stalled = r->paused && (double)(now - r->paused_since) / 1e9 > w->o.stall_timeout_s;
        if (stalled || r->pending_len > w->o.stream_buffer) {
            IG_WARN("%s: client does not read (%zu bytes held); cancelling", r->id, r->pending_len);
            ig__worker_cancel(r);
        }
    }
    ig__worker_metrics_sync(w);
    ig__worker_kv_tick(w);
    if (w->state == W_DRAINING || w->state == W_FAILED) {
        if (w->nreqs && (double)(now - w->drain_started) / 1e9 > w->o.drain_timeout_s) {
            IG_WARN("drain timeout: cancelling %d requests", w->nreqs);
            for (wreq_t *r = w->reqs; r; r = r->next)
                ig__worker_cancel(r);
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
            "  --max-batched-tokens N   token rows of one forward pass, at most (2048)\n"
            "  --itl-target-ms MS       while sequences decode, a step's prompt tokens stop\n"
            "                           where its predicted time reaches MS (40; 0 = off)\n"
            "  --max-num-seqs N         sequences of one forward pass (256)\n"
            "  --max-waiting N          waiting queue bound; beyond it 429 (1024)\n"
            "  --request-timeout S      deadline of one request in seconds (600; 0 = none)\n"
            "  --stream-stall-timeout S cancel a stream whose client reads nothing this long (30)\n"
            "  --max-prompt-tokens N    longest prompt accepted; longer ones get 400\n"
            "                           (0 = the model's context length)\n"
            "  --name NAME              the model id clients use (directory name)\n"
            "  --prefix-cache on|off    automatic prefix caching of KV blocks (on)\n"
            "  --quantize q8_0|q4_0     quantize the weights at load (BF16/F16/F32 models)\n"
            "  --kv-dtype f32|f16|bf16  element type of the KV cache (f32; 16 bits hold\n"
            "                           twice the tokens; CPU devices only)\n"
            "  --kv-events-buffer BYTES unsent GET /kv/events bytes before a subscriber\n"
            "                           that does not read is dropped (1048576)\n"
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
        {"itl-target-ms", required_argument, NULL, 'I'},
        {"max-num-seqs", required_argument, NULL, 's'},
        {"max-waiting", required_argument, NULL, 'w'},
        {"request-timeout", required_argument, NULL, 'r'},
        {"name", required_argument, NULL, 'n'},
        {"stream-stall-timeout", required_argument, NULL, 'S'},
        {"max-prompt-tokens", required_argument, NULL, 'P'},
        {"prefix-cache", required_argument, NULL, 'C'},
        {"log-level", required_argument, NULL, 'L'},
        {"log-format", required_argument, NULL, 'F'},
        {"quantize", required_argument, NULL, 'Q'},
        {"kv-dtype", required_argument, NULL, 'K'},
        {"kv-events-buffer", required_argument, NULL, 'E'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    worker_t *w = calloc(1, sizeof(*w));
    if (!w)
        return IG_EXIT_FAILURE;
    /* The scheduler's defaults, which hold the engine's. */
    ig_sched_opts_t sched;
    ig_sched_opts_default(&sched);
    w->o.device = "cpu";
    w->o.max_batched_tokens = sched.max_batched_tokens;
    w->o.itl_target_ms = sched.itl_target_ms;
    w->o.max_num_seqs = sched.max_num_seqs;
    w->o.max_waiting = sched.max_waiting;
    w->o.request_timeout_s = 600;
    w->o.stall_timeout_s = 30;
    w->o.stream_buffer = 1 << 20;
    w->o.kv_events_buffer = 1 << 20;
    w->o.drain_timeout_s = 60;
    w->o.prefix_cache = sched.prefix_cache;
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
        case 'Q':
            if (strcmp(optarg, "q8_0") != 0 && strcmp(optarg, "q4_0") != 0) {
                fprintf(stderr, "infergate worker: --quantize: '%s' is not q8_0 or q4_0\n", optarg);
                goto out;
            }
            w->o.quantize = optarg;
            break;
        case 'K':
            if (ig_engine_kv_dtype_parse(optarg, &w->o.kv_dtype) < 0) {
                fprintf(stderr, "infergate worker: --kv-dtype: '%s' is not f32, f16 or bf16\n",
                        optarg);
                goto out;
            }
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
        case 'I': {
            char *end;
            w->o.itl_target_ms = strtod(optarg, &end);
            if (*optarg == 0 || *end || !(w->o.itl_target_ms >= 0) || w->o.itl_target_ms > 1e6) {
                fprintf(stderr, "infergate worker: --itl-target-ms: '%s' is not milliseconds\n",
                        optarg);
                goto out;
            }
            break;
        }
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
        case 'C':
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0) {
                fprintf(stderr, "infergate worker: --prefix-cache: '%s' is not on or off\n",
                        optarg);
                goto out;
            }
            w->o.prefix_cache = strcmp(optarg, "on") == 0;
            break;
        case 'E': {
            int v;
            if (parse_int(optarg, "--kv-events-buffer", 1024, &v) < 0)
                goto out;
            w->o.kv_events_buffer = (size_t)v;
            break;
        }
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
    ig__worker_metrics_register(w);
    ig_api_make_id(w->kv_epoch, sizeof(w->kv_epoch), "kv-");
    uv_async_init(&loop, &w->async, ig__worker_on_async);
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
